"""``resolve_nantrace_options``: pure parsing, defaults written once, conflicts named by their flag."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from dtypecheck.cli.nantrace import NanTraceFlags, NanTraceOptions, resolve_nantrace_options
from dtypecheck.errors import UsageError
from dtypecheck.nantrace.options import RunSettings, TraceOptions
from dtypecheck.render import OutputFormat
from tests.conftest import CliResult


def _resolve(
    target: str, given: NanTraceFlags, script_args: list[str] | None = None, nproc: int | None = None
) -> NanTraceOptions:
    return resolve_nantrace_options(
        target, script_args, given, nproc=nproc, fmt=OutputFormat.json, output=None, quiet=True
    )


def test_defaults_come_from_the_options_dataclasses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no pyproject.toml above: nothing configured
    resolved = _resolve("train.py", NanTraceFlags())
    assert resolved.run == RunSettings(TraceOptions(), None, None, 3)
    assert (TraceOptions.history, TraceOptions.warn_frac, TraceOptions.max_skipped_steps) == (20, 0.5, 16)
    assert (resolved.path, resolved.factory, resolved.nproc, resolved.rank) == (Path("train.py"), None, None, None)


def test_given_flags_win_and_output_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    given = NanTraceFlags(steps=5, autocast="bf16", history=2, warn_frac=0.25, keep_going=True, max_skipped_steps=4)
    resolved = resolve_nantrace_options(
        "f.py:make", None, given, nproc=None, fmt=OutputFormat.json, output=Path("out.json"), quiet=True
    )
    assert resolved.run == RunSettings(TraceOptions(True, 2, 0.25, max_skipped_steps=4), "bfloat16", None, 5)
    assert resolved.factory == "make"
    # The script may chdir before the report is written: the file lands where the command was given.
    assert resolved.output == tmp_path / "out.json"


@pytest.mark.parametrize(
    ("target", "given", "script_args", "message"),
    [
        ("train.py", NanTraceFlags(steps=2), None, "--steps applies to file.py:factory"),
        ("f.py:make", NanTraceFlags(), ["--lr", "1"], "script arguments after '--' apply to scripts"),
        ("train.py", NanTraceFlags(autocast="float64"), None, "--autocast takes float16 or bfloat16, not 'float64'"),
        ("train.py", NanTraceFlags(device="tpu:x"), None, "--device 'tpu:x'"),
    ],
)
def test_conflicts_are_usage_errors_naming_the_flag(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    given: NanTraceFlags,
    script_args: list[str] | None,
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=re.escape(message)):
        _resolve(target, given, script_args)


def test_nproc_rebuilds_only_the_flags_that_were_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n", encoding="utf-8")
    resolved = _resolve("train.py", NanTraceFlags(history=7, keep_going=True), ["--epochs", "2"], nproc=2)
    assert resolved.nproc == 2
    assert resolved.launch_arguments == (
        str(script),
        "--history=7",
        "--format=json",
        "--keep-going",
        "--quiet",
        "--",
        "--epochs",
        "2",
    )
    with pytest.raises(UsageError, match="--nproc runs a script"):
        _resolve("train.py:make", NanTraceFlags(), nproc=2)


def test_help_shows_the_defaults_of_the_options_dataclass(
    cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    result = cli("nan-trace", "--help")
    text = " ".join(result.stdout.split())
    assert f"forward+backward+SGD steps. [default: {RunSettings().steps}]" in text
    assert f"Ops shown before each event. [default: {TraceOptions.history}]" in text
    assert f"[default: {TraceOptions.warn_frac}]" in text
    assert f"[default: {TraceOptions.max_skipped_steps}]" in text
