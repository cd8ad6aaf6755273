"""A rich progress bar on stderr, or nothing when quiet or when stderr is not a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from dtypecheck.progress import ProgressCallback, no_progress


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


@contextmanager
def progress_bar(description: str, *, quiet: bool, unit: str = "items") -> Iterator[ProgressCallback]:
    """Yield a progress callback; draws only on an interactive stderr."""
    if quiet or not sys.stderr.isatty():
        yield no_progress
        return
    columns = [TextColumn("[progress.description]{task.description}"), BarColumn()]
    columns += [DownloadColumn(binary_units=True)] if unit == "bytes" else [TextColumn("{task.completed}/{task.total}")]
    columns.append(TimeRemainingColumn())
    with Progress(*columns, console=stderr_console(), transient=True) as progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int, what: str) -> None:
            progress.update(task, completed=done, total=total, description=what or description)

        yield update
