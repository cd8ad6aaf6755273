"""Run a Markdown document's examples as written: its files, its commands, and the output it shows for them.

A fenced block whose first line is a comment naming a file (``# train.py: ...``, ``# pyproject.toml``) is written
to that file. A ``console`` block holds ``$ command`` lines, each followed by the output the document shows for it
(stdout, then stderr); ``...`` on a line of its own stands for any lines, and a line ending in `` ...`` for any line
that starts with the text before it. ``$ dtypecheck ARGS`` runs the command
line in this process (``tests.conftest.cli``), ``$ python FILE`` runs a script in a fresh interpreter, and
``$ echo $?`` shows the exit code of the command before it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FILE_COMMENT = re.compile(r"^# ([\w./-]+\.(?:py|toml|yaml|json))\b")


@dataclass(frozen=True)
class Step:
    command: str
    expected: list[str]


def blocks(markdown: str) -> list[tuple[str, str]]:
    """(language, text) of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(markdown)]


def steps(console: str) -> list[Step]:
    found: list[Step] = []
    for line in console.splitlines():
        if line.startswith("$ "):
            found.append(Step(line[2:], []))
        elif found:
            found[-1].expected.append(line)
    return found


def _same(want: str, got: str) -> bool:
    return got.startswith(want[:-3]) if want.endswith(" ...") else want == got


def _same_lines(want: list[str], got: list[str]) -> bool:
    return len(want) == len(got) and all(_same(w, g) for w, g in zip(want, got, strict=True))


def matches(expected: list[str], actual: list[str]) -> bool:
    """``actual`` is ``expected``, line by line (trailing spaces aside), ``...`` standing for any lines."""
    want = [line.rstrip() for line in expected]
    got = [line.rstrip() for line in actual]
    while want and not want[-1]:
        want.pop()
    while got and not got[-1]:
        got.pop()
    if "..." not in want:
        return _same_lines(want, got)
    segments: list[list[str]] = [[]]
    for line in want:
        if line == "...":
            segments.append([])
        else:
            segments[-1].append(line)
    first, *middle, last = segments
    if len(got) < len(first) + len(last) or not _same_lines(first, got[: len(first)]):
        return False
    if last and not _same_lines(last, got[len(got) - len(last) :]):
        return False
    rest = got[len(first) : len(got) - len(last)]
    for segment in middle:
        at = next(
            (i for i in range(len(rest) - len(segment) + 1) if _same_lines(segment, rest[i : i + len(segment)])), None
        )
        if at is None:
            return False
        rest = rest[at + len(segment) :]
    return True


def run_document(markdown: str, folder: Path, cli: Callable[..., Any]) -> list[str]:
    """Write the files and run the commands of ``markdown`` in ``folder`` (the working directory, which the
    caller sets); returns the commands run. Every shown output must match (an AssertionError names the first
    that does not)."""
    ran: list[str] = []
    last_code: int | None = None
    for language, text in blocks(markdown):
        named = FILE_COMMENT.match(text)
        if language != "console" and named:
            target = folder / named.group(1)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            continue
        if language != "console":
            continue
        for step in steps(text):
            words = shlex.split(step.command)
            if words == ["echo", "$?"]:
                out = [str(last_code)]
            elif words[0] == "dtypecheck":
                result = cli(*words[1:])
                last_code = result.exit_code
                out = (result.stdout + result.stderr).splitlines()
            elif words[0] == "python":
                done = subprocess.run(
                    [sys.executable, *words[1:]], cwd=folder, capture_output=True, text=True, timeout=300, check=False
                )
                last_code = done.returncode
                out = (done.stdout + done.stderr).splitlines()
            else:
                raise AssertionError(f"the document runs {step.command!r}, which tests/_console.py cannot run")
            ran.append(step.command)
            assert matches(step.expected, out), (
                f"$ {step.command}\n--- the document shows:\n"
                + "\n".join(step.expected)
                + "\n--- it prints:\n"
                + "\n".join(out)
            )
    return ran
