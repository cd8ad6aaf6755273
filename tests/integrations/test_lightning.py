"""``dtypecheck.integrations.lightning.NanTraceCallback`` inside a real ``lightning.Trainer.fit()`` on CPU (no
logger, no checkpointing), clean and with an overflow planted at a late step."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import lightning
import pytest
import torch
from lightning.pytorch import LightningModule

from dtypecheck.integrations._session import ReportPathError, UnsupportedFrameworkError
from dtypecheck.integrations.lightning import NanTraceCallback
from tests.integrations._planted import PlantedOverflow
from tests.nantrace._scripts import line_of

PLANTED = Path(__file__).with_name("_planted.py")
STEPS = 8


class Regressor(LightningModule):
    def __init__(self, at_call: int | None) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(4, 8)
        act: torch.nn.Module = torch.nn.Tanh()
        self.act = PlantedOverflow(act, at_call) if at_call is not None else act
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.act(self.encoder(x)))
        return out

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _fit(
    tmp_path: Path,
    at_call: int | None,
    watch: NanTraceCallback | None = None,
    module: LightningModule | None = None,
    **callback: Any,
) -> tuple[NanTraceCallback, Any]:
    """``module`` (default: a ``Regressor`` planting its NaN at ``at_call``) fitted for ``STEPS`` steps on the same
    seeded data, watched by ``watch`` (default: a callback writing ``tmp_path/nantrace.json``)."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    watch = watch if watch is not None else NanTraceCallback(tmp_path / "nantrace.json", **callback)
    trainer = lightning.Trainer(
        accelerator="cpu",
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[watch],
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module if module is not None else Regressor(at_call), loader)
    return watch, trainer


def test_clean_fit_writes_a_clean_report(tmp_path: Path) -> None:
    watch, trainer = _fit(tmp_path, None)
    assert trainer.global_step == STEPS
    doc = json.loads((tmp_path / "nantrace.json").read_text(encoding="utf-8"))
    assert (doc["status"], doc["first"], doc["steps"]) == ("clean", None, STEPS)
    assert watch.report is not None
    assert watch.report.watch is not None
    assert watch.report.watch.steps_checked == STEPS


def test_planted_overflow_at_step_5_is_named_and_the_fit_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="dtypecheck"):
        _, trainer = _fit(tmp_path, at_call=5)
    assert trainer.global_step == 5
    doc = json.loads((tmp_path / "nantrace.json").read_text(encoding="utf-8"))
    first = doc["first"]
    assert (first["kind"], first["op"], first["phase"], first["module"]) == ("inf", "aten.mul.Tensor", "forward", "act")
    assert (first["step"], first["cause"]) == (5, "range_overflow")
    assert first["location"]["file"] == str(PLANTED)
    assert first["location"]["line"] == line_of(PLANTED.read_text(encoding="utf-8"), "planted overflow")
    # Lightning runs forward and backward inside optimizer.step(closure): the step is found after the update,
    # and its replay re-runs the closure from the optimizer snapshot.
    summary = doc["watch"]
    assert (summary["detected"], summary["replayed_step"], summary["exact"]) == ("loss", 5, True)
    messages = [r.getMessage() for r in caplog.records if r.name == "dtypecheck"]
    assert len(messages) == 1
    assert messages[0].startswith("dtypecheck nan-trace: step 5: inf born in aten.mul.Tensor (forward) in module act")


def test_stop_false_lets_the_fit_go_on(tmp_path: Path) -> None:
    watch, trainer = _fit(tmp_path, at_call=3, stop=False)
    assert trainer.global_step == STEPS
    assert watch.report is not None
    assert watch.report.first is not None
    assert watch.report.first.step == 3


def test_unsupported_lightning_version_fails_at_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lightning, "__version__", "1.9.5")
    with pytest.raises(UnsupportedFrameworkError, match=r"supports lightning >=2\.0,<3; this is lightning 1\.9\.5"):
        NanTraceCallback()


