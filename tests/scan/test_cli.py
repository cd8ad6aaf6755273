"""``dtypecheck scan-model`` through the real CLI boundary: exit codes, stdout/stderr, JSON, table, bad inputs."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.loaders import Finding, open_checkpoint
from dtypecheck.render import OutputFormat, render
from dtypecheck.scan.run import scan_checkpoint


def _load_example_module() -> Any:
    path = Path(__file__).resolve().parent.parent.parent / "examples" / "make_example_checkpoint.py"
    spec = importlib.util.spec_from_file_location("make_example_checkpoint", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_example_checkpoint = _load_example_module()

TENSOR_KEYS = [
    "name", "dtype", "shape", "numel", "bytes", "min", "max", "absmax", "min_abs_nonzero",
    "nan", "posinf", "neginf", "zeros", "subnormal", "casts", "level",
]  # fmt: skip


def _write(tmp_path: Path, tensors: dict[str, torch.Tensor], name: str = "m.safetensors") -> str:
    path = tmp_path / name
    save_file(tensors, str(path))
    return str(path)


@pytest.fixture
def example(tmp_path: Path) -> str:
    return _write(tmp_path, make_example_checkpoint.build(), "tiny_model.safetensors")


@pytest.fixture
def clean(tmp_path: Path) -> str:
    return _write(tmp_path, {"w": torch.arange(-50, 51) / 64.0, "n": torch.ones(4)}, "clean.safetensors")


@pytest.fixture
def warn_only(tmp_path: Path) -> str:
    return _write(tmp_path, {"exp_avg_sq": torch.full((8,), 1e-9)}, "warn.safetensors")


def test_json_document_follows_the_contract(cli, example) -> None:
    result = cli("scan-model", example, "--format", "json")
    assert result.exit_code == 1
    doc = result.json()
    assert doc["schema"] == "dtypecheck.scan/1"
    assert doc["format"] == "safetensors"
    assert doc["targets"] == ["float16", "bfloat16"]
    assert set(doc) >= {"dtypecheck_version", "source", "tensors", "findings", "summary"}
    by_name = {t["name"]: t for t in doc["tensors"]}
    for tensor in doc["tensors"]:
        assert list(tensor)[: len(TENSOR_KEYS)] == TENSOR_KEYS
    fc1 = by_name["layers.0.mlp.fc1.weight"]
    assert fc1["casts"]["float16"]["overflow"] == 3  # 65520, 70000, -123456
    bf16 = fc1["casts"]["bfloat16"]
    assert list(bf16)[:4] == ["overflow", "underflow", "subnormal", "level"]
    assert {k: bf16[k] for k in list(bf16)[:4]} == {"overflow": 0, "underflow": 0, "subnormal": 0, "level": "ok"}
    assert bf16["fraction"] == {"overflow": 0.0, "underflow": 0.0, "subnormal": 0.0}
    assert fc1["casts"]["float16"]["fraction"]["overflow"] == 3 / fc1["numel"]
    assert bf16["sqnr_db"] is None  # measured only with --precision
    assert fc1["absmax"] == 123456.0
    assert by_name["layers.1.mlp.fc2.weight"]["nan"] == 1
    assert by_name["layers.1.mlp.fc2.weight"]["level"] == "fail"
    assert by_name["optimizer.state.0.exp_avg_sq"]["casts"]["float16"]["level"] == "warn"
    assert by_name["optimizer.state.0.exp_avg_sq"]["casts"]["float16"]["underflow"] > 0
    assert by_name["position_ids"]["casts"] == {}
    census: dict[str, dict[str, int]] = {}
    for t in doc["tensors"]:
        row = census.setdefault(t["dtype"], {"tensors": 0, "numel": 0, "bytes": 0})
        row["tensors"] += 1
        row["numel"] += t["numel"]
        row["bytes"] += t["bytes"]
    verdicts = doc["summary"].pop("verdicts")  # every field is checked against numpy in test_verdicts.py
    assert [(v["target"], v["level"], v["overflow"]) for v in verdicts] == [
        ("float16", "fail", 3),
        ("bfloat16", "fail", 0),
    ]
    assert doc["summary"] == {
        "tensors": 7,
        "numel": sum(t["numel"] for t in doc["tensors"]),
        "bytes": sum(t["bytes"] for t in doc["tensors"]),
        # embed.weight (7 of 2048 subnormal in float16) and layers.0.attn.qkv.weight (7 of 3072) stay below the 1%
        # that harms: ok; only exp_avg_sq (46% flushed) warns
        "ok": 4,
        "warn": 1,
        "fail": 2,
        "level": "fail",
        "census": census,
        "keep_float32": [],  # bfloat16 holds every float32 tensor of the example
        "not_judged": [],  # no step counter or other bookkeeping in the example
        "left_out": 0,
        "aliases": 0,
    }
    assert list(doc["summary"]["census"]) == ["float32", "int64", "bfloat16"]  # largest share of bytes first
    assert result.stderr == ""  # stderr is not a terminal here: no progress bar


def test_nonfinite_values_are_strings_in_json(cli, tmp_path) -> None:
    path = _write(tmp_path, {"x": torch.tensor([math.inf, -math.inf, math.nan])})
    tensor = cli("scan-model", path, "-f", "json").json()["tensors"][0]
    assert (tensor["min"], tensor["max"], tensor["absmax"]) == ("-inf", "inf", "inf")
    assert (tensor["nan"], tensor["posinf"], tensor["neginf"]) == (1, 1, 1)


def test_targets_repeatable_and_comma_lists(cli, example) -> None:
    doc = cli("scan-model", example, "-f", "json", "--target", "fp16,e4m3", "-t", "BF16", "-t", "fp16").json()
    assert doc["targets"] == ["float16", "float8_e4m3fn", "bfloat16"]
    casts = {t["name"]: t for t in doc["tensors"]}["embed.weight"]["casts"]
    assert "scaled_underflow" in casts["float8_e4m3fn"]
    assert "scaled_underflow" not in casts["float16"]


@pytest.mark.parametrize("bad", ["fp61", "complex64", "bool"])
def test_bad_target_is_a_usage_error(cli, example, bad) -> None:
    result = cli("scan-model", example, "--target", bad)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_exit_codes_follow_fail_on(cli, clean, warn_only, example) -> None:
    assert cli("scan-model", clean, "-q").exit_code == 0
    assert cli("scan-model", warn_only, "-q").exit_code == 0
    assert cli("scan-model", warn_only, "-q", "--fail-on", "warn").exit_code == 1
    assert cli("scan-model", example, "-q").exit_code == 1
    assert cli("scan-model", clean, "-q", "--fail-on", "warn").exit_code == 0


def test_loader_findings_count_towards_the_level(cli, clean, monkeypatch) -> None:
    def with_finding(target: str):
        checkpoint = open_checkpoint(target)
        checkpoint.findings.append(Finding("pickle-global", "fail", "os.system"))
        return checkpoint

    monkeypatch.setattr("dtypecheck.scan.run.open_checkpoint", with_finding)
    result = cli("scan-model", clean, "-f", "json")
    assert result.exit_code == 1
    doc = result.json()
    assert doc["findings"] == [{"kind": "pickle-global", "level": "fail", "detail": "os.system", "tensor": None}]
    assert (doc["summary"]["fail"], doc["summary"]["level"]) == (0, "fail")


def test_output_file_and_quiet(cli, clean, tmp_path) -> None:
    out = tmp_path / "report.json"
    result = cli("scan-model", clean, "-f", "json", "-o", str(out), "-q")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")
    assert '"dtypecheck.scan/1"' in out.read_text()


def test_table_shows_worst_first_and_hides_the_rest(cli, example) -> None:
    result = cli("scan-model", example, "--top", "2")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    rows = [line.split()[0] for line in lines if line.startswith(("layers", "optim", "embed", "position"))]
    assert rows[:2] == ["layers.0.mlp.fc1.weight", "layers.1.mlp.fc2.weight"]
    assert "5 more tensors not shown" in result.stdout
    everything = cli("scan-model", example, "--all").stdout
    assert "position_ids" in everything
    assert "more tensors not shown" not in everything


def test_table_golden(example, golden) -> None:
    report = scan_checkpoint(example)
    report = dataclasses.replace(report, source="tiny_model.safetensors")
    golden("scan_tiny_model.txt", render(report, OutputFormat.table, color=False, width=120))


# --- bad input: one line on stderr, exit 3, no traceback ------------------------------------------------


def _truncated(tmp_path: Path) -> str:
    whole = Path(_write(tmp_path, {"w": torch.ones(1000)}, "whole.safetensors")).read_bytes()
    path = tmp_path / "truncated.safetensors"
    path.write_bytes(whole[: len(whole) // 2])
    return str(path)


def _file(tmp: Path, name: str, data: bytes) -> str:
    path = tmp / name
    path.write_bytes(data)
    return str(path)


def _zip(tmp: Path) -> str:
    path = tmp / "notes.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "not a checkpoint")
    return str(path)


BAD_INPUTS: dict[str, Callable[[Path], str]] = {
    "missing": lambda tmp: str(tmp / "nope.safetensors"),
    "empty file": lambda tmp: _file(tmp, "empty.pt", b""),
    "random bytes": lambda tmp: _file(tmp, "random.bin", os.urandom(4096)),
    "oversized header": lambda tmp: _file(tmp, "huge.safetensors", (10**12).to_bytes(8, "little") + b"{}"),
    "truncated safetensors": _truncated,
    "zip that is not a checkpoint": _zip,
    "corrupt zip": lambda tmp: _file(tmp, "corrupt.pt", b"PK\x03\x04" + bytes(range(256)) * 4),
    "empty folder": str,
}


@pytest.mark.parametrize("kind", list(BAD_INPUTS))
def test_bad_input_exits_3_with_one_line(cli, tmp_path, kind) -> None:
    target = BAD_INPUTS[kind](tmp_path)
    result = cli("scan-model", target, "-f", "json")
    assert result.exit_code == 3, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


# --- --plot ----------------------------------------------------------------------------------------------


def test_plot_without_matplotlib_is_a_usage_error(cli, clean, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    result = cli("scan-model", clean, "--plot", str(tmp_path / "p.png"))
    assert result.exit_code == 2
    assert "pip install 'dtypecheck[plot]'" in result.stderr
    assert not (tmp_path / "p.png").exists()


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib (extra 'plot') not installed")
def test_plot_writes_a_png(cli, example, tmp_path) -> None:
    out = tmp_path / "dist.png"
    result = cli("scan-model", example, "--plot", str(out), "-q", "-t", "fp16,bf16,e4m3")
    assert result.exit_code == 1
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_project_config_sets_defaults_and_the_command_line_wins(cli, warn_only, tmp_path) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.dtypecheck.scan-model]\ntargets = ["fp16", "e4m3"]\nfail-on = "warn"\n')
    result = cli("scan-model", warn_only, "--config", str(config), "-f", "json")
    assert (result.exit_code, result.json()["targets"]) == (1, ["float16", "float8_e4m3fn"])
    result = cli("scan-model", warn_only, "--config", str(config), "-f", "json", "--fail-on", "fail", "-t", "bf16")
    assert (result.exit_code, result.json()["targets"]) == (0, ["bfloat16"])


def test_summary_panel_lists_findings_that_matter(clean) -> None:
    report = scan_checkpoint(clean)
    findings = (
        Finding("missing-shard", "fail", "model-00003.safetensors missing"),
        Finding("pickle-global", "ok", "collections.OrderedDict"),
    )
    report = dataclasses.replace(report, findings=findings)
    text = render(report, OutputFormat.table, color=False, width=120)
    assert "fail missing-shard: model-00003.safetensors missing" in text
    assert "collections.OrderedDict" not in text
    assert "1 finding at level ok" in text


def test_live_model_with_a_meta_parameter(cli, tmp_path) -> None:
    script = tmp_path / "model.py"
    script.write_text(
        "import torch\n\n"
        "def build():\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, device='meta'))\n"
        "    with torch.no_grad():\n"
        "        model[0].weight.fill_(7e4)\n"
        "    return model\n"
    )
    result = cli("scan-model", f"{script}:build", "-f", "json")
    assert result.exit_code == 1
    tensors = {t["name"]: t for t in result.json()["tensors"]}
    assert tensors["0.weight"]["casts"]["float16"]["overflow"] == 12
    meta = tensors["1.weight"]
    assert (meta["min"], meta["casts"]["float16"]["overflow"], meta["level"]) == (None, None, "ok")
    assert meta["note"].startswith("no data")


def test_hostile_tensor_names_are_escaped_in_the_table_and_kept_in_json(cli, tmp_path: Path) -> None:
    clear_screen = "w\x1b[2J\x1b]0;pwned\x07"
    markup = "[bold]m[/]"
    bidi = "b\u202eetirw"
    ckpt = tmp_path / "evil.safetensors"
    save_file({clear_screen: torch.ones(2), markup: torch.ones(2), bidi: torch.ones(2)}, str(ckpt))
    table = cli("scan-model", str(ckpt), "--all")
    assert table.exit_code == 0
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in table.stdout
    assert "w\\x1b[2J\\x1b]0;pwned\\x07" in table.stdout
    assert "[bold]m[/]" in table.stdout  # shown as typed, not read as rich markup
    assert "b\\u202eetirw" in table.stdout
    names = {t["name"] for t in cli("scan-model", str(ckpt), "--format", "json").json()["tensors"]}
    assert names == {clear_screen, markup, bidi}
