"""The ``scan-model`` table: worst tensors first, one column per target, a log2-magnitude sparkline each."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from dtypecheck.dtypes import DtypeSpec, lookup
from dtypecheck.errors import UnknownDtypeError
from dtypecheck.render.cells import LEVEL_STYLE, fmt_bytes, fmt_float, printable
from dtypecheck.render.fit import fit_columns
from dtypecheck.scan.report import (
    BaselineComparison,
    CastCounts,
    Float8CastCounts,
    Log2Histogram,
    ScanReport,
    TensorScan,
    severity,
)

SPARK_WIDTH = 12
NAME_MIN_WIDTH = 16
TARGET_WIDTH = 16
SPARK_LEVELS = "▁▂▃▄▅▆▇█"


def _spec(name: str) -> DtypeSpec | None:
    try:
        return lookup(name)
    except UnknownDtypeError:
        return None


def _is_scaled(name: str) -> bool:
    spec = _spec(name)
    return spec is not None and spec.scaled


def _short(name: str) -> str:
    spec = _spec(name)
    return spec.short_name if spec is not None else name


def legend(report: ScanReport, axis: tuple[int, int], *, spark: bool = True) -> str:
    parts = ["ovf: overflows the target's max", "unf: flushed to zero", "sub: becomes subnormal (% of the values)"]
    if any(_is_scaled(t) for t in report.targets):
        parts.append("unf@amax: flushed to zero even after scaling the tensor to the target's max")
    casts = [c for t in report.tensors for c in t.casts.values()]
    if any(c.double_rounding for c in casts):
        parts.append("2xround: torch casts float64 via float32, rounding twice; these values differ from one rounding")
    if any(c.sqnr_db is not None for c in casts):
        parts.append("sqnr: signal-to-quantisation-noise ratio of the cast (higher is better)")
        if any(_is_scaled(t) for t in report.targets):
            parts.append("ch / mx: the same, scaled per output channel / per 32-value MX block (clip: beyond max)")
    if spark:
        parts.append(f"log2|x|: values per binade from 2^{axis[0]} to 2^{axis[1]} (log scale)")
    return " · ".join(parts)


def compact(count: int) -> str:
    """Counts as people read them in a table (the JSON keeps them exact): 987, 12.3k, 4.5M, 1.2G."""
    if count < 10_000:
        return str(count)
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    raise AssertionError("unreachable")


def percent(fraction: float) -> str:
    """A share of a tensor's values as people read it: 30%, 4.5%, 0.03%, <.01% (the JSON keeps it exact)."""
    share = 100 * fraction
    if share >= 10:
        return f"{share:.0f}%"
    if share >= 0.01:
        return f"{share:.2g}%"
    return "<.01%"


def _decibels(value: float | None) -> str:
    if value is None:
        return "-"
    return "exact" if math.isinf(value) else f"{value:.1f}dB"


def _cast_cell(cast: CastCounts, not_judged: str | None = None) -> Text:
    if cast.overflow is None:
        return Text("-", style="dim")
    counts = [("ovf", "overflow", cast.overflow), ("unf", "underflow", cast.underflow)]
    counts.append(("sub", "subnormal", cast.subnormal))
    if isinstance(cast, Float8CastCounts):
        counts.append(("unf@amax", "scaled_underflow", cast.scaled_underflow))
    parts = []
    for label, check, count in counts:
        if count:
            share = (cast.fraction or {}).get(check)
            parts.append(f"{compact(count)} {label}" + (f" {percent(share)}" if share is not None else ""))
    if cast.double_rounding:
        parts.append(f"{compact(cast.double_rounding)} 2xround")
    text = Text("not judged", style="dim") if not_judged else Text(cast.level, style=LEVEL_STYLE[cast.level])
    if parts:
        text.append("\n" + "\n".join(parts))
    precision = _precision_lines(cast)
    if precision:
        text.append("\n" + "\n".join(precision), style="cyan")
    return text


def _precision_lines(cast: CastCounts) -> list[str]:
    """``--precision``: SQNR of the cast, and of per-channel (ch) and MX block scaling with what they lose."""
    if cast.sqnr_db is None and cast.max_rel_error is None:
        return []
    lines = [f"sqnr {_decibels(cast.sqnr_db)}"]
    if isinstance(cast, Float8CastCounts):
        for label, scheme in (("ch", cast.per_channel), ("mx", cast.mx)):
            if scheme is None:
                continue
            losses = [f"{compact(n)} {what}" for n, what in ((scheme.underflow, "unf"), (scheme.overflow, "clip")) if n]
            lines.append(" ".join([label, _decibels(scheme.sqnr_db), *losses]))
    return lines


