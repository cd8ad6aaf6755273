"""The panel and tables for ``dtypecheck nan-trace``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from dtypecheck.nantrace.report import (
    DefaultDtype,
    DtypeError,
    Event,
    HistoryEntry,
    Location,
    NanTraceReport,
    Promotion,
    RaisedException,
    TensorArg,
)
from dtypecheck.render.cells import fmt_float
from dtypecheck.render.fit import fit_columns

CAUSE_TEXT = {
    "range_overflow": "range overflow: finite in float64, beyond what {dtype} holds",
    "invalid_math": "invalid math: non-finite even in float64 from finite inputs (log(0), 0/0, sqrt(-x), inf-inf)",
    "input": "input: came in with the data or a constant",
    "collective": "collective: arrived from another process (its birth is reported by that rank)",
}


CONSEQUENCE_TEXT = {
    "loss": "reached the loss (the tensor backward() was called on)",
    "parameter": "was written into a parameter",
    "optimizer_state": "was written into an optimizer state",
    "output": "was still held when the run ended",
    "unmasked": "was dropped without being masked",
    "scale_collapse": "GradScaler skipped step after step: its scale collapsed",
    "exception": "was in flight when the traced code raised (below)",
    "masked": "masked downstream (turned finite by where/masked_fill/nan_to_num or torch itself)",
    "skipped_step": "in a step GradScaler skipped",
}
_SHOWN_NOTES = 10


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
    rank = f", rank {event.rank}" if event.rank is not None else ""
    grid.add_row("op", f"{event.op}  ({event.phase}, step {event.step}, op #{event.op_index}{rank})")
    grid.add_row("module", _module(event.module))
    if event.grad_fn:
        grid.add_row("grad_fn", event.grad_fn)
    if event.location is not None:
        where = f"{event.location.file}:{event.location.line} in {event.location.function}"
        grid.add_row("line" if event.phase != "backward" else "forward line", where)
        if event.location.code:
            grid.add_row("", Text(event.location.code, style="cyan"))
    if event.worker is not None:
        grid.add_row("worker", f"DataLoader worker {event.worker}, batch {event.batch}")
    if event.arrival is not None:
        grid.add_row("arrived", f"{event.arrival.file}:{event.arrival.line} in {event.arrival.function}")
        if event.arrival.code:
            grid.add_row("", Text(event.arrival.code, style="cyan"))
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
    if event.consequence is not None:
        grid.add_row("then", CONSEQUENCE_TEXT[event.consequence])
    style = "bold red" if event.kind in ("nan", "inf") else "yellow"
    return Panel(grid, title=Text(title, style=style), title_align="left", expand=False)


class _OpRows:
    """A table of ops with every cell whole at the console's width (an op name or a line folded inside a word
    reads as two: ``aten.pow.T`` / ``ensor_Scalar``): the boxed table where it fits; else without its outer
    border, with a dtype every row shares moved into the title; else one block per op, its name on its own line
    and the other cells as ``name value`` after it."""

    def __init__(
        self, title: str, columns: tuple[str, ...], rows: Sequence[tuple[str, ...]], styles: Sequence[str | None]
    ) -> None:
        self.title, self.columns, self.rows, self.styles = title, columns, rows, styles

    def _table(self, compact: bool) -> Table:
        columns, rows, title = self.columns, self.rows, self.title
        dtypes = {row[columns.index("dtype")] for row in rows} if "dtype" in columns else set()
        if compact and len(dtypes) == 1:
            keep = [i for i, name in enumerate(columns) if name != "dtype"]
            columns, rows = tuple(columns[i] for i in keep), [tuple(row[i] for i in keep) for row in rows]
            title = f"{title}; {dtypes.pop()}"
        table = Table(title=title, title_justify="left", header_style="bold")
        if compact:
            table.show_edge, table.pad_edge, table.collapse_padding = False, False, True
        for name in columns:
            table.add_column(name, justify="right" if name in _RIGHT else "left", overflow="fold")
        for row, style in zip(rows, self.styles, strict=True):
            table.add_row(*row, style=style)
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for compact in (False, True):
            table = self._table(compact)
            if fit_columns(table, console, options):
                yield table
                return
        yield Text(self.title, style="italic")
        op = self.columns.index("op")
        for row, style in zip(self.rows, self.styles, strict=True):
            yield Text(row[op], style=style or "bold")
            rest = " · ".join(f"{name} {value}" for name, value in zip(self.columns, row, strict=True) if name != "op")
            yield Text("  " + rest, style=style or "")


_RIGHT = frozenset({"absmax", "/ max"})
"""Columns of numbers, right-aligned."""


def _history_table(history: tuple[HistoryEntry, ...]) -> _OpRows:
    rows = [
        (
            entry.op,
            entry.phase,
            _module(entry.module),
            entry.dtype,
            fmt_float(entry.absmax, 6),
            fmt_float(entry.ratio, 3),
            _where(entry.location),
        )
        for entry in history
    ]
    styles = ["yellow" if entry.ratio >= 0.5 else None for entry in history]
    columns = ("op", "phase", "module", "dtype", "absmax", "/ max", "line")
    return _OpRows("ops before it (absmax / dtype max)", columns, rows, styles)


def _warnings_table(warnings: tuple[Event, ...]) -> _OpRows:
    rows = [
        (
            w.kind,
            w.op,
            w.phase,
            _module(w.module),
            w.dtype,
            _ratio(w.absmax, w.limit),
            "?" if w.counts.subnormal is None else f"{w.counts.subnormal:,}",
            _where(w.location),
        )
        for w in warnings
    ]
    columns = ("kind", "op", "phase", "module", "dtype", "absmax / max", "subnormal", "line")
    return _OpRows("warnings", columns, rows, ["yellow"] * len(rows))


def _handled_table(handled: tuple[Event, ...]) -> _OpRows:
    more = len(handled) - _SHOWN_NOTES
    title = "handled non-finite values (notes, not failures)" + (f"; first {_SHOWN_NOTES} shown" if more > 0 else "")
    rows = [
        (e.kind, e.op, e.phase, _module(e.module), str(e.step), e.consequence or "-", _where(e.location))
        for e in handled[:_SHOWN_NOTES]
    ]
    columns = ("kind", "op", "phase", "module", "step", "handled", "line")
    return _OpRows(title, columns, rows, ["dim"] * len(rows))


def _scaler_lines(report: NanTraceReport) -> list[RenderableType]:
    out: list[RenderableType] = []
    if report.skipped_steps:
        steps = ", ".join(
            f"{s.step} ({fmt_float(s.scale_before, 6)} -> {fmt_float(s.scale_after, 6)})"
            for s in report.skipped_steps[:_SHOWN_NOTES]
        )
        more = len(report.skipped_steps) - _SHOWN_NOTES
        steps += f", and {more} more" if more > 0 else ""
        out.append(Text(f"GradScaler skipped {len(report.skipped_steps)} step(s) (scale before -> after): {steps}"))
    collapse = report.scale_collapse
    if collapse is not None:
        out.append(
            Text(
                f"GradScaler's scale collapsed: {collapse.steps} steps skipped in a row (steps {collapse.first_step}-"
                f"{collapse.last_step}, scale {fmt_float(collapse.scale_before, 6)} -> "
                f"{fmt_float(collapse.scale_after, 6)}; --max-skipped-steps {collapse.limit})",
                style="bold red",
            )
        )
    return out


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _inputs_table(inputs: tuple[TensorArg, ...], odd: tuple[str, ...] = ()) -> Table:
    table = Table(header_style="bold", box=None, padding=(0, 1))
    for name in ("input", "dtype", "shape", "parameter", "created"):
        table.add_column(name, overflow="fold")
    for arg in inputs:
        created = "-" if arg.created is None else f"{_where(arg.created)} ({arg.created_by})"
        table.add_row(
            arg.name,
            arg.dtype,
            _shape(arg.shape),
            arg.parameter or "-",
            created,
            style="bold red" if arg.name in odd else None,
        )
    return table


def _line_rows(grid: Table, label: str, location: Location | None) -> None:
    if location is None:
        return
    grid.add_row(label, f"{location.file}:{location.line} in {location.function}")
    if location.code:
        grid.add_row("", Text(location.code, style="cyan"))


def _default_dtype_line(default: DefaultDtype) -> RenderableType:
    if not default.changes:
        return Text(f"default dtype: {default.start}", style="dim")
    table = Table(title=f"default dtype: {default.start} at start", title_justify="left", header_style="bold")
    for name in ("from", "to", "call", "line"):
        table.add_column(name, overflow="fold")
    for change in default.changes:
        code = f"  {change.location.code}" if change.location is not None and change.location.code else ""
        table.add_row(change.old, change.new, change.call, f"{_where(change.location)}{code}")
    return table


def _promotion_panel(promotion: Promotion) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("op", f"{promotion.op}  ({promotion.phase}, step {promotion.step}, op #{promotion.op_index})")
    grid.add_row("module", _module(promotion.module))
    grid.add_row("dtypes", f"output {promotion.dtype} in a {promotion.dominant} program")
    _line_rows(grid, "line", promotion.location)
    _line_rows(grid, "float64 from", promotion.created)
    grid.add_row("inputs", _inputs_table(promotion.inputs))
    title = Text(f"float64 enters the {promotion.dominant} program (doubles memory and time)", style="yellow")
    return Panel(grid, title=title, title_align="left", expand=False)


def _dtype_error_panel(error: DtypeError) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("error", error.exception)
    grid.add_row("op", error.op or "- (raised before any op)")
    module = _module(error.module)
    grid.add_row("module", f"{module} ({error.module_type})" if error.module_type else module)
    _line_rows(grid, "line", error.location)
    grid.add_row("inputs", _inputs_table(error.inputs, error.odd))
    if error.expected is not None:
        grid.add_row("expected", error.expected)
    grid.add_row("fix", Text(error.fix, style="green"))
    return Panel(grid, title=Text("dtype mismatch", style="bold red"), title_align="left", expand=False)


def _exception_line(raised: RaisedException) -> Text:
    where = f" at {raised.location.file}:{raised.location.line}" if raised.location is not None else ""
    line = Text("then the traced code raised ", style="bold red")
    line.append(f"{raised.type}: {raised.message}", style="red")
    line.append(where)
    if raised.location is not None and raised.location.code:
        line.append(f"\n  {raised.location.code}", style="cyan")
    return line


def render_nantrace(report: NanTraceReport) -> list[RenderableType]:
    out: list[RenderableType] = []
    if report.default_dtype is not None and report.default_dtype.changes:
        out.append(_default_dtype_line(report.default_dtype))
    for promotion in report.promotions:
        out.append(_promotion_panel(promotion))
    for number, event in enumerate(report.events, start=1):
        title = (
            f"first non-finite value: {event.kind}" if number == 1 else f"non-finite producer {number}: {event.kind}"
        )
        out.append(_event_panel(event, title))
        if event.history:
            out.append(_history_table(event.history))
    if report.exception is not None:
        out.append(_exception_line(report.exception))
    out.extend(_scaler_lines(report))
    if report.handled:
        out.append(_handled_table(report.handled))
    if report.warnings:
        out.append(_warnings_table(report.warnings))
    for note in report.notes:
        out.append(Text(f"note: {note}", style="dim"))
    if report.dtype_error is not None:
        out.append(_dtype_error_panel(report.dtype_error))
    if report.default_dtype is not None and not report.default_dtype.changes:
        out.append(_default_dtype_line(report.default_dtype))
    settings = ", ".join(
        part
        for part in (
            f"autocast {report.autocast}" if report.autocast else "",
            f"device {report.device}" if report.device else "",
            f"{report.world_size} ranks" if report.world_size else "",
        )
        if part
    )
    if report.status == "error":
        summary = Text(f"dtype mismatch ended the run after {report.ops:,} ops", style="bold red")
    elif report.status == "clean":
        handled = f" ({len(report.handled)} handled: notes above)" if report.handled else ""
        mattered = " that mattered" if report.handled else ""
        summary = Text(
            f"clean: no NaN or Inf{mattered} in {report.ops:,} ops over {report.steps} step(s){handled}", style="green"
        )
    else:
        stopped = ", stopped at the first event (--keep-going collects all)" if report.stopped_early else ""
        summary = Text(
            f"non-finite values found after {report.ops:,} ops over {report.steps} step(s){stopped}", style="bold red"
        )
    if settings:
        summary.append(f" [{settings}]", style="dim")
    out.append(summary)
    return out
