"""A verdict per target, first (issue 21.1): every field checked against counts computed here with numpy/ml_dtypes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.dtypes import lookup
from dtypecheck.render import OutputFormat, render
from dtypecheck.scan.run import scan_checkpoint
from tests._references import ML_DTYPES_SCALAR


def _reference(values: np.ndarray, target: str) -> tuple[int, int, int]:
    """(overflow, underflow, subnormal) of float32 ``values`` cast to ``target`` by ml_dtypes/numpy (RNE)."""
    scalar = ML_DTYPES_SCALAR[target]
    with np.errstate(over="ignore", invalid="ignore"):
        cast = values.astype(scalar).astype(np.float64)
    finite = np.isfinite(values)
    normal = float(ml_dtypes.finfo(scalar).smallest_normal)
    overflow = int(np.count_nonzero(finite & ~np.isfinite(cast)))
    underflow = int(np.count_nonzero(finite & (values != 0) & (cast == 0)))
    subnormal = int(np.count_nonzero(finite & (cast != 0) & (np.abs(cast) < normal)))
    return overflow, underflow, subnormal


def _tensors() -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(5)
    normal = rng.normal(0, 0.02, 4000).astype(np.float32)
    hot = normal.copy()
    hot[:3] = [70000.0, -1e5, 3e38]  # overflow float16 (bfloat16 holds them: its max is 3.39e38)
    hot[3:10] = 1e-9  # flush in float16, stay in bfloat16
    hot[10:15] = 1e-6  # float16 subnormals
    tiny = (rng.random(1000) * 1e-40).astype(np.float32)  # float32 subnormals: flush in both
    return {
        "layer.weight": torch.from_numpy(normal),
        "layer.hot": torch.from_numpy(hot),
        "layer.tiny": torch.from_numpy(tiny),
        "ids": torch.arange(10),
        "optimizer.state.0.step": torch.tensor(1e6),  # bookkeeping: not in any verdict
    }


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    path = tmp_path / "m.safetensors"
    save_file(_tensors(), str(path))
    return str(path)


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_every_verdict_field_matches_numpy(checkpoint: str, target: str) -> None:
    report = scan_checkpoint(checkpoint, [lookup("fp16"), lookup("bf16")])
    [verdict] = [v for v in report.summary.verdicts if v.target == target]
    judged = {k: v.numpy() for k, v in _tensors().items() if v.is_floating_point() and k != "optimizer.state.0.step"}
    counts = {name: _reference(values, target) for name, values in judged.items()}
    assert verdict.overflow == sum(c[0] for c in counts.values())
    assert verdict.underflow == sum(c[1] for c in counts.values())
    assert verdict.subnormal == sum(c[2] for c in counts.values())
    assert verdict.fraction_flushed == sum(c[1] for c in counts.values()) / sum(v.size for v in judged.values())
    # A warn harms (docs/contract.md "Levels"): more than 0.1% of the values flushed, or more than 1% subnormal.
    size = {name: values.size for name, values in judged.items()}
    levels = {
        n: "fail" if c[0] else "warn" if c[1] > 0.001 * size[n] or c[2] > 0.01 * size[n] else "ok"
        for n, c in counts.items()
    }
    assert dict(verdict.tensors) == {level: list(levels.values()).count(level) for level in ("ok", "warn", "fail")}
    expected_level = "fail" if "fail" in levels.values() else "warn" if "warn" in levels.values() else "ok"
    assert verdict.level == expected_level
    assert verdict.scaled_underflow is None


def test_the_numbers_behind_the_advice(checkpoint: str) -> None:
    report = scan_checkpoint(checkpoint, [lookup("fp16"), lookup("bf16"), lookup("e4m3")])
    fp16, bf16, e4m3 = report.summary.verdicts
    hot = _tensors()["layer.hot"].numpy()
    assert _reference(hot, "float16")[0] == 3  # the three overflows are in layer.hot alone
    assert (fp16.worst, fp16.advice) == ("layer.hot", "cast, keep these 1 tensor(s) in float32: layer.hot")
    # bfloat16 holds every magnitude here; only layer.tiny (float32 subnormals below bfloat16's) flushes
    assert bf16.overflow == 0
    assert bf16.level == "warn"
    assert bf16.worst == "layer.tiny"
    assert bf16.advice == f"cast; {100 * bf16.underflow / (4000 + 4000 + 1000):.2g}% of values flush to zero"
    assert e4m3.advice == "needs per-tensor scaling"
    assert e4m3.scaled_underflow is not None
    assert e4m3.scaled_underflow > 0


def test_a_clean_checkpoint_is_safe_to_cast(tmp_path: Path) -> None:
    path = tmp_path / "clean.safetensors"
    save_file({"w": torch.linspace(-1, 1, 101)}, str(path))
    [verdict] = scan_checkpoint(str(path), [lookup("bf16")]).summary.verdicts
    assert (verdict.level, verdict.worst, verdict.advice) == ("ok", None, "safe to cast")
    assert dict(verdict.tensors) == {"ok": 1, "warn": 0, "fail": 0}


def test_a_checkpoint_with_nothing_cast_to_the_target_is_not_called_safe(tmp_path: Path) -> None:
    path = tmp_path / "ints.safetensors"
    save_file({"ids": torch.arange(10), "mask": torch.ones(4, dtype=torch.bool)}, str(path))
    [verdict] = scan_checkpoint(str(path), [lookup("fp16")]).summary.verdicts
    assert verdict.advice == "nothing to judge: no tensor of the checkpoint is cast to this target"
    assert dict(verdict.tensors) == {"ok": 0, "warn": 0, "fail": 0}


def test_nan_sources_come_first_in_the_advice(tmp_path: Path) -> None:
    path = tmp_path / "nan.safetensors"
    save_file({"a": torch.tensor([1.0, float("nan")]), "b": torch.ones(3)}, str(path))
    [verdict] = scan_checkpoint(str(path), [lookup("bf16")]).summary.verdicts
    assert verdict.level == "fail"
    assert verdict.worst == "a"
    assert verdict.advice == "fix first: 1 tensor(s) already hold NaN/inf; then safe to cast"


def test_many_overflowing_tensors_are_not_representable(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    save_file({f"w{i}": torch.full((4,), 1e5) for i in range(5)}, str(path))
    [verdict] = scan_checkpoint(str(path), [lookup("fp16")]).summary.verdicts
    assert verdict.advice == "not representable: 5 of 5 tensors overflow"
    assert verdict.overflow == 20


def test_json_and_table_lead_with_the_verdicts(cli: Callable[..., Any], checkpoint: str) -> None:
    doc = cli("scan-model", checkpoint, "--format", "json").json()
    assert [v["target"] for v in doc["summary"]["verdicts"]] == ["float16", "bfloat16"]
    assert set(doc["summary"]["verdicts"][0]) == {
        "target", "level", "overflow", "underflow", "subnormal", "fraction_flushed", "tensors", "worst", "advice",
        "scaled_underflow",
    }  # fmt: skip
    table = render(scan_checkpoint(checkpoint), OutputFormat.table, width=100)
    assert table.splitlines()[0].startswith("╭─ verdict per target")
    assert "→ cast, keep these 1 tensor(s) in float32: layer.hot" in table