def _nonfinite_cell(tensor: TensorScan) -> Text:
    if tensor.nan is None:
        return Text("-", style="dim")
    infinite = (tensor.posinf or 0) + (tensor.neginf or 0)
    parts = [f"{compact(count)} {label}" for count, label in ((tensor.nan, "nan"), (infinite, "inf")) if count]
    return Text(" ".join(parts), style=LEVEL_STYLE["fail"]) if parts else Text("0", style="dim")


def _axis(histograms: Sequence[Log2Histogram]) -> tuple[int, int]:
    start = min(h.start for h in histograms)
    stop = max(h.start + len(h.counts) for h in histograms)
    return start, stop


def sparkline(histogram: Log2Histogram | None, start: int, stop: int, width: int = SPARK_WIDTH) -> str:
    """One character per ``ceil((stop - start) / width)`` binades on a shared axis; heights on a log scale so
    that a handful of outliers stay visible next to millions of ordinary values."""
    if histogram is None:
        return ""
    per_cell = max(1, math.ceil((stop - start) / width))
    cells = [0] * math.ceil((stop - start) / per_cell)
    for offset, count in enumerate(histogram.counts):
        cells[(histogram.start + offset - start) // per_cell] += count
    peak = math.log1p(max(cells))
    return "".join(
        " " if c == 0 else SPARK_LEVELS[min(len(SPARK_LEVELS) - 1, int(math.log1p(c) / peak * len(SPARK_LEVELS)))]
        for c in cells
    )


class DottedName:
    """A tensor name that wraps only after a ``.`` (``encoder.layer.5.`` / ``attention.output.LayerNorm.bias``),
    never inside a word: rich measures it as wide as the whole name at most and as ``min_width`` at least, and a
    part too long for the column it gets is shortened from the left with an ellipsis (``…ttention``)."""

    def __init__(self, name: str, style: str = "", min_width: int = NAME_MIN_WIDTH) -> None:
        self.name = printable(name)
        self.style = style
        self.min_width = min(len(self.name), min_width)

    def lines(self, width: int) -> list[str]:
        width = max(1, width)
        parts = [part + "." for part in self.name.split(".")]
        parts[-1] = parts[-1][:-1]
        lines: list[str] = []
        for part in parts:
            if lines and len(lines[-1]) + len(part) <= width:
                lines[-1] += part
            else:
                lines.append(part if len(part) <= width else "…" + part[len(part) - width + 1 :])
        return lines

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(self.min_width, len(self.name))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text("\n".join(self.lines(options.max_width)), style=self.style, no_wrap=True, overflow="crop")


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(s) for s in shape) if shape else "()"


SPARK_FROM_WIDTH = 100
"""Narrower consoles leave out the sparkline column (and its legend), and below ``MIN_ABS_FROM_WIDTH`` the
smallest-magnitude column, so that the names and the target cells keep their room."""
MIN_ABS_FROM_WIDTH = 90


class _TensorRows:
    """The tensor table and its legend, laid out for the width the console gives them."""

    def __init__(
        self, report: ScanReport, shown: Sequence[TensorScan], axis: tuple[int, int], hidden: Text | None
    ) -> None:
        self.report, self.shown, self.axis, self.hidden = report, shown, axis, hidden

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        spark, low = width >= SPARK_FROM_WIDTH, width >= MIN_ABS_FROM_WIDTH
        while True:
            table = _tensor_table(self.report, self.shown, self.axis, spark=spark, low=low)
            if fit_columns(table, console, options) or not (spark or low):
                break
            spark, low = (False, low) if spark else (False, False)  # the optional columns give way to the counts
        yield table
        if self.hidden is not None:
            yield self.hidden
        yield Text(legend(self.report, self.axis, spark=spark), style="dim")


