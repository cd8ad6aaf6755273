"""Shared fixtures: run the CLI through its real error boundary, and compare against golden files."""

from __future__ import annotations

import os

# One torch thread per test process: ``make unit`` runs one xdist worker per core already, and two workers' OpenMP
# pools spinning on two cores made a tiny CNN's measured step take 13.5 CPU seconds instead of 3.5. Set before
# anything imports torch; the test's child processes inherit it; a value given by the caller is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dtypecheck.cli import main

GOLDEN_DIR = Path(__file__).parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--overwrite-golden", action="store_true", help="Rewrite tests/golden/* from current output.")


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (as ``make unit`` runs): tests sharing an expensive fixture of this suite go to one
    worker, so it is built once rather than once per worker; every other test is scheduled on its own.

    pytest-xdist's own loadgroup reads ``xdist_group`` marks through a node id that pytest 9 no longer lets it
    rewrite, so the groups are found here, from the test files (``tests/_xdist_groups.py``).
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests._xdist_groups import FixtureGroupScheduling

    return FixtureGroupScheduling(config, log)


@pytest.fixture(autouse=True)
def _no_inherited_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables are rendered at their default width unless a test sets ``COLUMNS`` itself: the runner's own
    environment (a terminal's, or xdist workers', which inherit ``COLUMNS=80``) must not change what is compared."""
    monkeypatch.delenv("COLUMNS", raising=False)


@dataclass(frozen=True)
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Call ``dtypecheck.cli.main`` (the same boundary the console script uses) and split its streams."""

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = main(list(args))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture(scope="session")
def command_documents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    """One ``--format json`` run of each command on its tiny input (``tests/_documents.py``), once per worker:
    command -> (the folder holding the inputs, the document)."""
    from tests._documents import EXIT_CODES, command_args, run_json

    folder = tmp_path_factory.mktemp("documents")
    found = {}
    for command, args in command_args(folder).items():
        code, document = run_json(args)
        assert code == EXIT_CODES[command], command
        found[command] = (folder, document)
    return found


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """Compare text with ``tests/golden/<name>``; ``pytest --overwrite-golden`` regenerates it."""
    overwrite = bool(request.config.getoption("--overwrite-golden"))

    def check(name: str, text: str) -> None:
        path = GOLDEN_DIR / name
        if overwrite or not path.exists():
            if not overwrite:
                pytest.fail(f"golden file {path} is missing; run pytest --overwrite-golden and review it")
            path.write_text(text, encoding="utf-8")
        assert text == path.read_text(encoding="utf-8"), f"output differs from {path}; review, then --overwrite-golden"

    return check


@dataclass(frozen=True)
class Run:
    """One command's run (``tests/_documents.py``) as the HTML tests read it."""

    folder: Path
    report: Any
    """The report object the CLI rendered."""
    document: dict[str, Any]
    """Its JSON document, as the CLI wrote it."""
    html: str
    """The same report object's HTML page."""


@pytest.fixture(scope="session")
def html_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """One ``--format json`` run of each command on its tiny input, keeping the report object the CLI rendered,
    so that its HTML page and its JSON document describe the same run."""
    from dtypecheck.render import OutputFormat, render
    from tests._documents import EXIT_CODES, command_args, run_json

    folder = tmp_path_factory.mktemp("html-runs")
    seen: list[Any] = []

    def spy(report: Any, fmt: OutputFormat, **kwargs: Any) -> str:
        seen.append(report)
        return render(report, fmt, **kwargs)

    found = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("dtypecheck.cli._app.render", spy)
        for command, args in command_args(folder).items():
            code, document = run_json(args)
            assert code == EXIT_CODES[command], command
            assert json.loads(render(seen[-1], OutputFormat.json)) == document
            found[command] = Run(folder, seen[-1], document, render(seen[-1], OutputFormat.html))
    return found
