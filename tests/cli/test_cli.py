"""The command line: exit codes, the stdout/stderr split, JSON documents, atomic output, golden tables."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dtypecheck import __version__
from dtypecheck.cli import app
from dtypecheck.dtypes import lookup
from dtypecheck.info import describe_dtypes
from dtypecheck.render import OutputFormat, render
from dtypecheck.render.json import jsonable

ROOT = Path(__file__).resolve().parents[2]
CONTRACT_FLOAT_KEYS = (
    "name",
    "kind",
    "bits",
    "exponent_bits",
    "mantissa_bits",
    "exponent_bias",
    "eps",
    "max",
    "min",
    "smallest_normal",
    "smallest_subnormal",
    "resolution",
    "max_exponent",
    "min_exponent",
    "has_inf",
    "has_nan",
    "has_negative_zero",
    "torch_finfo",
    "mismatches",
    "devices",
)
CONTRACT_DEVICE_KEYS = ("eps", "max", "smallest_subnormal", "subnormals", "overflow_cast")


def test_info_json_follows_the_contract(cli) -> None:
    result = cli("info", "fp16", "e5m2fnuz", "int4", "--format", "json")
    assert result.exit_code == 0
    assert result.stderr == ""
    doc = result.json()
    assert doc["schema"] == "dtypecheck.info/1"
    assert doc["dtypecheck_version"] == __version__
    fp16, e5m2fnuz, int4 = doc["dtypes"]
    for key in CONTRACT_FLOAT_KEYS:
        assert key in fp16, key
    for key in CONTRACT_DEVICE_KEYS:
        assert key in fp16["devices"]["cpu"], key
    assert fp16["max"] == 65504.0
    assert fp16["smallest_subnormal"] == 2.0**-24
    assert e5m2fnuz["mismatches"] == [{"field": "eps", "torch": 0.125, "true": 0.25}]
    assert int4 == {
        "name": "int4",
        "kind": "int",
        "bits": 4,
        "min": -8,
        "max": 7,
        "aliases": ["i4"],
        "quantized": False,
        "packed": 1,
        "torch_iinfo": None,
        "mismatches": [],
    }


def test_json_floats_round_trip_and_nonfinite_become_strings() -> None:
    @dataclasses.dataclass(frozen=True)
    class Sample:
        values: tuple[float, ...]

    out = json.loads(json.dumps(jsonable(Sample((math.nan, math.inf, -math.inf, 0.1, 2.0**-149)))))
    assert out == {"values": ["nan", "inf", "-inf", 0.1, 2.0**-149]}


def test_table_is_default_and_stdout_only(cli) -> None:
    result = cli("info", "bf16")
    assert result.exit_code == 0
    assert "bfloat16" in result.stdout
    assert "2^-133" in result.stdout  # bfloat16's smallest subnormal
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("info", "fp61"), "unknown dtype 'fp61'; did you mean"),
        (("info", "--all", "fp16"), "--all and explicit dtype names conflict"),
        (("info", "--format", "xml"), "--format"),
        (("nosuch",), "nosuch"),
    ],
)
def test_usage_errors_exit_2_with_one_line(cli, args: tuple[str, ...], needle: str) -> None:
    result = cli(*args)
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ")
    assert needle in lines[0]


def test_output_file_is_written_whole_and_stdout_stays_empty(cli, tmp_path: Path) -> None:
    target = tmp_path / "info.json"
    result = cli("info", "fp16", "--format", "json", "--output", str(target), "--quiet")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert json.loads(target.read_text())["dtypes"][0]["name"] == "float16"
    assert [p.name for p in tmp_path.iterdir()] == ["info.json"]


def test_output_into_missing_folder_is_a_usage_error_without_partial_file(cli, tmp_path: Path) -> None:
    target = tmp_path / "missing" / "info.json"
    result = cli("info", "fp16", "--output", str(target))
    assert result.exit_code == 2
    assert f"the folder {target.parent} does not exist" in result.stderr
    assert result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not target.parent.exists()


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (("scan-model", "{checkpoint}"), "--plot"),
        (("estimate-memory", "{checkpoint}", "-m", "inference"), "--plot"),
    ],
)
def test_plot_into_missing_folder_is_a_usage_error_before_any_work(cli, tmp_path: Path, command, option) -> None:
    # As --output: checked before the scan or the trace starts, and said of the option, not of a temporary file.
    checkpoint = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(2, 2)}, str(checkpoint))
    target = tmp_path / "missing" / "step.png"
    result = cli(*(part.format(checkpoint=checkpoint) for part in command), option, str(target), "-q")
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert (
        line
        == f"error: Invalid value for '{option}': the folder {target.parent} does not exist (see 'dtypecheck --help')"
    )
    assert not target.parent.exists()


def test_a_failed_atomic_write_names_the_file_asked_for_and_leaves_nothing(tmp_path: Path) -> None:
    from dtypecheck.output import write_atomically

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x", encoding="utf-8")
    target = blocker / "report.png"
    with pytest.raises(NotADirectoryError) as raised:
        write_atomically(target, b"\x89PNG")
    assert raised.value.filename == str(target)  # not ".report.png.abc123.tmp"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-folder"]
    picture = tmp_path / "p.png"
    write_atomically(picture, bytes(range(256)))
    assert picture.read_bytes() == bytes(range(256))  # bytes are written as given
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-folder", "p.png"]


def test_version(cli) -> None:
    result = cli("--version")
    assert (result.exit_code, result.stdout.strip()) == (0, f"dtypecheck {__version__}")


def test_every_output_format_renders_a_report() -> None:
    # float8_e5m2fnuz: torch.finfo says eps 0.125 where its 2 mantissa bits give 2**-2: one DTC001 note.
    report = describe_dtypes([lookup("e5m2fnuz")], devices=["cpu"])
    texts = {fmt: render(report, fmt, width=120) for fmt in OutputFormat}
    assert set(texts) == set(OutputFormat)
    assert "float8_e5m2fnuz" in texts[OutputFormat.table]
    assert json.loads(texts[OutputFormat.json])["dtypes"][0]["mismatches"] == [
        {"field": "eps", "torch": 0.125, "true": 0.25}
    ]
    (result,) = json.loads(texts[OutputFormat.sarif])["runs"][0]["results"]
    assert (result["ruleId"], result["level"]) == ("DTC001", "note")
    assert texts[OutputFormat.github] == (
        "::notice title=DTC001 finfo-mismatch::torch.finfo(float8_e5m2fnuz).eps is 0.125, "
        "the format's true value is 0.25\n"
    )


def test_info_table_golden(golden) -> None:
    names = ["fp16", "bf16", "e4m3", "e5m2", "e5m2fnuz", "fp4"]
    report = describe_dtypes([lookup(n) for n in names], devices=["cpu"])
    report = dataclasses.replace(report, torch_version="(pinned)")
    golden("info_fp16_bf16_fp8.txt", render(report, OutputFormat.table, width=120))


def test_integer_table_golden(golden) -> None:
    names = ["int8", "uint8", "int4", "uint1", "int64", "bool", "quint4x2"]
    report = describe_dtypes([lookup(n) for n in names], devices=["cpu"])
    report = dataclasses.replace(report, torch_version="(pinned)")
    golden("info_integers.txt", render(report, OutputFormat.table, width=120))


def test_python_m_dtypecheck_help_smoke() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dtypecheck", "--help"], capture_output=True, text=True, check=False, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, "")
    for command in ("info", "scan-model", "estimate-memory", "nan-trace"):
        assert re.search(rf"\b{command}\b", done.stdout), command


def test_dtypecheck_alone_lists_the_commands_without_an_empty_error_line() -> None:
    # It printed the help, then "error:  (see 'dtypecheck --help')": click's NoArgsIsHelpError, whose message
    # is empty once rich has printed the help itself.
    done = subprocess.run([sys.executable, "-m", "dtypecheck"], capture_output=True, text=True, check=False, timeout=60)
    assert (done.returncode, done.stderr) == (2, "")
    for command in ("info", "scan-model", "estimate-memory", "nan-trace"):
        assert re.search(rf"\b{command}\b", done.stdout), command


def test_estimate_memory_console_smoke(tmp_path: Path) -> None:
    # The one whole-process run of estimate-memory (the other commands have theirs in tests/cli/test_user_code.py
    # and tests/nantrace/test_modes.py): the console entry's fast exit still delivers the whole document.
    from tests.memory._fixtures import write_decoder_config

    config = write_decoder_config(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "dtypecheck", "estimate-memory", str(config), "--format", "json", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (0, "")
    document = json.loads(done.stdout)
    assert document["schema"] == "dtypecheck.memory/1"
    assert document["model"]["source"] == str(config / "config.json")


def test_every_command_has_help_and_a_readme_section() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = [c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands]
    assert commands
    for command in app.registered_commands:
        name = command.name or (command.callback.__name__.replace("_", "-") if command.callback else "")
        assert command.callback is not None
        assert command.callback.__doc__, f"{name} has no help text"
        assert re.search(rf"^### `dtypecheck {re.escape(name)}\b", readme, re.MULTILINE), f"README lacks {name}"


def test_public_api_names_resolve_lazily() -> None:
    import dtypecheck

    for name in dtypecheck.__all__:
        assert getattr(dtypecheck, name) is not None, name
    with pytest.raises(AttributeError):
        dtypecheck.no_such_name  # noqa: B018


@pytest.mark.parametrize(
    ("command", "written", "flag"),
    [
        ("scan-model", "model.safetensors", "--output"),
        ("scan-model", "model.safetensors", "--plot"),
        ("scan-model", "model.safetensors", "--baseline"),
        ("estimate-memory", "model.safetensors", "--output"),
        ("estimate-memory", "factory.py", "--output"),
        ("nan-trace", "train.py", "--output"),
    ],
)
def test_a_written_file_that_is_the_input_is_refused_and_the_input_kept(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, written: str, flag: str
) -> None:
    """``scan-model model.safetensors -o model.safetensors`` replaced the checkpoint with its JSON report (exit 0);
    ``nan-trace train.py -o train.py`` the user's script."""
    import torch
    from safetensors.torch import save_file

    monkeypatch.chdir(tmp_path)
    save_file({"w": torch.ones(4, 4)}, "model.safetensors")
    Path("factory.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(4, 2), torch.ones(3, 4)\n")
    Path("train.py").write_text("import torch\n\ntorch.ones(2).sum()\n")
    before = {name: Path(name).read_bytes() for name in ("model.safetensors", "factory.py", "train.py")}
    target = {"nan-trace": "train.py", "estimate-memory": "model.safetensors", "scan-model": "model.safetensors"}
    source = "factory.py:make" if written == "factory.py" else target[command]
    extra = ["--update-baseline"] if flag == "--baseline" else ["--format", "json"]
    result = cli(command, source, flag, written, *extra)
    shown = "--update-baseline's baseline" if flag == "--baseline" else flag
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        f"error: {shown} {written} is the input {written}: writing there would replace it; name another file\n"
    )
    assert {name: Path(name).read_bytes() for name in before} == before


@pytest.mark.parametrize("width", [80, 100])
def test_info_tables_keep_every_cell_whole_at_80_columns(width: int) -> None:
    """At 80 columns ``info --all``'s integer table cut every dtype name to ``…`` (its two 26-character bound
    columns left no room) and five floats to a table folded values inside words (``(2.22e-1`` / ``6)``)."""
    names = ["fp64", "fp32", "bf16", "fp16", "e4m3", "e5m2", "fp4", "int8", "int64", "uint64", "int4", "bool"]
    report = describe_dtypes([lookup(n) for n in names], devices=["cpu"])
    text = render(report, OutputFormat.table, width=width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert [line for line in lines if "…" in line] == []
    words = set(text.replace("│", " ").replace("┃", " ").split())
    assert {"float8_e4m3fn", "float4_e2m1fn_x2", "uint64", "(2.22e-16)", "1.79769e+308", "2^-1074"} <= words
    assert {"2^64-1", "-2^63"} <= words or {"18,446,744,073,709,551,615", "-9,223,372,036,854,775,808"} <= words
