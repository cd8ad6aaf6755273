"""Every report a command returns renders in every output format, through renderers listed in one place."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
import typer
from safetensors.torch import save_file

from dtypecheck.cli._app import app
from dtypecheck.output import EVERY_FORMAT, REPORT_FORMATS, format_help
from dtypecheck.render import OutputFormat, render
from dtypecheck.render.table import table_renderers
from tests.memory._fixtures import write_decoder_config


@pytest.fixture(scope="module")
def command_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One real run of every command (once for the module), keeping the report object each handed to ``render``."""
    from tests._documents import run_json

    seen: dict[str, object] = {}
    running: list[str] = []

    def spy(report, fmt, **kwargs):
        seen[running[-1]] = report
        return render(report, fmt, **kwargs)

    folder = tmp_path_factory.mktemp("reports")
    ckpt = folder / "m.safetensors"
    save_file({"w": torch.tensor([1.0, 1e-10, float("nan")])}, str(ckpt))
    script = folder / "step.py"
    script.write_text("import torch\nx = torch.ones(3)\ny = (x * 2).sum()\n")
    runs = {
        "info": (["info", "fp16"], 0),
        "info --list": (["info", "--list"], 0),
        "scan-model": (["scan-model", str(ckpt), "--quiet"], 1),
        "estimate-memory": (["estimate-memory", str(write_decoder_config(folder)), "--quiet"], 0),
        "nan-trace": (["nan-trace", str(script), "--quiet"], 0),
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("dtypecheck.cli._app.render", spy)
        for command, (args, expected) in runs.items():
            running.append(command)
            code, _document = run_json(args)
            assert code == expected, command
    return seen


def test_every_command_is_covered_here() -> None:
    names = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert names == {"info", "scan-model", "estimate-memory", "nan-trace"}


def test_every_report_type_a_command_returns_has_exactly_one_table_renderer(command_reports) -> None:
    assert set(command_reports) == {"info", "info --list", "scan-model", "estimate-memory", "nan-trace"}
    assert {type(r) for r in command_reports.values()} == set(table_renderers())


@pytest.mark.parametrize("fmt", list(OutputFormat))
def test_every_output_format_renders_every_report(command_reports, fmt: OutputFormat) -> None:
    texts = {command: render(report, fmt, width=120) for command, report in command_reports.items()}
    scan = command_reports["scan-model"]
    # The scan's w = [1, 1e-10, nan] holds a NaN, and 1e-10 < 2**-25 flushes to zero in float16 (not in bfloat16):
    # the only findings of the five runs.
    if fmt is OutputFormat.table:
        assert all(text.strip() for text in texts.values())
        assert "float16" in texts["info"]
        assert "w" in texts["scan-model"].split()
    elif fmt is OutputFormat.json:
        for command, text in texts.items():
            assert json.loads(text)["schema"] == command_reports[command].SCHEMA, command
    elif fmt is OutputFormat.sarif:
        results = {
            command: [r["ruleId"] for r in json.loads(text)["runs"][0]["results"]] for command, text in texts.items()
        }
        assert results == {command: [] for command in texts} | {"scan-model": ["DTC101", "DTC103"]}
    elif fmt is OutputFormat.html:
        for command, text in texts.items():
            assert text.startswith("<!DOCTYPE html>"), command
            assert text.endswith("</html>\n"), command
        assert "<code>w</code>" in texts["scan-model"]
        assert '<section class="dtype" id="dtype-float16">' in texts["info"]
    else:
        assert fmt is OutputFormat.github
        where = f"file={scan.source.replace(':', '%3A').replace(',', '%2C')}"
        assert texts == dict.fromkeys(texts, "") | {
            "scan-model": f"::error {where},title=DTC101 nonfinite-values::w: 1 nan in float32\n"
            f"::warning {where},title=DTC103 cast-underflow::w: 1 of 3 values underflow in float16\n"
        }


# --- OutputFormat: one enum, every per-format decision made through it ----------------------------------------

ROOT = Path(__file__).resolve().parents[2]
FORMAT_NAMES = "|".join(fmt.value for fmt in OutputFormat)
COMMAND_FORMATS = {
    "info": EVERY_FORMAT,  # its SARIF log and annotations carry torch.finfo's mismatches (DTC001)
    "scan-model": EVERY_FORMAT,
    "nan-trace": EVERY_FORMAT,
    "estimate-memory": REPORT_FORMATS,  # a memory estimate has no findings
}


def test_every_format_has_every_decision() -> None:
    decisions = {fmt: (fmt.for_people, fmt.several_inputs, fmt.findings_only, fmt.summary) for fmt in OutputFormat}
    assert decisions == {
        OutputFormat.table: (True, "follow", False, "rich"),
        OutputFormat.json: (False, "merge", False, "one document"),
        OutputFormat.sarif: (False, "merge", True, "SARIF 2.1.0"),
        OutputFormat.github: (False, "follow", True, "annotations"),
        OutputFormat.html: (False, "refuse", False, "one self-contained page"),
    }
    assert [str(fmt) for fmt in OutputFormat] == ["table", "json", "sarif", "github", "html"]


def test_config_help_and_docs_read_the_enum() -> None:
    from dtypecheck.config import validate
    from dtypecheck.errors import UsageError

    for fmt in OutputFormat:
        assert validate({"format": fmt.value}, "pyproject.toml").get("info", "format") == fmt.value
    with pytest.raises(UsageError) as refused:
        validate({"format": "xml"}, "pyproject.toml")
    assert refused.value.message() == (
        "pyproject.toml: [tool.dtypecheck] format: expected one of 'table', 'json', 'sarif', 'github', 'html', "
        "got 'xml'"
    )
    assert format_help() == (
        "table (rich), json (one document), sarif (SARIF 2.1.0), github (annotations) "
        "or html (one self-contained page)."
    )
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name, command in commands.items():
        (option,) = [param for param in command.params if "--format" in param.opts]
        assert option.help == format_help(COMMAND_FORMATS[name]), name
        assert option.type_descriptor.annotation is OutputFormat, name  # the parser hands on the enum's members
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"| `--format {FORMAT_NAMES.replace('|', chr(92) + '|')}`, `-f` |" in readme
    contract = (ROOT / "docs" / "contract.md").read_text(encoding="utf-8")
    assert f"`--format {FORMAT_NAMES}`" in contract


def _format_decisions_outside_the_enum() -> list[str]:
    """Places in the package that decide by a format's name or member instead of asking ``OutputFormat``: a
    comparison with a format's name, or ``OutputFormat.<member>`` other than a parameter's default."""
    names = {fmt.value for fmt in OutputFormat}
    found = []
    exempt = {ROOT / "dtypecheck" / "output.py", ROOT / "dtypecheck" / "render" / "__init__.py"}
    for path in sorted((ROOT / "dtypecheck").rglob("*.py")):
        if path in exempt:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defaults = {
            id(default)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            for default in (*node.args.defaults, *node.args.kw_defaults)
            if default is not None
        }
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Compare):
                for operand in (node.left, *node.comparators):
                    items = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
                    if any(isinstance(i, ast.Constant) and i.value in names for i in items):
                        found.append(f"{where}: compares with a format name")
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "OutputFormat"
                and node.attr in names
                and id(node) not in defaults
            ):
                found.append(f"{where}: OutputFormat.{node.attr}")
    return found


def test_no_format_decision_bypasses_the_enum() -> None:
    # Adding a format then needs a decision only in dtypecheck/output.py, where mypy checks each match.
    assert _format_decisions_outside_the_enum() == []
