"""Baselines: gate only on what is new or worse since an earlier scan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dtypecheck.errors import InputError
from dtypecheck.scan.baseline import compare, load_baseline
from dtypecheck.scan.document import read_scan_document
from dtypecheck.scan.report import ScanReport

PICKLE_FAIL = {"kind": "pickle-global", "level": "fail", "detail": "os.system"}
SHARD_FAIL = {"kind": "missing-shard", "level": "fail", "detail": "model-00002-of-00002.safetensors"}


def _json(*tensors: dict[str, Any], findings: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"schema": "dtypecheck.scan/1", "tensors": list(tensors), "findings": findings or []}


def _doc(*tensors: dict[str, Any], findings: list[dict[str, Any]] | None = None) -> ScanReport:
    return read_scan_document(_json(*tensors, findings=findings), "test")


def _tensor(name: str, *, nan: int = 0, underflow: int = 0, overflow: int = 0, level: str = "warn") -> dict[str, Any]:
    cast = {"overflow": overflow, "underflow": underflow, "subnormal": 0, "level": level}
    return {"name": name, "nan": nan, "posinf": 0, "neginf": 0, "casts": {"float16": cast}}


def test_unchanged_findings_do_not_gate() -> None:
    old = _doc(_tensor("a", underflow=3))
    result = compare(_doc(_tensor("a", underflow=3)), old)
    assert result.level == "ok"
    assert [(c.check, c.state) for c in result.changes] == [("underflow:float16", "unchanged")]


def test_new_and_worse_gate_at_their_level() -> None:
    old = _doc(_tensor("a", underflow=3), _tensor("b", underflow=1))
    new = _doc(_tensor("a", underflow=5), _tensor("b", underflow=1), _tensor("c", overflow=1, level="fail"))
    result = compare(new, old)
    states = {(c.tensor, c.check): c.state for c in result.changes}
    assert states == {
        ("a", "underflow:float16"): "worse",
        ("b", "underflow:float16"): "unchanged",
        ("c", "overflow:float16"): "new",
    }
    assert result.level == "fail"
    assert result.counts == {"new": 1, "worse": 1, "unchanged": 1, "improved": 0, "fixed": 0}


def test_fixed_and_improved_are_reported_but_pass() -> None:
    old = _doc(_tensor("a", nan=2), _tensor("b", underflow=9))
    result = compare(_doc(_tensor("a"), _tensor("b", underflow=4)), old)
    assert {(c.tensor, c.check, c.state) for c in result.changes} == {
        ("a", "nonfinite", "fixed"),
        ("b", "underflow:float16", "improved"),
    }
    assert result.level == "ok"


def test_failing_scan_passes_with_its_own_baseline_and_fails_again_when_it_worsens() -> None:
    failing = _doc(_tensor("w", nan=1), findings=[SHARD_FAIL])
    assert compare(failing, _doc()).level == "fail"
    assert compare(failing, failing).level == "ok"
    worse = _doc(_tensor("w", nan=2), findings=[SHARD_FAIL])
    assert compare(worse, failing).level == "fail"


@pytest.mark.parametrize("kind", ["pickle-global", "pickle-polyglot", "contains-code", "zip-differential"])
def test_no_baseline_accepts_a_security_finding(kind: str) -> None:
    # issue 27: a baseline that recorded a code-running global (shipped with the checkpoint, or once accepted by
    # the project) never passes it again; the numbers it recorded still are accepted.
    finding = {"kind": kind, "level": "fail", "detail": "posix.system"}
    failing = _doc(_tensor("w", nan=1), findings=[finding])
    comparison = compare(failing, failing)
    assert comparison.level == "fail"
    assert [(c.check, c.before, c.after, c.state) for c in comparison.changes] == [
        ("nonfinite", 1, 1, "unchanged"),
        (f"finding:{kind}:posix.system", 0, 1, "new"),
    ]
    warned = _doc(findings=[{**finding, "level": "warn"}])
    assert compare(warned, warned).level == "warn"


def test_checks_the_policy_downgraded_to_ok_are_not_gated() -> None:
    assert compare(_doc(_tensor("a", underflow=3, level="ok")), _doc()).changes == ()


def test_load_baseline_rejects_what_is_not_a_scan_report(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_json(_tensor("a", underflow=3))))
    earlier = load_baseline(good).report_for("any.safetensors", alone=True)  # an old single report: one checkpoint's
    assert earlier is not None
    assert [t.casts["float16"].underflow for t in earlier.tensors] == [3]
    malformed = [
        ("bad.json", "{"),
        ("info.json", json.dumps({"schema": "dtypecheck.info/1"})),
        ("deep.json", '{"schema": "dtypecheck.scan/1", "tensors": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        ("counts.json", json.dumps(_json({**_tensor("a"), "nan": "many"}))),
        ("level.json", json.dumps(_json(_tensor("a", level="bad")))),
        ("list.json", json.dumps({"schema": "dtypecheck.scan/1", "tensors": {"a": 1}})),
        ("entries.json", json.dumps({"schema": "dtypecheck.baseline/1", "checkpoints": [1]})),
        ("entry.json", json.dumps({"schema": "dtypecheck.baseline/1", "checkpoints": {"m.pt": {"schema": "x"}}})),
    ]
    for name, body in malformed:
        (tmp_path / name).write_text(body)
        with pytest.raises(InputError):
            load_baseline(tmp_path / name)
    with pytest.raises(InputError, match="no such file"):
        load_baseline(tmp_path / "missing.json")


def test_checks_the_policy_passed_are_not_gated_even_beside_others_that_are() -> None:
    # overflow ignored by the policy, underflow not: the cast is at warn, and only the underflow gates.
    tensor = {**_tensor("a", nan=1, overflow=2, underflow=3), "passed": ["nonfinite", "overflow:float16"]}
    result = compare(_doc(tensor), _doc())
    assert [(c.check, c.state, c.level) for c in result.changes] == [("underflow:float16", "new", "warn")]
    assert result.level == "warn"


def test_a_deeply_nested_baseline_is_one_input_error_line(cli, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    ckpt = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(2)}, str(ckpt))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    result = cli("scan-model", str(ckpt), "--baseline", str(deep))
    assert result.exit_code == 3
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: --baseline {deep}: not a JSON report")
