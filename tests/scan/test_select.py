"""--include/--exclude GLOB and --weights-only (issue 21.3): which tensors a scan reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from dtypecheck.scan.roles import assign_roles
from dtypecheck.scan.select import Selection
from tests.scan import _training_ckpts as ckpts


@dataclass(frozen=True)
class _Layout:
    name: str
    dtype: str
    shape: tuple[int, ...]


_ROLES = assign_roles(
    [
        _Layout("model.0.weight", "float32", (4, 4)),
        _Layout("model.1.running_var", "float32", (4,)),
        _Layout("model.1.running_mean", "float32", (4,)),
        _Layout("model.1.num_batches_tracked", "int64", ()),
        _Layout("model.2.bias", "float32", (4,)),
        _Layout("optimizer.state.0.exp_avg", "float32", (4, 4)),
        _Layout("optimizer.state.0.step", "float32", ()),
        _Layout("rng_state.cpu", "uint8", (5056,)),
        _Layout("callbacks.EarlyStopping{}.best_score", "float32", ()),
    ]
)
"""The roles of a training checkpoint's tensors (``Selection.keeps`` is given each one's)."""


@pytest.mark.parametrize(
    ("selection", "name", "kept"),
    [
        (Selection(), "optimizer.state.0.step", True),
        (Selection(include=("model.*",)), "model.0.weight", True),
        (Selection(include=("model.*",)), "optimizer.state.0.exp_avg", False),
        (Selection(include=("*.weight", "*.bias")), "model.2.bias", True),
        (Selection(include=("model.*",), exclude=("*.bias",)), "model.2.bias", False),  # exclude wins
        (Selection(include=("Model.*",)), "model.0.weight", False),  # case matters, as in the ignore rules
        (Selection(weights_only=True), "model.1.running_var", True),
        (Selection(weights_only=True), "model.1.num_batches_tracked", True),  # a buffer of the model
        (Selection(weights_only=True), "optimizer.state.0.exp_avg", False),
        (Selection(weights_only=True), "optimizer.state.0.step", False),
        (Selection(weights_only=True), "rng_state.cpu", False),
        (Selection(weights_only=True), "callbacks.EarlyStopping{}.best_score", False),
    ],
)
def test_selection_keeps(selection: Selection, name: str, kept: bool) -> None:
    assert selection.keeps(name, _ROLES.get(name)) is kept


def _model_tensors(state: dict[str, torch.Tensor], prefix: str) -> dict[str, int]:
    return {f"{prefix}{k}": v.numel() for k, v in state.items()}


@pytest.mark.parametrize("shape", ["plain", "lightning", "hf_trainer", "deepspeed"])
def test_weights_only_keeps_exactly_the_model_state(cli: Callable[..., Any], tmp_path: Path, shape: str) -> None:
    path = getattr(ckpts, shape)(tmp_path)
    if shape == "plain":
        saved = torch.load(path, weights_only=True)
        expected = _model_tensors(saved["model"], "model.")
    elif shape == "lightning":
        expected = _model_tensors(torch.load(path, weights_only=True)["state_dict"], "state_dict.")
    elif shape == "hf_trainer":
        from safetensors.torch import load_file

        expected = _model_tensors(load_file(str(path / "model.safetensors")), "model.")
    else:
        module = torch.load(path / "mp_rank_00_model_states.pt", weights_only=True)["module"]
        expected = _model_tensors(module, "mp_rank_00_model_states.module.")
    everything = cli("scan-model", str(path), "--format", "json").json()
    doc = cli("scan-model", str(path), "--weights-only", "--format", "json").json()
    assert {t["name"]: t["numel"] for t in doc["tensors"]} == expected
    assert doc["summary"]["numel"] == sum(expected.values())
    assert doc["summary"]["left_out"] == len(everything["tensors"]) - len(expected) > 0
    assert {t["role"] for t in doc["tensors"]} <= {"model", "bookkeeping"}  # num_batches_tracked is a buffer


def test_include_and_exclude_are_repeatable_and_exclude_wins(cli: Callable[..., Any], tmp_path: Path) -> None:
    path = ckpts.plain(tmp_path)
    result = cli(
        "scan-model", str(path), "--include", "model.0.*", "--include", "model.2.*", "--exclude", "*.bias",
        "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0
    assert [t["name"] for t in result.json()["tensors"]] == ["model.0.weight", "model.2.weight"]
    table = cli("scan-model", str(path), "--include", "model.0.*")
    assert "25 tensor(s) left out by --include/--exclude/--weights-only" in table.stdout


def test_a_selection_that_leaves_nothing_fails(cli: Callable[..., Any], tmp_path: Path) -> None:
    path = ckpts.plain(tmp_path)
    result = cli("scan-model", str(path), "--include", "encoder.*", "--format", "json")
    assert result.exit_code == 1
    doc = result.json()
    assert doc["tensors"] == []
    assert doc["findings"][0] == {
        "kind": "no-tensors",
        "level": "fail",
        "detail": "include 'encoder.*' left none of the 27 tensors",
        "tensor": None,
    }


def test_left_out_tensors_are_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dtypecheck.scan import run
    from dtypecheck.scan.tensor import TensorScanner

    read: list[str] = []

    def spy(record: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(record.name)
        return TensorScanner(record, *args, **kwargs)

    monkeypatch.setattr(run, "TensorScanner", spy)
    report = run.scan_checkpoint(str(ckpts.plain(tmp_path)), selection=Selection(include=("model.2.*",)))
    assert read == ["model.2.weight", "model.2.bias"]
    assert report.summary.left_out == 25
