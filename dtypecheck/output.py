"""The output formats every command writes, and every per-format decision, in one enum.

The Typer choices (``cli._app.FormatOption``), the config's ``format`` key (``config.COMMON_KEYS``) and the help text
read ``OutputFormat``; the renderer registry (``render.render``) and every command that treats formats differently
ask one of the properties below. Each property decides with ``match`` and ``assert_never``, so a new member makes
mypy name every decision it lacks.
"""

from __future__ import annotations

import sys
from enum import Enum
from typing import Literal, NoReturn

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - exercised on Python 3.10 only

    class StrEnum(str, Enum):
        """``enum.StrEnum`` of Python 3.11: members are their values, also in ``str()`` and f-strings."""

        def __str__(self) -> str:
            return str(self.value)


def assert_never(value: NoReturn) -> NoReturn:
    """``typing.assert_never`` (Python 3.11): mypy fails where a ``match`` over an enum misses a member."""
    raise AssertionError(f"unhandled value: {value!r}")


class OutputFormat(StrEnum):
    """What ``--format`` (and ``format`` in ``[tool.dtypecheck]``) accepts."""

    table = "table"
    json = "json"
    sarif = "sarif"
    github = "github"

    @property
    def summary(self) -> str:
        """What the format is, in the words of ``--help`` and the README."""
        match self:
            case OutputFormat.table:
                return "rich"
            case OutputFormat.json:
                return "one document"
            case OutputFormat.sarif:
                return "SARIF 2.1.0"
            case OutputFormat.github:
                return "annotations"
            case _:
                assert_never(self)

    @property
    def for_people(self) -> bool:
        """A table for a terminal: coloured and as wide as it when stdout is one; everything else is read by a
        program, so stdout holds only it (a traced script's own prints go to stderr)."""
        match self:
            case OutputFormat.table:
                return True
            case OutputFormat.json | OutputFormat.sarif | OutputFormat.github:
                return False
            case _:
                assert_never(self)

    @property
    def several_inputs(self) -> Literal["follow", "merge", "refuse"]:
        """How one output holds several inputs (scan-model's checkpoints): ``follow``, one after another (tables,
        annotations); ``merge``, one document with an entry per input (a SARIF log: one run, one artifact each);
        ``refuse``, a document describes one input (no format now; JSON merges them into a
        ``dtypecheck.scan-set/1`` document)."""
        match self:
            case OutputFormat.table | OutputFormat.github:
                return "follow"
            case OutputFormat.sarif | OutputFormat.json:
                return "merge"
            case _:
                assert_never(self)

    @property
    def findings_only(self) -> bool:
        """Whether the format holds nothing but findings (SARIF results, annotations): a report without findings,
        such as a memory estimate, cannot be written in it."""
        match self:
            case OutputFormat.sarif | OutputFormat.github:
                return True
            case OutputFormat.table | OutputFormat.json:
                return False
            case _:
                assert_never(self)


def format_help() -> str:
    """``--format``'s help: every format with its summary, in the enum's order."""
    names = [f"{fmt.value} ({fmt.summary})" for fmt in OutputFormat]
    return ", ".join(names[:-1]) + " or " + names[-1] + "."
