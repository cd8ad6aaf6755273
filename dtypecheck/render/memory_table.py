"""The table for ``dtypecheck estimate-memory``: one row per configuration, a stacked bar of its terms."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement as RichMeasurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from dtypecheck.memory.report import Measurement, MemoryEstimate, MemoryReport, ModuleBreakdown
from dtypecheck.render.cells import fmt_bytes, fmt_count

BAR_WIDTH = 10
# (letter, style, label): letters keep the bar readable without colour.
SEGMENTS = (
    ("W", "blue", "weights+buffers"),
    ("G", "magenta", "gradients"),
    ("O", "yellow", "optimizer states+master"),
    ("A", "green", "activations"),
    ("K", "cyan", "KV cache"),
)


def _terms(row: MemoryEstimate) -> tuple[int, ...]:
    b = row.bytes
    return (
        b.parameters + b.buffers + b.gathered_parameters,
        b.gradients,
        b.optimizer_states + b.master_weights,
        b.activations or 0,
        b.kv_cache,
    )


def stacked_bar(terms: tuple[int, ...], width: int = BAR_WIDTH) -> Text:
    """Each term's share of their sum, in whole cells (largest remainders), so the dominant term stands out."""
    total = sum(terms)
    bar = Text()
    if total <= 0:
        return bar
    exact = [width * t / total for t in terms]
    cells = [int(e) for e in exact]
    order = sorted(range(len(terms)), key=lambda i: exact[i] - cells[i], reverse=True)
    for i in order[: width - sum(cells)]:
        cells[i] += 1
    for (letter, style, _), count in zip(SEGMENTS, cells, strict=True):
        bar.append(letter * count, style=style)
    return bar


_SEARCH_BOUNDS = {"search-limit", "timeout", "fixed-batch"}


def _limit(value: int | None, bound: str | None = None) -> str:
    """A fit limit; ``>= N`` when the search stopped before the answer, ``N (field)`` at the model's own limit."""
    if value is None:
        return "-"
    if bound in ("search-limit", "timeout"):
        return f">= {value:,}"
    if bound == "fixed-batch":
        return f"{value:,} (fixed)"
    return f"{value:,} (limit)" if bound else f"{value:,}"


def _batch_limit(row: MemoryEstimate) -> tuple[int | None, str | None]:
    return (row.fit.max_batch_size, row.fit.max_batch_size_bound) if row.fit else (None, None)


def _measured(measured: dict[tuple[str, str, str], Measurement], row: MemoryEstimate) -> str:
    m = measured.get((row.dtype, row.mode, row.precision))
    return "-" if m is None else f"{fmt_bytes(m.peak_bytes)} {m.error:+.1%}"


def _dash_if_zero(count: int | None) -> str:
    return "-" if not count else fmt_bytes(count)


def render_memory(report: MemoryReport) -> list[RenderableType]:
    model = report.model
    out: list[RenderableType] = []
    header = Text()
    header.append(f"{model.source}", style="bold")
    built = f" as {model.model_class}" if model.kind == "config" and model.model_class else ""
    header.append(f"  ({model.kind}, {model.architecture or 'unknown'}{built})\n")
    header.append(
        f"parameters {fmt_count(model.parameters)} ({fmt_count(model.trainable_parameters)} trainable), "
        f"buffers {fmt_count(model.buffers)} ({fmt_bytes(model.buffer_bytes)})"
    )
    if report.estimates:
        first = report.estimates[0]
        shape = f"batch {first.batch_size}" if first.batch_size is not None else "no inputs"
        if first.seq_len is not None:
            shape += f" x {first.seq_len} tokens"
        sharding = first.sharding
        where = (
            "one device" if sharding.strategy == "none" else f"per device, {sharding.strategy} x {sharding.world_size}"
        )
        header.append(f"\n{shape}; {where}")
        trained = [r for r in report.estimates if r.mode == "training"]
        if trained:
            header.append(f"; optimizer {trained[0].optimizer}")
            if trained[0].optimizer_impl:
                header.append(f" ({trained[0].optimizer_impl})")
            header.append(f"; loss {model.loss}")
            if trained[0].checkpointing:
                header.append("; activation checkpointing")
        if first.fit is not None:
            f = first.fit
            header.append(
                f"\nfit {f.device}: {fmt_bytes(f.capacity_bytes)} - reserve {fmt_bytes(f.reserve_bytes)} = "
                f"{fmt_bytes(f.usable_bytes)} usable"
            )
    out.append(header)

    rows = report.estimates
    columns = [
        ("weights", lambda r: fmt_bytes(r.bytes.parameters + r.bytes.buffers), True),
        ("grads", lambda r: _dash_if_zero(r.bytes.gradients), any(r.bytes.gradients for r in rows)),
        ("optim", lambda r: _dash_if_zero(r.bytes.optimizer_states), any(r.bytes.optimizer_states for r in rows)),
        ("master", lambda r: _dash_if_zero(r.bytes.master_weights), any(r.bytes.master_weights for r in rows)),
        ("activ", lambda r: "n/a" if r.bytes.activations is None else fmt_bytes(r.bytes.activations), True),
        ("KV", lambda r: _dash_if_zero(r.bytes.kv_cache), any(r.bytes.kv_cache for r in rows)),
        ("total", lambda r: fmt_bytes(r.bytes.total), True),
    ]
    measured: dict[tuple[str, str, str], Measurement] = {(m.dtype, m.mode, m.precision): m for m in report.measurements}
    if measured:
        columns.append(("measured", lambda r: _measured(measured, r), True))
    if any(r.fit is not None for r in rows):
        columns.append(("fits", lambda r: "yes" if r.fit and r.fit.fits else "no", True))
        columns.append(("max batch", lambda r: _limit(*_batch_limit(r)), True))
        columns.append(
            (
                "max seq",
                lambda r: _limit(r.fit.max_seq_len, r.fit.max_seq_len_bound) if r.fit else "-",
                any(r.fit is not None and r.fit.max_seq_len is not None for r in rows),
            )
        )
    shown: list[tuple[str, Callable[[MemoryEstimate], str]]] = [(n, f) for n, f, keep in columns if keep]
    # The fit and measured columns take the bar's room: a row of a table this wide would wrap.
    with_bar = not measured and all(r.fit is None for r in rows)

    notes = Text()
    if report.measured is not None and not report.measurements:
        m = report.measured
        notes.append(
            f"measured on {m.device} ({m.referee}), {m.dtype} {m.mode} {m.precision}: peak {fmt_bytes(m.peak_bytes)}, "
            f"estimate {fmt_bytes(m.estimate_bytes)}, error {m.error:+.1%}\n",
            style="bold",
        )
    if report.measurements:
        m = report.measurements[0]
        notes.append(f"measured: one real step per row on {m.device} ({m.referee}), error against the total\n")
    for note in model.notes:
        notes.append(f"note: {note}\n", style="dim")
    limits = sorted({r.fit.max_seq_len_bound for r in rows if r.fit and r.fit.max_seq_len_bound} - _SEARCH_BOUNDS)
    for limit in limits:
        notes.append(f"max seq (limit): the model's own {limit}\n", style="dim")
    for skipped in report.skipped:
        notes.append(f"skipped: {skipped}\n", style="dim")
    out.append(_Rows(rows, shown, with_bar, notes))
    for breakdown in report.modules:
        out.extend(render_breakdown(breakdown))
    return out