def test_the_report_folder_is_created_when_the_callback_is_built(tmp_path: Path) -> None:
    report = tmp_path / "new" / "folder" / "nantrace.json"
    watch = NanTraceCallback(report)
    assert report.parent.is_dir()  # before any training: a missing folder cannot end the fit at on_train_end
    _, trainer = _fit(tmp_path, at_call=5, watch=watch)
    assert trainer.global_step == 5
    assert json.loads(report.read_text(encoding="utf-8"))["first"]["step"] == 5


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda tmp: (tmp / "a-file").write_bytes(b"") or tmp / "a-file" / "nantrace.json", "cannot create"),
        (lambda tmp: (tmp / "out").mkdir() or tmp / "out", "it is a folder"),
    ],
    ids=["under-a-file", "a-folder"],
)
def test_a_report_path_that_cannot_be_written_is_refused_when_the_callback_is_built(
    tmp_path: Path, make: Any, reason: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(ReportPathError) as raised:
        NanTraceCallback(path)
    assert str(raised.value).startswith(f"NanTraceCallback cannot write its report to {path}: {reason}")


def test_a_report_that_cannot_be_written_mid_run_is_logged_and_the_fit_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    report = tmp_path / "gone" / "nantrace.json"
    watch = NanTraceCallback(report)
    report.parent.rmdir()  # removed after set-up, while training runs
    with caplog.at_level(logging.INFO, logger="dtypecheck"):
        _, trainer = _fit(tmp_path, at_call=5, watch=watch)
    assert trainer.global_step == 5  # the finding still stops the fit, as it would with the report written
    assert watch.report is not None
    assert watch.report.first is not None
    assert watch.report.first.step == 5
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "dtypecheck"]
    assert [level for level, _ in messages] == ["ERROR", "WARNING"]
    assert messages[0][1].startswith(f"dtypecheck nan-trace: could not write the report to {report}: ")
    assert messages[1][1].startswith("dtypecheck nan-trace: step 5: inf born in aten.mul.Tensor")
    assert "(report:" not in messages[1][1]


class CallsItsNet(LightningModule):
    """``training_step`` calls ``self.net`` itself: the LightningModule is never called, ``net`` is outermost."""

    def __init__(self, at_call: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), PlantedOverflow(torch.nn.Tanh(), at_call), torch.nn.Linear(8, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def test_modules_are_named_from_the_module_called_outermost_as_a_full_trace_names_them(tmp_path: Path) -> None:
    """Issue 30.4: the callback named ``net.1`` where a full trace of the script (which knows no LightningModule,
    only the modules called) names ``1``."""
    _fit(tmp_path, None, module=CallsItsNet(at_call=4))
    doc = json.loads((tmp_path / "nantrace.json").read_text(encoding="utf-8"))
    first = doc["first"]
    assert (first["kind"], first["op"], first["module"], first["step"]) == ("inf", "aten.mul.Tensor", "1", 4)


class LogOfItsOutput(LightningModule):
    """A NaN born outside every module, in ``training_step``'s own ``log``: watch mode re-runs model calls only."""

    calls: torch.Tensor

    def __init__(self, at_step: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.at_step = at_step
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.calls += 1
        out = self.net(x)
        if int(self.calls) == self.at_step:
            out = torch.log(out - 1e3)  # planted NaN, outside the model
        return torch.nn.functional.mse_loss(out, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def test_the_log_line_names_the_step_that_failed_when_it_could_not_be_replayed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The step whose loss went NaN cannot be replayed (the NaN is born outside the model); the next step's first
    NaN only came back through the weights its update wrote. The log line said "step 5: nan born in
    aten.addmm.default ... at <the model call>", sending the reader to a line that did nothing wrong."""
    with caplog.at_level(logging.INFO, logger="dtypecheck"):
        _fit(tmp_path, None, module=LogOfItsOutput(at_step=4))
    doc = json.loads((tmp_path / "nantrace.json").read_text(encoding="utf-8"))
    first = doc["first"]
    assert (doc["watch"]["detected_step"], doc["watch"]["exact"], first["step"], first["cause"]) == (
        4,
        False,
        5,
        "input",
    )
    location = first["location"]
    assert [r.getMessage() for r in caplog.records if r.name == "dtypecheck"] == [
        "dtypecheck nan-trace: step 4: the loss went non-finite but the step could not be replayed exactly (the "
        "report's watch.reason says why); the next steps, traced fully: step 5: nan already in the input of "
        f"{first['op']} (forward) in module {first['module']} at {location['file']}:{location['line']} "
        f"(report: {tmp_path / 'nantrace.json'})"
    ]
