"""Tables and the dynamic-range number line for ``dtypecheck info``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from dtypecheck.info.names import DtypeList
from dtypecheck.info.report import FloatInfo, InfoReport, IntInfo
from dtypecheck.promotion import Defaults, PromotionReport
from dtypecheck.render.cells import fmt_float, fmt_pow2
from dtypecheck.render.fit import fit_columns

COLUMNS_PER_TABLE = 5
LINE_WIDTH = 72
MIN_LINE_WIDTH = 24

Row = tuple[str, Callable[[FloatInfo], str]]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _device_cell(info: FloatInfo, key: str) -> str:
    """One line per device; the device name is left out when there is only one (the footer names it)."""
    single = len(info.devices) == 1
    parts = []
    for device, measured in info.devices.items():
        value = getattr(measured, key) if measured.supported else None
        if not measured.supported:
            text = "unsupported"
        elif isinstance(value, float):
            text = fmt_float(value, 6) if key == "max" else fmt_pow2(value)
        else:
            text = str(value)
        parts.append(text if single else f"{device}: {text}")
    return "\n".join(parts)


def _torch_cell(info: FloatInfo) -> str:
    if info.torch_finfo is None:
        return "raises"
    if not info.mismatches:
        return "agrees"
    return "\n".join(f"{m.field}={fmt_float(m.torch)} (true {fmt_float(m.true)})" for m in info.mismatches)


FLOAT_ROWS: tuple[Row, ...] = (
    ("aliases", lambda i: ", ".join(i.aliases[:3])),
    (
        "bits (sign/exp/mant)",
        lambda i: f"{i.bits} ({int(i.kind == 'float' and i.min < 0)}/{i.exponent_bits}/{i.mantissa_bits})",
    ),
    ("exponent bias", lambda i: str(i.exponent_bias)),
    ("eps (spacing at 1)", lambda i: fmt_pow2(i.eps)),
    ("max", lambda i: fmt_float(i.max, 6)),
    ("min", lambda i: fmt_float(i.min, 6)),
    ("smallest normal (tiny)", lambda i: fmt_pow2(i.smallest_normal)),
    ("smallest subnormal", lambda i: fmt_pow2(i.smallest_subnormal) if i.smallest_subnormal else "none"),
    ("resolution", lambda i: fmt_float(i.resolution)),
    ("exponent range", lambda i: f"[{i.min_exponent}, {i.max_exponent})"),
    ("inf / nan / -0", lambda i: f"{_yes(i.has_inf)} / {_yes(i.has_nan)} / {_yes(i.has_negative_zero)}"),
    ("torch.finfo", _torch_cell),
    ("measured eps", lambda i: _device_cell(i, "eps")),
    ("measured max", lambda i: _device_cell(i, "max")),
    ("measured smallest", lambda i: _device_cell(i, "smallest_subnormal")),
    ("subnormals", lambda i: _device_cell(i, "subnormals")),
    ("cast of 4*max gives", lambda i: _device_cell(i, "overflow_cast")),
    ("log clamp floor", lambda i: fmt_pow2(i.guidance.log_clamp_min)),
    ("Adam eps >=", lambda i: fmt_pow2(i.guidance.adam_eps_min)),
    ("eps=1e-8 becomes", lambda i: fmt_float(i.guidance.adam_eps_1e_8)),
    (
        "unit interval",
        lambda i: f"[{fmt_float(i.guidance.unit_interval[0], 3)}, {fmt_float(i.guidance.unit_interval[1], 6)}]",
    ),
    ("exp(x) overflows x >", lambda i: fmt_float(i.guidance.exp_max_arg, 6)),
    ("exp(x) is 0 for x <=", lambda i: fmt_float(i.guidance.exp_zero_below, 6)),
    ("exact integers to", lambda i: f"{i.guidance.max_exact_integer:,}"),
    ("decimal digits", lambda i: f"{i.guidance.decimal_digits:.2f}"),
)


class _FittedFloatTables:
    """The float dtypes side by side, ``COLUMNS_PER_TABLE`` to a table where they fit the line whole, fewer where
    they do not: five at 80 columns folded every value inside a word (``(2.22e-1`` / ``6)``, ``float8_e`` /
    ``4m3fn``)."""

    def __init__(self, floats: Sequence[FloatInfo]) -> None:
        self.floats = floats

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for per_table in range(COLUMNS_PER_TABLE, 0, -1):
            tables = _float_tables(self.floats, per_table)
            if all(fit_columns(table, console, options) for table in tables):
                break
        yield from tables


def _float_tables(floats: Sequence[FloatInfo], per_table: int = COLUMNS_PER_TABLE) -> list[Table]:
    tables: list[Table] = []
    for start in range(0, len(floats), per_table):
        chunk = floats[start : start + per_table]
        table = Table(show_lines=False, header_style="bold")
        table.add_column("", style="bold", no_wrap=True)
        for info in chunk:
            table.add_column(info.name, overflow="fold")
        for label, cell in FLOAT_ROWS:
            table.add_row(label, *(cell(info) for info in chunk))
        tables.append(table)
    return tables


def _findings(floats: Sequence[FloatInfo]) -> list[RenderableType]:
    lines: list[RenderableType] = []
    for info in floats:
        for m in info.mismatches:
            lines.append(
                Text(
                    f"! torch.finfo({info.name}).{m.field} is {fmt_float(m.torch)}, "
                    f"but the format's true value is {fmt_float(m.true)}",
                    style="yellow",
                )
            )
        for d in info.device_mismatches:
            lines.append(
                Text(
                    f"! {info.name} on {d.device}: {d.field} measured {d.measured}, {d.against} says {d.expected}",
                    style="yellow",
                )
            )
        lines += _missing_values(info)
        if info.note:
            lines.append(Text(f"  {info.name}: {info.note}", style="dim"))
    return lines


def _missing_values(info: FloatInfo) -> list[RenderableType]:
    """Say plainly when a format cannot hold 0 or negatives, and what each device's cast makes of them."""
    lines: list[RenderableType] = []
    for missing, what, key, value in (
        (not info.has_zero, "no zero: 0 cannot be stored", "zero_cast", "0.0"),
        (not info.has_negative, "no negative values: nothing below zero can be stored", "negative_cast", "-1.0"),
    ):
        if not missing:
            continue
        casts = [
            f"{device} casts {value} to {fmt_pow2(getattr(m, key))}"
            for device, m in info.devices.items()
            if m.supported and getattr(m, key) is not None
        ]
        lines.append(Text(f"! {info.name} has {what}" + (f" ({'; '.join(casts)})" if casts else ""), style="yellow"))
    return lines