def _tensor_table(
    report: ScanReport, shown: Sequence[TensorScan], axis: tuple[int, int], *, spark: bool = True, low: bool = True
) -> Table:
    start, stop = axis
    table = Table(header_style="bold", show_edge=False, pad_edge=False, collapse_padding=True)
    longest = max((len(printable(t.name)) for t in shown), default=6)
    table.add_column("tensor", min_width=min(longest, NAME_MIN_WIDTH))
    table.add_column("level", no_wrap=True)
    table.add_column("dtype shape", overflow="fold")
    table.add_column("absmax", justify="right", no_wrap=True)
    if low:
        table.add_column("min|x|>0", justify="right", no_wrap=True)
    table.add_column("nan/inf", no_wrap=True)
    for target in report.targets:
        table.add_column(_short(target), overflow="fold", max_width=TARGET_WIDTH)
    if spark:
        table.add_column("log2|x|", no_wrap=True, min_width=SPARK_WIDTH)
    for tensor in shown:
        stored = f"{printable(tensor.stored)}→" if tensor.stored else ""
        dtype = Text(f"{stored}{_short(tensor.dtype)} {_shape(tensor.shape)}")
        casts = [tensor.casts.get(target) for target in report.targets]
        cells: list[RenderableType] = [
            DottedName(tensor.name, LEVEL_STYLE[tensor.level] if tensor.level != "ok" else ""),
            Text(tensor.level, style=LEVEL_STYLE[tensor.level]),
            dtype,
            fmt_float(_as_float(tensor.absmax), 4),
        ]
        if low:
            cells.append(fmt_float(_as_float(tensor.min_abs_nonzero), 3))
        cells.append(_nonfinite_cell(tensor))
        cells += [_cast_cell(c, tensor.not_judged) if c is not None else Text("n/a", style="dim") for c in casts]
        if spark:
            cells.append(Text(sparkline(tensor.log2_histogram, start, stop), style="cyan"))
        table.add_row(*cells)
    return table


def _as_float(value: float | int | None) -> float | None:
    return None if value is None else float(value)


def _summary(report: ScanReport) -> Panel:
    s = report.summary
    line = Text()
    line.append(f"{s.tensors:,} tensors · {s.numel:,} elements · {fmt_bytes(s.bytes)} · ")
    for level in ("ok", "warn", "fail"):
        line.append(f"{getattr(s, level):,} {level}", style=LEVEL_STYLE[level])
        line.append(" · " if level != "fail" else "")
    lines: list[RenderableType] = [
        Text(f"{printable(report.source)} ({report.format}) → {', '.join(report.targets)}"),
        line,
    ]
    if s.census:
        total = max(sum(row.bytes for row in s.census.values()), 1)  # as stored: GGUF quantized bytes
        shares = ", ".join(
            f"{dtype} {row.tensors:,} ({fmt_bytes(row.bytes)}, {100 * row.bytes / total:.0f}%)"
            for dtype, row in s.census.items()
        )
        lines.append(Text(f"dtypes: {shares}", style="dim"))
    if s.aliases:
        lines.append(Text(f"{s.aliases:,} name(s) view another tensor's data (alias_of): counted once", style="dim"))
    if s.left_out:
        lines.append(Text(f"{s.left_out:,} tensor(s) left out by --include/--exclude/--weights-only", style="dim"))
    if s.not_judged:
        groups = ", ".join(f"{group.rule} {len(group.tensors):,}" for group in s.not_judged)
        total = sum(len(group.tensors) for group in s.not_judged)
        lines.append(
            Text(
                f"not judged ({total:,}): {groups}: kept in their own dtype by design (summary.not_judged)", style="dim"
            )
        )
    policy_notes = sum(len(t.policy) for t in report.tensors)
    if policy_notes:
        lines.append(
            Text(f"{policy_notes} check(s) passed by the project's policy (see 'policy' in JSON)", style="dim")
        )
    lines += _keep_float32(report)
    benign = 0
    for finding in report.findings:
        if finding.level == "ok":
            benign += 1
            continue
        where = f" [{finding.tensor}]" if finding.tensor and finding.tensor not in finding.detail else ""
        text = Text(f"{finding.level:<4} ", style=LEVEL_STYLE[finding.level])
        text.append(printable(f"{finding.kind}: {finding.detail}{where}"))
        lines.append(text)
    if benign:
        noun = "finding" if benign == 1 else "findings"
        lines.append(Text(f"{benign} {noun} at level ok (listed with --format json)", style="dim"))
    return Panel(
        Group(*lines),
        title=Text(f"scan: {s.level}", style=LEVEL_STYLE[s.level]),
        title_align="left",
        expand=False,
    )


KEEP_SHOWN = 10


