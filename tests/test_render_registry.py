"""Every report a command returns renders in every output format, through renderers listed in one place."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import typer
from safetensors.torch import save_file

from dtypecheck.cli._app import app
from dtypecheck.render import OutputFormat, render
from dtypecheck.render.table import table_renderers
from tests.memory._fixtures import write_decoder_config


@pytest.fixture
def command_reports(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """One real run of every command, keeping the report object each one handed to ``render``."""
    seen: dict[str, object] = {}
    running: list[str] = []

    def spy(report, fmt, **kwargs):
        seen[running[-1]] = report
        return render(report, fmt, **kwargs)

    monkeypatch.setattr("dtypecheck.cli._app.render", spy)
    ckpt = tmp_path / "m.safetensors"
    save_file({"w": torch.tensor([1.0, 1e-10, float("nan")])}, str(ckpt))
    script = tmp_path / "step.py"
    script.write_text("import torch\nx = torch.ones(3)\ny = (x * 2).sum()\n")
    runs = {
        "info": ["info", "fp16"],
        "info --list": ["info", "--list"],
        "scan-model": ["scan-model", str(ckpt), "--quiet"],
        "estimate-memory": ["estimate-memory", str(write_decoder_config(tmp_path)), "--quiet"],
        "nan-trace": ["nan-trace", str(script), "--quiet"],
    }
    for command, args in runs.items():
        running.append(command)
        result = cli(*args, "--format", "json")
        assert result.exit_code in (0, 1), result.stderr
    return seen


def test_every_command_is_covered_here() -> None:
    names = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert names == {"info", "scan-model", "estimate-memory", "nan-trace"}


def test_every_report_type_a_command_returns_has_exactly_one_table_renderer(command_reports) -> None:
    assert set(command_reports) == {"info", "info --list", "scan-model", "estimate-memory", "nan-trace"}
    assert {type(r) for r in command_reports.values()} == set(table_renderers())


@pytest.mark.parametrize("fmt", list(OutputFormat))
def test_every_output_format_renders_every_report(command_reports, fmt: OutputFormat) -> None:
    for command, report in command_reports.items():
        text = render(report, fmt, width=120)
        assert isinstance(text, str)
        if fmt in (OutputFormat.table, OutputFormat.json, OutputFormat.sarif):
            assert text.strip(), (command, fmt)
    # The scan had a NaN and an underflow: every finding format says so.
    scan = command_reports["scan-model"]
    assert "DTC101" in render(scan, OutputFormat.sarif) + render(scan, OutputFormat.github)