def number_line(floats: Sequence[FloatInfo], width: int = LINE_WIDTH) -> list[RenderableType]:
    """One row per real float dtype on a shared log2 axis: subnormals light, normals solid."""
    reals = [i for i in floats if i.kind == "float"]
    if not reals:
        return []
    low = min(math.log2(i.smallest_subnormal or i.smallest_normal) for i in reals)
    high = max(math.log2(i.max) for i in reals)
    span = high - low or 1.0
    label_width = max(len(i.name) for i in reals) + 1

    def column(exponent: float) -> int:
        return min(width - 1, max(0, round((exponent - low) / span * (width - 1))))

    rows: list[RenderableType] = [Text("dynamic range, log2 scale (light: subnormals, solid: normals)", style="bold")]
    for info in reals:
        cells = [" "] * width
        styles = [""] * width
        start_sub = column(math.log2(info.smallest_subnormal or info.smallest_normal))
        start_norm = column(math.log2(info.smallest_normal))
        end = column(math.log2(info.max))
        for c in range(start_sub, start_norm):
            cells[c], styles[c] = "░", "cyan"
        for c in range(start_norm, end + 1):
            cells[c], styles[c] = "█", "green"
        line = Text(info.name.ljust(label_width))
        for ch, st in zip(cells, styles, strict=True):
            line.append(ch, style=st or None)
        line.append(f" {_range_label(info)}", style="dim")
        rows.append(line)
    axis = [" "] * (width + 8)  # room for the last label to run past the line
    ticks: list[tuple[int, str]] = []
    step = 10 ** max(0, int(math.log10(span / 4)))
    step = max(step, round(span / 6 / step) * step)
    first = math.ceil(low / step) * step
    exponent = first
    while exponent <= high:
        ticks.append((column(exponent), f"2^{exponent}"))
        exponent += step
    rows.append(Text(" " * label_width + "".join("┬" if any(c == t[0] for t in ticks) else "─" for c in range(width))))
    for col, label in ticks:
        for offset, ch in enumerate(label):
            axis[col + offset] = ch
    rows.append(Text(" " * label_width + "".join(axis).rstrip()))
    return rows


class _FittedNumberLine:
    """The number line, narrowed at render time so that no row wraps in a console narrower than its default."""

    def __init__(self, floats: Sequence[FloatInfo]) -> None:
        self.floats = floats

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        reals = [i for i in self.floats if i.kind == "float"]
        label_width = max((len(i.name) for i in reals), default=0) + 1
        longest_range = max((_range_label(i) for i in reals), key=len, default="")
        room = options.max_width - label_width - len(longest_range) - 1
        yield Group(*number_line(self.floats, max(MIN_LINE_WIDTH, min(LINE_WIDTH, room))))


def _range_label(info: FloatInfo) -> str:
    smallest = info.smallest_subnormal or info.smallest_normal
    return f"2^{math.frexp(smallest)[1] - 1} .. {fmt_float(info.max, 5)}"


