"""The Python API does what the command line does: baselines, updating them, and the gate over several checkpoints."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import dtypecheck
from dtypecheck.dtypes import lookup
from dtypecheck.errors import InputError, ParameterError, UsageError
from dtypecheck.scan.gate import CheckpointPlan, Gate
from dtypecheck.scan.run import scan_checkpoint


def _ckpt(tmp_path: Path, name: str, values: list[float]) -> str:
    path = tmp_path / name
    save_file({"w": torch.tensor(values, dtype=torch.float32)}, str(path))
    return str(path)


def _fp16_underflows(values: list[float]) -> int:
    """Nonzero float32 values numpy's float16 cast flushes to zero (the independent count)."""
    source = np.asarray(values, dtype=np.float32)
    return int(np.count_nonzero((source != 0) & (source.astype(np.float16) == 0)))


def test_the_public_function_takes_the_checkpoint_by_that_name(tmp_path: Path) -> None:
    path = _ckpt(tmp_path, "m.safetensors", [1.0, 2.0])
    assert dtypecheck.scan_checkpoint is scan_checkpoint
    report = scan_checkpoint(checkpoint=path, targets=[lookup("fp16")])
    assert report.targets == ("float16",)
    assert [t.name for t in report.tensors] == ["w"]


def test_a_baseline_written_by_the_api_gates_only_what_is_new(tmp_path: Path) -> None:
    values = [1.0, 1e-9, 2e-9]  # both tiny values flush to zero in float16
    path = _ckpt(tmp_path, "m.safetensors", values)
    baseline = tmp_path / "baseline.json"
    first = scan_checkpoint(path, baseline=baseline, baseline_key="m", update_baseline=True)
    assert first.baseline is None  # written, not compared
    assert first.summary.level == "warn"
    assert sorted(json.loads(baseline.read_text())["checkpoints"]) == ["m"]

    same = scan_checkpoint(path, baseline=baseline, baseline_key="m")
    assert same.baseline is not None
    assert same.baseline.level == "ok"
    assert same.gate_level == "ok"
    assert same.baseline.counts["unchanged"] == 1

    worse_values = [1.0, 1e-9, 2e-9, 3e-9]
    _ckpt(tmp_path, "m.safetensors", worse_values)
    worse = scan_checkpoint(path, baseline=baseline, baseline_key="m")
    assert worse.baseline is not None
    assert worse.gate_level == "warn"
    [change] = [c for c in worse.baseline.changes if c.state == "worse"]
    assert (change.check, change.before, change.after) == (
        "underflow:float16",
        _fp16_underflows(values),
        _fp16_underflows(worse_values),
    )


def test_api_errors_name_parameters_not_flags(tmp_path: Path) -> None:
    path = _ckpt(tmp_path, "m.safetensors", [1.0])
    with pytest.raises(ParameterError, match=r"^update_baseline: ") as raised:
        scan_checkpoint(path, update_baseline=True)
    assert "--" not in str(raised.value)
    with pytest.raises(ParameterError, match=r"^targets float8_e8m0fnu") as bad_target:
        scan_checkpoint(path, [lookup("e8m0")])
    assert "--" not in str(bad_target.value)
    assert str(bad_target.value.with_flags({"targets": "--target"})).startswith("--target float8_e8m0fnu")
    with pytest.raises(InputError, match=r"^baseline .*missing\.json: no such file \(write it with update_baseline\)$"):
        scan_checkpoint(path, baseline=tmp_path / "missing.json")


def test_a_bad_baseline_fails_before_the_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _ckpt(tmp_path, "m.safetensors", [1.0])
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    opened: list[str] = []
    monkeypatch.setattr("dtypecheck.scan.run.open_checkpoint", opened.append)
    with pytest.raises(InputError, match="not a JSON report"):
        scan_checkpoint(path, baseline=bad)
    assert opened == []


def test_the_gate_over_several_checkpoints_writes_each_shared_file_once(tmp_path: Path) -> None:
    clean = _ckpt(tmp_path, "clean.safetensors", [1.0, 2.0])
    tiny = _ckpt(tmp_path, "tiny.safetensors", [1.0, 1e-9])
    shared = tmp_path / "ci" / "baseline.json"
    plans = [CheckpointPlan(c, baseline=shared, key=Path(c).name) for c in (clean, tiny)]
    updating = Gate(plans, update=True)
    results = [updating.judge(plan, scan_checkpoint(plan.checkpoint)) for plan in plans]
    assert [r.findings for r in results] == [False, False]  # updating never gates
    [written] = updating.write()
    assert (written.path, written.updated, written.kept) == (shared, ("clean.safetensors", "tiny.safetensors"), 0)

    strict = [CheckpointPlan(c, baseline=shared, key=Path(c).name, fail_on="warn") for c in (clean, tiny)]
    gate = Gate([*strict, CheckpointPlan(tiny, baseline=shared, key="unknown", fail_on="warn")])
    judged = [gate.judge(plan, scan_checkpoint(plan.checkpoint)) for plan in gate.plans]
    assert [r.missing_entry for r in judged] == [False, False, True]
    assert [r.findings for r in judged] == [False, False, True]  # only the entry the baseline lacks is new
    assert gate.write() == ()


def test_without_a_baseline_fail_on_decides(tmp_path: Path) -> None:
    tiny = _ckpt(tmp_path, "tiny.safetensors", [1.0, 1e-9])
    report = scan_checkpoint(tiny)
    lenient, strict = Gate([CheckpointPlan(tiny)]), Gate([CheckpointPlan(tiny, fail_on="warn")])
    assert report.gate_level == "warn"
    assert lenient.judge(lenient.plans[0], report).findings is False
    assert strict.judge(strict.plans[0], report).findings is True


def test_cli_maps_parameter_names_to_flags(cli: Callable[..., Any], tmp_path: Path) -> None:
    path = _ckpt(tmp_path, "m.safetensors", [1.0])
    result = cli("scan-model", path, "--target", "e8m0")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --target float8_e8m0fnu holds only positive powers of two")
    assert issubclass(ParameterError, UsageError)
