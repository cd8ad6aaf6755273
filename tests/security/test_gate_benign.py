"""Issue 27, class 7: what frameworks really write passes the default gate (no false alarms), now that the gate
fails closed on globals: whole modules pickled in both formats, Trainer/peft/Lightning/accelerate/DCP output."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult
from tests.security import corpus
from tests.security.gate import benign
from tests.security.harness import run_cli


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[corpus.Hostile]:
    return corpus.build(tmp_path_factory.mktemp("benign"), ("benign-frameworks",))


def _globals(result: CliResult) -> dict[str, str]:
    return {f["detail"]: f["level"] for f in result.json()["findings"] if f["kind"] == "pickle-global"}


def test_every_library_made_its_files(inputs: list[corpus.Hostile]) -> None:
    names = {h.name for h in inputs}
    assert names == {
        "whole-sequential", "whole-sequential-legacy", "whole-transformer-encoder-layer",
        "whole-transformer-encoder-layer-legacy", "training-states", "trainer-checkpoint", "trainer-optimizer",
        "trainer-rng_state", "peft-checkpoint", "lightning-swa", "lightning-swa-model-checkpoint",
        "accelerate-state", "dcp-save",
    }  # fmt: skip
    assert all(h.benign and h.expect == frozenset({0}) and h.canary is None for h in inputs)


def test_benign_files_pass_the_default_gate(inputs: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    for hostile in inputs:
        result = cli(*hostile.args, "--format", "json")
        levels = _globals(result)
        assert "fail" not in levels.values(), (hostile.name, levels)
        assert result.exit_code == 0, (hostile.name, result.stderr, result.json()["findings"])
        # only the vetted framework classes warn
        warned = {name for name, level in levels.items() if level == "warn"}
        assert all(name.split(".")[0] in {"transformers", "accelerate"} for name in warned), (hostile.name, warned)


def test_whole_modules_read_as_state_dicts(inputs: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    """Both formats of a whole pickled module give the tensors its state_dict() names, and its F.relu is a plain
    reference (ok)."""
    import torch

    expected = sorted(torch.nn.TransformerEncoderLayer(8, 2, 16).state_dict())
    by_name = {h.name: h for h in inputs}
    for name in ("whole-transformer-encoder-layer", "whole-transformer-encoder-layer-legacy"):
        result = cli(*by_name[name].args, "--format", "json")
        assert result.exit_code == 0, result.stderr
        assert sorted(t["name"] for t in result.json()["tensors"]) == expected
        assert _globals(result)["torch.nn.functional.relu"] == "ok"
        assert result.json()["format"] == ("torch-legacy" if name.endswith("legacy") else "torch-zip")
    legacy = cli(*by_name["whole-sequential-legacy"].args, "--format", "json")
    assert sorted(t["name"] for t in legacy.json()["tensors"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]


def test_trainer_training_args_are_vetted_warnings(inputs: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    trainer = next(h for h in inputs if h.name == "trainer-checkpoint")
    result = cli(*trainer.args, "--format", "json")
    levels = {detail.split(" (in ")[0]: level for detail, level in _globals(result).items()}
    assert levels["transformers.training_args.TrainingArguments"] == "warn"
    assert levels["transformers.trainer_utils.IntervalStrategy"] == "warn"
    strict = cli(*trainer.args, "--fail-on", "warn")
    assert strict.exit_code == 1  # --fail-on warn still refuses what would import transformers
    # as CI runs it, in a fresh process (transformers not imported) from a project root holding packages
    done = run_cli((*trainer.args, "--format", "json"))
    assert done.returncode == 0, done.stdout[-2000:]


def test_benign_class_is_registered() -> None:
    assert benign.KLASS in corpus.GATE_CLASSES


@pytest.mark.parametrize(
    ("value", "exit_code"),
    [(float("inf"), 0), (float("-inf"), 0), (float("nan"), 1)],
    ids=["inf", "-inf", "nan"],
)
def test_a_callback_score_at_inf_is_its_sentinel_but_nan_and_weights_are_judged(
    tmp_path: Path, cli: Callable[..., CliResult], value: float, exit_code: int
) -> None:
    """ModelCheckpoint's ``kth_value`` starts at inf (mode min), EarlyStopping's ``best_score`` at ±inf: a
    one-element score under Lightning's top-level ``callbacks`` at ±inf passes, NaN does not, nor does an inf in a
    tensor of more than one element there."""
    from pathlib import Path

    import torch

    folder = Path(str(tmp_path))
    score = {"state_dict": {"w": torch.ones(4)}, "callbacks": {"ModelCheckpoint{}": {"kth_value": torch.tensor(value)}}}
    torch.save(score, folder / "score.ckpt")
    result = cli("scan-model", str(folder / "score.ckpt"), "--format", "json")
    assert result.exit_code == exit_code, result.stdout[-2000:]
    (judged,) = [t for t in result.json()["tensors"] if t["name"].endswith("kth_value")]
    assert (judged["posinf"], judged["neginf"], judged["nan"]) == (
        value == float("inf"),
        value == float("-inf"),
        math.isnan(value),
    )
    wide = {"state_dict": {"w": torch.ones(4)}, "callbacks": {"SWA": {"kth_value": torch.full((2,), value)}}}
    torch.save(wide, folder / "wide.ckpt")
    assert cli("scan-model", str(folder / "wide.ckpt")).exit_code == 1
