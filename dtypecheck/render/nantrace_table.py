"""The panel and tables for ``dtypecheck nan-trace``."""

from __future__ import annotations

from pathlib import Path

from rich.console import RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from dtypecheck.nantrace.report import Event, HistoryEntry, Location, NanTraceReport
from dtypecheck.render.table import fmt_float, table_renderer

CAUSE_TEXT = {
    "range_overflow": "range overflow: finite in float64, beyond what {dtype} holds",
    "invalid_math": "invalid math: non-finite even in float64 from finite inputs (log(0), 0/0, sqrt(-x), inf-inf)",
    "input": "input: came in with the data or a constant",
}


def _module(module: str | None) -> str:
    if module is None:
        return "-"
    return module or "(model)"


def _where(location: Location | None) -> str:
    if location is None:
        return "-"
    return f"{Path(location.file).name}:{location.line}"


def _ratio(absmax: float | None, limit: float | None) -> str:
    if absmax is None or limit is None:
        return "-"
    return fmt_float(absmax / limit, 3)


def _event_panel(event: Event, title: str) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("op", f"{event.op}  ({event.phase}, step {event.step}, op #{event.op_index})")
    grid.add_row("module", _module(event.module))
    if event.grad_fn:
        grid.add_row("grad_fn", event.grad_fn)
    if event.location is not None:
        where = f"{event.location.file}:{event.location.line} in {event.location.function}"
        grid.add_row("line" if event.phase != "backward" else "forward line", where)
        if event.location.code:
            grid.add_row("", Text(event.location.code, style="cyan"))
    c = event.counts
    counts = ", ".join(
        f"{name} {'?' if value is None else f'{value:,}'}"
        for name, value in (("nan", c.nan), ("+inf", c.posinf), ("-inf", c.neginf), ("zeros", c.zeros))
    )
    grid.add_row("values", f"{event.dtype}: {counts}, subnormal {'?' if c.subnormal is None else f'{c.subnormal:,}'}")
    grid.add_row(
        "absmax",
        f"{fmt_float(event.absmax, 6)} (limit {fmt_float(event.limit, 6)}, ratio {_ratio(event.absmax, event.limit)})",
    )
    if event.cause is not None:
        grid.add_row("cause", CAUSE_TEXT[event.cause].format(dtype=event.dtype))
    style = "bold red" if event.kind in ("nan", "inf") else "yellow"
    return Panel(grid, title=Text(title, style=style), title_align="left", expand=False)


def _history_table(history: tuple[HistoryEntry, ...]) -> Table:
    table = Table(title="ops before it (absmax / dtype max)", title_justify="left", header_style="bold")
    for name in ("op", "phase", "module", "dtype", "absmax", "/ max", "line"):
        table.add_column(name, justify="right" if name in ("absmax", "/ max") else "left", overflow="fold")
    for entry in history:
        style = "yellow" if entry.ratio >= 0.5 else None
        table.add_row(
            entry.op,
            entry.phase,
            _module(entry.module),
            entry.dtype,
            fmt_float(entry.absmax, 6),
            fmt_float(entry.ratio, 3),
            _where(entry.location),
            style=style,
        )
    return table


def _warnings_table(warnings: tuple[Event, ...]) -> Table:
    table = Table(title="warnings", title_justify="left", header_style="bold")
    for name in ("kind", "op", "phase", "module", "dtype", "absmax / max", "subnormal", "line"):
        table.add_column(name, overflow="fold")
    for w in warnings:
        table.add_row(
            w.kind,
            w.op,
            w.phase,
            _module(w.module),
            w.dtype,
            _ratio(w.absmax, w.limit),
            "?" if w.counts.subnormal is None else f"{w.counts.subnormal:,}",
            _where(w.location),
            style="yellow",
        )
    return table


@table_renderer(NanTraceReport)
def render_nantrace(report: NanTraceReport) -> list[RenderableType]:
    out: list[RenderableType] = []
    for number, event in enumerate(report.events, start=1):
        title = (
            f"first non-finite value: {event.kind}" if number == 1 else f"non-finite producer {number}: {event.kind}"
        )
        out.append(_event_panel(event, title))
        if event.history:
            out.append(_history_table(event.history))
    if report.warnings:
        out.append(_warnings_table(report.warnings))
    for note in report.notes:
        out.append(Text(f"note: {note}", style="dim"))
    settings = ", ".join(
        part
        for part in (
            f"autocast {report.autocast}" if report.autocast else "",
            f"device {report.device}" if report.device else "",
        )
        if part
    )
    if report.status == "clean":
        summary = Text(f"clean: no NaN or Inf in {report.ops:,} ops over {report.steps} step(s)", style="green")
    else:
        stopped = ", stopped at the first event (--keep-going collects all)" if report.stopped_early else ""
        summary = Text(
            f"non-finite values found after {report.ops:,} ops over {report.steps} step(s){stopped}", style="bold red"
        )
    if settings:
        summary.append(f" [{settings}]", style="dim")
    out.append(summary)
    return out
