"""The output formats every command renders through, mapped exhaustively from ``dtypecheck.output.OutputFormat``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from dtypecheck.output import OutputFormat, assert_never

if TYPE_CHECKING:
    from typing import TypeAlias

    from dtypecheck.info import InfoReport
    from dtypecheck.info.names import DtypeList
    from dtypecheck.memory.report import MemoryReport
    from dtypecheck.nantrace.report import NanTraceReport
    from dtypecheck.scan.report import ScanReport

    Report: TypeAlias = DtypeList | InfoReport | MemoryReport | NanTraceReport | ScanReport
    """What a command renders; ``render.table.table_renderers`` has one entry per member (tests check it)."""

__all__ = ["OutputFormat", "render", "write_atomically"]


def render(
    report: Report, fmt: OutputFormat, *, color: bool = False, width: int | None = None, limit: int | None = None
) -> str:
    """Render a core result in the given format; the only dispatch from ``OutputFormat`` to a renderer. ``limit`` is
    a table setting: how many of its ranked rows (scan-model's tensors, worst first) a table shows; None for all."""
    match fmt:
        case OutputFormat.table:
            from dtypecheck.render.table import render_table

            return render_table(report, color=color, width=width, limit=limit)
        case OutputFormat.json:
            from dtypecheck.render.json import render_json

            return render_json(report)
        case OutputFormat.sarif:
            from dtypecheck.render.sarif import render_sarif

            return render_sarif(report)
        case OutputFormat.github:
            from dtypecheck.render.github import render_github

            return render_github(report)
        case OutputFormat.html:
            from dtypecheck.render.html import render_html

            return render_html(report)
        case _:
            assert_never(fmt)
    raise AssertionError(fmt)  # unreachable: tells ruff that assert_never does not return


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename, so no reader sees a partial file.

    A symlink is followed (the file it points to is replaced, the link stays). A device, a pipe or anything else
    that is not a regular file (``/dev/stdout``, ``/dev/null``, a FIFO), and any path under ``/dev`` or ``/proc``,
    is written through instead of being replaced by a regular file. Characters that cannot be encoded (a lone
    surrogate in a tensor name) are written as backslash escapes.
    """
    data = text.encode("utf-8", errors="backslashreplace")
    if _is_stream(path):
        with path.open("wb") as handle:
            handle.write(data)
        return
    path = path.resolve() if path.is_symlink() else path
    directory = path.parent if str(path.parent) else Path()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            # mkstemp makes the file private (0600); give it the mode a plain open() would, or keep the old one.
            os.fchmod(handle.fileno(), _mode_for(path))
            os.fsync(handle.fileno())
        Path(tmp_name).replace(path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _is_stream(path: Path) -> bool:
    """Whether ``path`` names a device, pipe or socket (through any symlinks) rather than a regular file."""
    import stat

    absolute = Path.cwd() / path  # as given, not resolved: /dev/stdout itself is a symlink
    if absolute.parts[1:2] in (("dev",), ("proc",)):
        return True
    try:
        mode = path.stat().st_mode
    except OSError:
        return False  # does not exist (or a dangling link): created as a regular file
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)
