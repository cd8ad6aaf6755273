"""What nan-trace tests share: a marked line's number, the float limits, and ``NanTrace`` (the ``nantrace`` fixture
of ``conftest.py``) that writes a script and runs ``nan-trace`` on it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import CliResult

ROOT = Path(__file__).resolve().parents[2]
FP16_MAX = 65504.0  # (2 - 2**-10) * 2**15, the IEEE half-precision maximum
FP32_MAX = (2 - 2**-23) * 2.0**127


def line_of(text: str, marker: str) -> int:
    """1-based line of the one line carrying ``# <marker>``, found independently of the tool."""
    hits = [n for n, line in enumerate(text.splitlines(), start=1) if line.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, hits
    return hits[0]


def subprocess_env() -> dict[str, str]:
    """This checkout first on the path of a child ``python -m dtypecheck``."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


class NanTrace:
    """``nantrace.write(name, source)`` puts a dedented script in the test's folder; ``nantrace.json(*args)`` runs
    ``nan-trace ... --format json`` through the CLI's real error boundary (the format before any ``--``: what
    follows is the script's); ``nantrace.failing(name, source, *args)`` does both for a run that must find a
    non-finite value (exit 1); ``nantrace.process(*args)`` runs ``python -m dtypecheck nan-trace`` as a child."""

    def __init__(self, cli: Callable[..., CliResult], folder: Path) -> None:
        self._cli = cli
        self.folder = folder

    def write(self, name: str, source: str) -> tuple[Path, str]:
        path = self.folder / name
        text = textwrap.dedent(source).lstrip("\n")
        path.write_text(text, encoding="utf-8")
        return path, text

    def run(self, *args: str) -> CliResult:
        return self._cli("nan-trace", *args)

    def json(self, *args: str) -> tuple[int, dict[str, Any], str]:
        split = args.index("--") if "--" in args else len(args)
        result = self._cli("nan-trace", *args[:split], "--format", "json", *args[split:])
        return result.exit_code, result.json(), result.stderr

    def failing(self, name: str, source: str, *args: str) -> tuple[dict[str, Any], dict[str, Any], str]:
        """Write ``source`` as ``name`` and trace it (``args`` as for ``json``), which must exit 1 (a non-finite
        value found): the report's first event, the report, and the script's text."""
        path, text = self.write(name, source)
        code, doc, stderr = self.json(str(path), *args)
        assert code == 1, stderr
        return doc["first"], doc, text

    def process(self, *args: str, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "dtypecheck", "nan-trace", *args]
        return subprocess.run(
            command, capture_output=True, text=True, env=subprocess_env(), timeout=timeout, check=False, cwd=cwd
        )
