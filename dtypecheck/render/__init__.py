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

__all__ = ["OutputFormat", "render", "render_scans", "write_atomically"]


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


def render_scans(reports: list[ScanReport], fmt: OutputFormat) -> str:
    """Several checkpoints' scans as one document, in a format whose ``several_inputs`` is ``merge``."""
    match fmt:
        case OutputFormat.json:
            from dtypecheck.render.json import render_json_of_scans

            return render_json_of_scans(reports)
        case OutputFormat.sarif:
            from dtypecheck.render.sarif import render_sarif_of_scans

            return render_sarif_of_scans(reports)
        case OutputFormat.table | OutputFormat.github:
            raise ValueError(f"{fmt.value} shows one report after another, not one document")
        case OutputFormat.html:
            raise ValueError("an HTML report holds one checkpoint")
        case _:
            assert_never(fmt)
    raise AssertionError(fmt)
