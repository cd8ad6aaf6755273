"""Table rendering with rich: one explicit table of which function draws which report type."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from functools import cache

from rich.console import Console, RenderableType

Renderer = Callable[..., list[RenderableType]]
"""Called with the report; renderers of ranked rows (scan-model's tensors) also take ``limit``."""


@cache
def table_renderers() -> Mapping[type, Renderer]:
    """Report type -> the function that turns it into rich renderables; the one place renderers are listed.

    Built on first use so that rich, and the report modules (torch for memory), load only when a table is drawn.
    """
    from dtypecheck.info import InfoReport
    from dtypecheck.info.names import DtypeList
    from dtypecheck.memory.report import MemoryReport
    from dtypecheck.nantrace.report import NanTraceReport
    from dtypecheck.render.info_table import render_dtype_list, render_info
    from dtypecheck.render.memory_table import render_memory
    from dtypecheck.render.nantrace_table import render_nantrace
    from dtypecheck.render.scan_table import render_scan
    from dtypecheck.scan.report import ScanReport

    return {
        InfoReport: render_info,
        DtypeList: render_dtype_list,
        MemoryReport: render_memory,
        NanTraceReport: render_nantrace,
        ScanReport: render_scan,
    }


def render_table(report: object, *, color: bool = False, width: int | None = None, limit: int | None = None) -> str:
    """``limit``: how many rows a report whose rows are ranked shows (None: all)."""
    renderer = table_renderers().get(type(report))
    if renderer is None:
        raise TypeError(f"no table renderer for {type(report).__name__}")
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width or 120,
        force_terminal=color,
        no_color=not color,
        color_system="standard" if color else None,
        highlight=False,
        emoji=False,
        legacy_windows=False,
    )
    for renderable in renderer(report) if limit is None else renderer(report, limit):
        console.print(renderable)
    return buffer.getvalue()