class _Rows:
    """The estimates' table, its notes and its legend, laid out for the width the console gives them: the bar
    gives way first, then the table becomes one block per row. Left to rich, a table wider than the line cut every
    cell short at 80 columns (``32.02 …``, ``tra…``, ``precisi…``; with --fit also ``bfloa…`` and ``max ba…``)."""

    def __init__(
        self,
        rows: Sequence[MemoryEstimate],
        shown: list[tuple[str, Callable[[MemoryEstimate], str]]],
        with_bar: bool,
        notes: Text,
    ) -> None:
        self.rows, self.shown, self.with_bar, self.notes = rows, shown, with_bar, notes

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        with_bar = self.with_bar
        table = self._table(with_bar)
        unbounded = options.update_width(10_000)
        if with_bar and RichMeasurement.get(console, unbounded, table).maximum > options.max_width:
            with_bar = False
            table = self._table(with_bar)
        if RichMeasurement.get(console, unbounded, table).maximum > options.max_width:
            yield self._blocks()
        else:
            yield table
        yield self.notes + _legend(with_bar)

    def _table(self, with_bar: bool) -> Table:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=0)
        table.add_column("dtype", no_wrap=True)
        table.add_column("mode", no_wrap=True)
        table.add_column("precision", no_wrap=True)
        for name, _ in self.shown:
            table.add_column(name, justify="right", style="bold" if name == "total" else None, no_wrap=True)
        if with_bar:
            table.add_column("bar", no_wrap=True, min_width=BAR_WIDTH)
        for row in self.rows:
            bar = (stacked_bar(_terms(row)),) if with_bar else ()
            table.add_row(row.dtype, _mode(row), row.precision, *(cell(row) for _, cell in self.shown), *bar)
        return table

    def _blocks(self) -> Group:
        """One block per row where no table fits: its dtype, mode and precision, then each column's value."""
        blocks: list[RenderableType] = []
        for row in self.rows:
            blocks.append(Text(f"{row.dtype} {_mode(row)} {row.precision}", style="bold"))
            values = " · ".join(f"{name} {cell(row)}" for name, cell in self.shown)
            blocks.append(Padding(Text(values), (0, 0, 0, 2)))  # wrapped lines keep the indent
        return Group(*blocks)


def _mode(row: MemoryEstimate) -> str:
    return "train" if row.mode == "training" else "infer"


def _legend(with_bar: bool) -> Text:
    legend = ", ".join(f"{letter} {label}" for letter, _, label in SEGMENTS)
    text = Text("total is the peak of the step, not the sum of the columns", style="dim")
    if with_bar:
        text.append(f"; bar: {legend}", style="dim")
    return text


def render_breakdown(breakdown: ModuleBreakdown) -> list[RenderableType]:
    """One row's bytes by module (``--by-module``), with the peak moment under it."""
    mode = "train" if breakdown.mode == "training" else "infer"
    title = Text(f"\nby module (depth {breakdown.depth}): {breakdown.dtype} {mode} {breakdown.precision}", style="bold")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    table.add_column("module", no_wrap=True)
    for name in ("params", "weights", "grads", "optim", "activ at peak"):
        table.add_column(name, justify="right", no_wrap=True)
    training = breakdown.mode == "training"
    for m in breakdown.modules:
        table.add_row(
            m.module,
            fmt_count(m.parameters),
            _dash_if_zero(m.weight_bytes + m.buffer_bytes),
            _dash_if_zero(m.gradient_bytes) if training else "-",
            _dash_if_zero(m.optimizer_bytes) if training else "-",
            _dash_if_zero(m.activation_bytes),
        )
    p = breakdown.peak
    where = f" in {p.module}" if p.module else ""
    peak = Text(
        f"peak: op {p.index + 1:,} of {p.ops:,}, {p.op}{where} ({p.phase}): {fmt_bytes(p.activation_bytes)} of "
        f"activations and {fmt_bytes(p.gradient_bytes)} of gradients alive",
        style="dim",
    )
    return [title, table, peak]