def _keep_float32(report: ScanReport) -> list[RenderableType]:
    keep = report.summary.keep_float32
    if not keep:
        return []
    lines: list[RenderableType] = [
        Text(f"keep in float32 ({len(keep)}): no requested 16-bit or narrower target holds them", style="bold")
    ]
    for entry in keep[:KEEP_SHOWN]:
        line = Text("  ")
        line.append(printable(entry.tensor), style="bold")
        line.append(printable(f"  {entry.reason}"), style="dim")
        lines.append(line)
    if len(keep) > KEEP_SHOWN:
        lines.append(Text(f"  and {len(keep) - KEEP_SHOWN} more (summary.keep_float32 in JSON)", style="dim"))
    return lines


BASELINE_SHOWN = 20
_STATE_STYLE = {"new": "bold red", "worse": "red", "improved": "green", "fixed": "green", "unchanged": "dim"}


def _baseline(comparison: BaselineComparison) -> list[RenderableType]:
    counts = " · ".join(f"{n} {state}" for state, n in comparison.counts.items() if n)
    summary = counts or "no findings in either"
    out: list[RenderableType] = [
        Text(
            f"against baseline {printable(comparison.source)}: {summary} → gate {comparison.level}",
            style=LEVEL_STYLE.get(comparison.level, ""),
        )
    ]
    changed = [c for c in comparison.changes if c.state != "unchanged"]
    if changed:
        table = Table(header_style="bold", show_edge=False, pad_edge=False)
        for name in ("", "tensor", "check", "before", "now"):
            table.add_column(name, justify="right" if name in ("before", "now") else "left", overflow="fold")
        for change in changed[:BASELINE_SHOWN]:
            table.add_row(
                Text(change.state, style=_STATE_STYLE[change.state]),
                Text(printable(change.tensor or "-")),
                Text(printable(change.check)),
                f"{change.before:,}",
                f"{change.after:,}",
            )
        out.append(table)
        if len(changed) > BASELINE_SHOWN:
            out.append(Text(f"{len(changed) - BASELINE_SHOWN} more changes in the JSON report", style="dim"))
    return out


def _verdicts(report: ScanReport) -> Panel | None:
    """The answer first: one line per target from the summary's verdicts, with the worst tensor and the advice."""
    verdicts = report.summary.verdicts
    if not verdicts:
        return None
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for verdict in verdicts:
        counts = [f"{verdict.overflow:,} ovf", f"{verdict.underflow:,} unf"]
        if verdict.underflow:
            counts[-1] += f" ({percent(verdict.fraction_flushed)})"
        counts.append(f"{verdict.subnormal:,} sub")
        if verdict.scaled_underflow is not None:
            counts.append(f"{verdict.scaled_underflow:,} unf@amax")
        tensors = " ".join(f"{verdict.tensors.get(level, 0):,} {level}" for level in ("ok", "warn", "fail"))
        detail = Text(" · ".join(counts) + f" · tensors: {tensors}")
        if verdict.worst is not None:
            detail.append("\nworst: ", style="dim")
            detail.append(printable(verdict.worst))
        detail.append("\n→ " + printable(verdict.advice), style="bold")
        grid.add_row(_short(verdict.target), Text(verdict.level, style=LEVEL_STYLE[verdict.level]), detail)
    return Panel(grid, title=Text("verdict per target"), title_align="left", expand=False)


def render_scan(report: ScanReport, limit: int | None = None) -> list[RenderableType]:
    """The verdict per target, then the table, worst tensors first: ``limit`` of them (None: every tensor), then
    the summary."""
    ordered = sorted(report.tensors, key=severity)
    shown = ordered if limit is None else ordered[:limit]
    histograms = [t.log2_histogram for t in shown if t.log2_histogram is not None]
    start, stop = _axis(histograms) if histograms else (0, 1)
    out: list[RenderableType] = []
    verdicts = _verdicts(report)
    if verdicts is not None:
        out.append(verdicts)
    hidden = len(ordered) - len(shown)
    note = None
    if hidden:
        worst_hidden = ordered[len(shown)].level
        note = Text(f"{hidden} more tensors not shown (the next is {worst_hidden}); --all shows every tensor")
    if shown:
        out.append(_TensorRows(report, shown, (start, stop), note))
    elif note is not None:
        out.append(note)
    out.append(_summary(report))
    if report.baseline is not None:
        out += _baseline(report.baseline)
    return out
