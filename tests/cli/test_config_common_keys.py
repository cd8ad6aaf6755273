"""``format`` and ``quiet`` in ``[tool.dtypecheck]`` take effect for every command; the command line wins."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SCHEMAS = {
    "info": "dtypecheck.info/1",
    "scan-model": "dtypecheck.scan/1",
    "estimate-memory": "dtypecheck.memory/1",
    "nan-trace": "dtypecheck.nantrace/1",
}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder, the working directory, holding one input of each kind the commands read."""
    monkeypatch.chdir(tmp_path)
    torch.save({"layer.weight": torch.linspace(-2.0, 2.0, 16).reshape(4, 4)}, tmp_path / "model.pt")
    (tmp_path / "factory.py").write_text(
        "import torch\n\ndef factory():\n    return torch.nn.Linear(4, 2), torch.ones(3, 4)\n", encoding="utf-8"
    )
    (tmp_path / "train.py").write_text("import torch\nprint('step done')\nx = torch.ones(3) * 2\n", encoding="utf-8")
    return tmp_path


def _config(project: Path, body: str) -> None:
    (project / "pyproject.toml").write_text(f"[project]\nname = 'demo'\n\n{body}", encoding="utf-8")


# One invocation per command, each on its input in the project folder (no --format: the config decides).
COMMANDS = {
    "info": ("info", "fp16"),
    "scan-model": ("scan-model", "model.pt"),
    "estimate-memory": ("estimate-memory", "factory.py:factory", "-d", "fp32"),
    "nan-trace": ("nan-trace", "train.py"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_format_from_the_file_applies_to_every_command(cli, project: Path, command: str) -> None:
    _config(project, '[tool.dtypecheck]\nformat = "json"\n')
    result = cli(*COMMANDS[command])
    assert result.exit_code == 0, result.stderr
    assert result.json()["schema"] == SCHEMAS[command]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_format_on_the_command_line_wins(cli, project: Path, command: str) -> None:
    _config(project, '[tool.dtypecheck]\nformat = "json"\n')
    result = cli(*COMMANDS[command], "--format", "table")
    assert result.exit_code == 0, result.stderr
    (project / "pyproject.toml").unlink()
    assert result.stdout == cli(*COMMANDS[command]).stdout  # the table a project without config gets
    assert not result.stdout.lstrip().startswith("{")


def test_the_commands_own_section_beats_the_top_level(cli, project: Path) -> None:
    _config(project, '[tool.dtypecheck]\nformat = "json"\n\n[tool.dtypecheck.info]\nformat = "table"\n')
    assert not cli("info", "fp16").stdout.startswith("{")
    assert cli("scan-model", "model.pt").json()["schema"] == SCHEMAS["scan-model"]


def test_nan_trace_script_output_leaves_stdout_when_the_file_asks_for_json(cli, project: Path) -> None:
    # In script mode the script's own prints go to stderr whenever the document is not a table.
    _config(project, '[tool.dtypecheck.nan-trace]\nformat = "json"\n')
    result = cli("nan-trace", "train.py")
    assert result.json()["status"] == "clean"
    assert "step done" in result.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_quiet_from_the_file_silences_notes_and_no_quiet_wins(cli, project: Path, command: str) -> None:
    _config(project, "[tool.dtypecheck]\nquiet = true\n")
    out = project / "report.json"
    result = cli(*COMMANDS[command], "--format", "json", "--output", str(out))
    assert result.exit_code == 0
    assert "wrote" not in result.stderr
    assert out.is_file()
    loud = cli(*COMMANDS[command], "--format", "json", "--output", str(out), "--no-quiet")
    assert f"wrote {out}" in loud.stderr


def test_without_quiet_in_the_file_notes_are_shown(cli, project: Path) -> None:
    _config(project, '[tool.dtypecheck]\nfail-on = "fail"\n')
    out = project / "info.json"
    assert f"wrote {out}" in cli("info", "fp16", "-f", "json", "-o", str(out)).stderr
    assert cli("info", "fp16", "-f", "json", "-o", str(out), "-q").stderr == ""


def test_explicit_config_file_sets_the_format(cli, project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("settings") / "dtypecheck.toml"
    elsewhere.write_text('format = "json"\nquiet = true\n', encoding="utf-8")
    assert cli("info", "fp16").stdout.lstrip().startswith("┏")  # no pyproject in the project: the default
    for args in (("info", "fp16", "--config", str(elsewhere)), ("info", "--config", str(elsewhere), "fp16")):
        assert cli(*args).json()["schema"] == SCHEMAS["info"]


def test_a_bad_format_in_the_file_is_a_usage_error_naming_it(cli, project: Path) -> None:
    _config(project, '[tool.dtypecheck]\nformat = "xml"\n')
    result = cli("info", "fp16")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: ")
    assert "format: expected one of" in result.stderr
    assert result.stderr.count("\n") == 1
