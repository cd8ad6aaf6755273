"""``dtypecheck.integrations.hf.NanTraceCallback`` inside the real ``transformers.Trainer``: a tiny GPT-2 built
from a config (nothing downloaded), on CPU, clean and with an overflow planted at a late step."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from dtypecheck.integrations._session import UnsupportedFrameworkError
from dtypecheck.integrations.hf import NanTraceCallback
from tests.integrations._planted import PlantedOverflow
from tests.nantrace._scripts import line_of

PLANTED = Path(__file__).with_name("_planted.py")
STEPS = 8


def _model(at_call: int | None) -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=16, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)
    if at_call is not None:
        mlp: Any = model.transformer.h[1].mlp
        mlp.act = PlantedOverflow(mlp.act, at_call)
    return model


def _train(
    tmp_path: Path, at_call: int | None, report: str = "nantrace.json", **callback: Any
) -> tuple[NanTraceCallback, Any]:
    generator = torch.Generator().manual_seed(0)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (32, 12), generator=generator)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    watch = NanTraceCallback(tmp_path / report, **callback)
    trainer = transformers.Trainer(model=_model(at_call), args=args, train_dataset=data, callbacks=[watch])
    trainer.train()
    return watch, trainer


def test_clean_training_writes_a_clean_report(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="dtypecheck"):
        watch, trainer = _train(tmp_path, None)
    assert trainer.state.global_step == STEPS
    doc = json.loads((tmp_path / "nantrace.json").read_text(encoding="utf-8"))
    assert doc["schema"] == "dtypecheck.nantrace/1"
    assert (doc["status"], doc["first"], doc["steps"], doc["ops"]) == ("clean", None, STEPS, 0)
    assert doc["watch"]["steps_checked"] == STEPS
    assert watch.report is not None
    assert [r.getMessage() for r in caplog.records if r.name == "dtypecheck"] == [
        f"dtypecheck nan-trace: clean over {STEPS} step(s) (report: {tmp_path / 'nantrace.json'})"
    ]


def test_planted_overflow_at_step_6_is_named_and_training_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The report goes to a folder that does not exist yet: the callback creates it when it is built, rather than
    # the Trainer dying of FileNotFoundError at the failing step with the finding lost.
    report = tmp_path / "new" / "folder" / "nantrace.json"
    with caplog.at_level(logging.INFO, logger="dtypecheck"):
        _, trainer = _train(tmp_path, at_call=6, report="new/folder/nantrace.json")
    assert trainer.state.global_step == 6  # stopped at the end of the step that failed
    doc = json.loads(report.read_text(encoding="utf-8"))
    first = doc["first"]
    # y * 1e30 is finite in float32 (max 3.4e38); times 1e30 again it is not: born in the second multiplication.
    assert (first["kind"], first["op"], first["phase"]) == ("inf", "aten.mul.Tensor", "forward")
    assert first["module"] == "transformer.h.1.mlp.act"
    assert first["step"] == 6
    assert first["cause"] == "range_overflow"
    assert first["location"]["file"] == str(PLANTED)
    assert first["location"]["line"] == line_of(PLANTED.read_text(encoding="utf-8"), "planted overflow")
    assert (doc["watch"]["replayed_step"], doc["watch"]["exact"]) == (6, True)
    warnings = [r.getMessage() for r in caplog.records if r.name == "dtypecheck"]
    assert warnings == [
        "dtypecheck nan-trace: step 6: inf born in aten.mul.Tensor (forward) in module transformer.h.1.mlp.act "
        f"at {PLANTED}:{first['location']['line']} (report: {report})"
    ]


def test_stop_false_lets_training_go_on(tmp_path: Path) -> None:
    watch, trainer = _train(tmp_path, at_call=3, stop=False)
    assert trainer.state.global_step == STEPS
    assert watch.report is not None
    assert watch.report.first is not None
    assert watch.report.first.step == 3
    assert watch.report.steps == STEPS


def test_unsupported_transformers_version_fails_at_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transformers, "__version__", "4.30.2")
    with pytest.raises(UnsupportedFrameworkError) as raised:
        NanTraceCallback()
    assert str(raised.value) == (
        "dtypecheck's transformers callback supports transformers >=4.40,<6; this is transformers 4.30.2"
    )
