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
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", width)
    monkeypatch.setattr(typer.rich_utils, "FORCE_TERMINAL", False)
    result = CliRunner().invoke(app, [name, "--help"], env={"NO_COLOR": "1"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _blocks(text: str) -> dict[str, str]:
    """Each option's rows of the rendered table, keyed by its long name, joined into one line."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        body = line.strip().strip("│").rstrip()
        opening = re.match(r"^\s(--[a-z0-9-]+…?)", body)
        if opening:
            current = blocks.setdefault(opening.group(1), [])
        elif line.startswith(("╰", "╭")):
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
        if shown_default is None:
            problems.append(f"{long_name}: no [default: ...] in {block!r}")
        elif "…" in shown_default.group(1):
            problems.append(f"{long_name}: its default is cut short in {block!r}")
        if re.search(r"\w \.(\s|$)", block):
            problems.append(f"{long_name}: a default was cut out of {block!r}")
    assert problems == [], f"{name} --help at {width} columns:\n" + "\n".join(problems)
