"""The output formats every command renders through, mapped exhaustively from ``dtypecheck.output.OutputFormat``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtypecheck.output import OutputFormat, assert_never, write_atomically

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
        case _:
            assert_never(fmt)
    raise AssertionError(fmt)  # unreachable: tells ruff that assert_never does not return