class _FittedIntTable:
    """The integer table with exact bounds (``9,223,372,036,854,775,807``) where it fits the line, else with them
    as powers of two (``2^63-1``): two 26-character columns left no room at 80 columns, and every dtype name was
    cut to ``…``."""

    def __init__(self, ints: Sequence[IntInfo]) -> None:
        self.ints = ints

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = _int_table(self.ints)
        if not fit_columns(table, console, options):
            table = _int_table(self.ints, bound=_pow2_bound)
            fit_columns(table, console, options)
        yield table


def _pow2_bound(value: int) -> str:
    """``-2^63``, ``2^63-1``, ``2^64-1``; small values as they are."""
    if abs(value) < 2**16:
        return f"{value:,}"
    if value < 0:
        return f"-2^{(-value).bit_length() - 1}"
    return f"2^{value.bit_length()}-1"


def _int_table(ints: Sequence[IntInfo], bound: Callable[[int], str] = "{:,}".format) -> Table:
    table = Table(header_style="bold")
    widest = max(len(bound(v)) for info in ints for v in (info.min, info.max))
    for name in ("dtype", "kind", "bits", "min", "max", "torch.iinfo", "notes"):
        numeric = name in ("bits", "min", "max")
        table.add_column(
            name,
            justify="right" if numeric else "left",
            no_wrap=numeric,
            min_width=widest if name in ("min", "max") else None,
        )
    for info in ints:
        if info.torch_iinfo is None:
            iinfo = "raises"
        elif info.mismatches:
            iinfo = ", ".join(f"{m.field}={m.torch}" for m in info.mismatches)
        else:
            iinfo = "agrees"
        notes = ", ".join(
            n
            for n in ("quantized" if info.quantized else "", f"{info.packed} per byte" if info.packed > 1 else "")
            if n
        )
        table.add_row(info.name, info.kind, str(info.bits), bound(info.min), bound(info.max), iinfo, notes)
    return table


def _promotion(report: PromotionReport) -> list[RenderableType]:
    table = Table(title=f"type promotion of {', '.join(report.inputs)}", header_style="bold", title_justify="left")
    table.add_column("a")
    table.add_column("b")
    table.add_column("result", style="bold")
    table.add_column("rule", overflow="fold")
    table.add_column("what is lost", style="yellow", overflow="fold")
    for pair in report.pairs:
        lost = "\n".join(pair.losses) if pair.losses else ("" if pair.error is None else pair.error)
        table.add_row(pair.inputs[0], pair.inputs[1], pair.result or "error", pair.rule, lost)
    scalars = Table(
        title="against Python scalars and 0-dim tensors (where the tensor's dtype changes)",
        header_style="bold",
        title_justify="left",
    )
    for name in ("tensor", "with", "result", "rule"):
        scalars.add_column(name, overflow="fold")
    for s in report.scalars:
        if s.result != s.dtype:
            scalars.add_row(s.dtype, s.other, s.result or "error", s.rule)
    folded = report.result or "none: torch refuses at least one pair"
    out: list[RenderableType] = [table, Text(f"all together: {folded}", style="bold")]
    if scalars.row_count:
        out.append(scalars)
    return out


def _defaults(defaults: Defaults) -> Text:
    made = ", ".join(f"{expr} -> {dtype}" for expr, dtype in defaults.constructors.items())
    return Text(f"default dtype: {defaults.default_dtype}; {made}", style="dim")


def render_info(report: InfoReport) -> list[RenderableType]:
    floats = [d for d in report.dtypes if isinstance(d, FloatInfo)]
    ints = [d for d in report.dtypes if isinstance(d, IntInfo)]
    out: list[RenderableType] = []
    if floats:
        out.append(_FittedFloatTables(floats))
        out += _findings(floats)
        out.append(Text(""))
        out.append(_FittedNumberLine(floats))
    if ints:
        out.append(_FittedIntTable(ints))
    if report.promotion is not None:
        out += _promotion(report.promotion)
    if report.defaults is not None:
        out.append(_defaults(report.defaults))
    out.append(Text(f"measured on: {', '.join(report.measured_devices)} (torch {report.torch_version})", style="dim"))
    return out


def render_dtype_list(report: DtypeList) -> list[RenderableType]:
    table = Table(header_style="bold")
    table.add_column("dtype", no_wrap=True)
    table.add_column("kind")
    table.add_column("bits", justify="right")
    table.add_column("also accepted as", overflow="fold")
    for entry in report.dtypes:
        bits = f"{entry.bits} x{entry.packed}" if entry.packed > 1 else str(entry.bits)
        table.add_row(entry.name, entry.kind, bits, ", ".join(entry.aliases))
    out: list[RenderableType] = [table]
    if report.not_in_this_torch:
        out.append(Text(f"not in this torch build: {', '.join(report.not_in_this_torch)}", style="dim"))
    if report.not_described:
        out.append(Text(f"torch dtypes dtypecheck does not describe: {', '.join(report.not_described)}", style="dim"))
    out.append(
        Text(f"names are case-insensitive and may carry a torch. prefix (torch {report.torch_version})", style="dim")
    )
    return out
