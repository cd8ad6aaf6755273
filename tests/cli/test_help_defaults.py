"""Every option of every command says, in ``--help``, what it does when not given: a default or its meaning."""

from __future__ import annotations

import re

import pytest
import typer.core
import typer.main
import typer.rich_utils
from typer.testing import CliRunner

from dtypecheck.cli import app

_COMMAND = typer.main.get_command(app)
_COMMANDS = sorted(_COMMAND.commands)  # type: ignore[attr-defined]
_SKIPPED = {"help"}  # --help is click's own


def _options(name: str) -> list[typer.core.TyperOption]:
    command = _COMMAND.commands[name]  # type: ignore[attr-defined]
    return [p for p in command.params if isinstance(p, typer.core.TyperOption) and p.name not in _SKIPPED]


def _help(name: str, width: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", str(width))  # click's plain layout, used where rich's table would not fit
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", width)
    monkeypatch.setattr(typer.rich_utils, "FORCE_TERMINAL", False)
    result = CliRunner().invoke(app, [name, "--help"], env={"NO_COLOR": "1"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _blocks(text: str) -> dict[str, str]:
    """Each option's rows of the rendered help, keyed by its long name, joined into one line: rich's table
    (``│ --name ...``) or, where that would not fit, click's plain layout (``  -f, --name ...``)."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        body = line.strip().strip("│").rstrip()
        opening = re.match(r"^\s(--[a-z0-9-]+…?)", body) or re.match(r"^  (?:-[a-zA-Z], )?(--[a-z0-9-]+)", line)
        if opening:
            current = blocks.setdefault(opening.group(1), [])
        elif line.startswith(("╰", "╭")) or re.match(r"^[^\s│]", line):
            current = None
        if current is not None:
            current.append(body)
    return {name: " ".join(" ".join(rows).split()) for name, rows in blocks.items()}


def test_the_commands_are_walked() -> None:
    assert _COMMANDS == ["estimate-memory", "info", "nan-trace", "scan-model"]
    assert sum(len(_options(name)) for name in _COMMANDS) > 60


@pytest.mark.parametrize("name", _COMMANDS)
def test_no_help_text_holds_markup_that_rich_would_swallow(name: str) -> None:
    # "[default: 1]" in a help text is a rich style tag: rich drops it and leaves "... per step ." behind.
    swallowed = {opt.opts[-1]: opt.help for opt in _options(name) if re.search(r"(?<!\\)\[[a-zA-Z/]", opt.help or "")}
    assert swallowed == {}


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("name", _COMMANDS)
def test_every_option_shows_its_default(name: str, width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _blocks(_help(name, width, monkeypatch))
    problems = []
    for option in _options(name):
        long_name = next(o for o in option.opts if o.startswith("--"))
        # A narrow table cuts a long name short with an ellipsis: "--keep-unquanti…".
        block = blocks.get(long_name) or next(
            (text for shown, text in blocks.items() if shown.endswith("…") and long_name.startswith(shown[:-1])), None
        )
        if block is None:
            problems.append(f"{long_name}: not shown")
            continue
        shown_default = re.search(r"\[default: ([^\]]*)\]", block)
        if len(re.findall(r"\[default:", block)) > 1:
            problems.append(f"{long_name}: more than one [default: ...] in {block!r}")
        if shown_default is None:
            problems.append(f"{long_name}: no [default: ...] in {block!r}")
        elif "…" in shown_default.group(1):
            problems.append(f"{long_name}: its default is cut short in {block!r}")
        if re.search(r"\w \.(\s|$)", block):
            problems.append(f"{long_name}: a default was cut out of {block!r}")
    assert problems == [], f"{name} --help at {width} columns:\n" + "\n".join(problems)


@pytest.mark.parametrize("width", [80, 100, 120, 200])
@pytest.mark.parametrize("name", _COMMANDS)
def test_no_help_text_is_cut_short(name: str, width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 80 columns rich's table cut option names and words with an ellipsis (``--keep-float32-sq…``,
    ``DTYPECHECK_TRACEB…``); there the help now takes click's plain layout, which wraps instead."""
    text = _help(name, width, monkeypatch)
    assert [line for line in text.splitlines() if "…" in line] == []
    long_names = {next(o for o in option.opts if o.startswith("--")) for option in _options(name)}
    assert long_names <= set(_blocks(text)), long_names - set(_blocks(text))
    assert "\\[" not in text  # the rich escape of "[default: ...]" never shows
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width


def test_a_command_description_is_wrapped_by_the_terminal_not_the_docstring(monkeypatch: pytest.MonkeyPatch) -> None:
    # The docstring's own line breaks ("... what each available device" / "measures, ...") were kept by rich.
    lines = _help("info", 200, monkeypatch).splitlines()
    assert [line.strip() for line in lines if "True limits" in line] == [
        "True limits from the bit layout, what torch.finfo says (and where it is wrong), what each available device "
        "measures, guidance for log/Adam/exp, and with --promote torch's type promotion explained."
    ]


def test_the_plain_layout_is_taken_only_where_the_table_would_be_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "╭─ Options" in _help("scan-model", 200, monkeypatch)
    narrow = _help("scan-model", 80, monkeypatch)
    assert "╭─ Options" not in narrow
    assert "  --keep-float32-sqnr DB  " in narrow
