"""scan-model's page: the verdict per target first, then a sortable, filterable tensor table, then each tensor's
log2-magnitude histogram against every float target's underflow, subnormal, normal and overflow bands."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dtypecheck.dtypes import lookup
from dtypecheck.render.cells import fmt_bytes
from dtypecheck.render.html.page import Page, definition_table, esc, level_badge, number, sort_key, table

HISTOGRAMS_SHOWN = 500
"""Histograms drawn per page, the worst tensors first (a checkpoint of 10,000 tensors keeps a readable page)."""
_RANK = {"ok": 0, "warn": 1, "fail": 2}
BAND_COLOUR = {"underflow": "#b0bec5", "subnormal": "#ffd54f", "normal": "#81c784", "overflow": "#e57373"}


def scan_page(doc: Mapping[str, Any]) -> Page:
    summary = doc["summary"]
    tensors = sorted(doc["tensors"], key=lambda t: -_RANK.get(t["level"], 0))  # stable: the file's order within
    subtitle = f"{doc['source']} ({doc['format']}) · targets {', '.join(doc['targets'])}"
    sections = [
        _verdicts(summary),
        _summary(summary),
        _findings(doc["findings"]),
        _tensor_table(tensors, doc["targets"]),
        _histograms(tensors, doc["targets"]),
    ]
    return Page("dtypecheck scan-model", subtitle, summary["level"], tuple(s for s in sections if s))


def _verdicts(summary: Mapping[str, Any]) -> str:
    cards = []
    for v in summary.get("verdicts", ()):
        counts = f"{v['overflow']:,} overflow · {v['underflow']:,} underflow · {v['subnormal']:,} subnormal"
        scaled = v.get("scaled_underflow")
        if scaled is not None:
            counts += f" · {scaled:,} lost even after scaling"
        worst = f'<p class="muted">worst: <code>{esc(v["worst"])}</code></p>' if v.get("worst") else ""
        by_level = " · ".join(f"{v['tensors'].get(level, 0):,} {level}" for level in ("ok", "warn", "fail"))
        cards.append(
            f'<div class="card level-border-{esc(v["level"])}" data-target="{esc(v["target"])}">'
            f"<h3>{esc(v['target'])} {level_badge(v['level'])}</h3>"
            f'<p class="advice">{esc(v["advice"])}</p><p>{counts}</p><p class="muted">tensors: {by_level}; '
            f"{100 * v['fraction_flushed']:.3g}% of values flushed</p>{worst}</div>"
        )
    return f'<section id="verdicts"><h2>Verdict per target</h2><div class="cards">{"".join(cards)}</div></section>'


def _summary(summary: Mapping[str, Any]) -> str:
    census = ", ".join(
        f"{esc(dtype)} {entry['tensors']:,} ({fmt_bytes(entry['bytes'])})" for dtype, entry in summary["census"].items()
    )
    pairs = [
        ("tensors", f'<span id="tensor-count">{summary["tensors"]:,}</span>'),
        ("values", f"{summary['numel']:,}"),
        ("bytes", fmt_bytes(summary["bytes"])),
        (
            "levels",
            f'<span id="level-counts">{summary["ok"]:,} ok · {summary["warn"]:,} warn · '
            f"{summary['fail']:,} fail</span>",
        ),
        ("dtypes", census or "-"),
    ]
    keep = summary.get("keep_float32") or ()
    if keep:
        items = "".join(f"<li><code>{esc(k['tensor'])}</code>: {esc(k['reason'])}</li>" for k in keep)
        pairs.append(("keep in float32", f"<ul>{items}</ul>"))
    for group in summary.get("not_judged") or ():
        pairs.append((f"not judged ({group['rule']})", f"{len(group['tensors']):,} tensor(s): {esc(group['reason'])}"))
    if summary.get("left_out"):
        pairs.append(("left out", f"{summary['left_out']:,} tensor(s) by include/exclude/weights_only"))
    return f'<section id="summary"><h2>Summary</h2>{definition_table(pairs)}</section>'


def _findings(findings: Sequence[Mapping[str, Any]]) -> str:
    if not findings:
        return ""
    rows = [
        [level_badge(f["level"]), esc(f["kind"]), f"<code>{esc(f.get('tensor') or '')}</code>", esc(f["detail"])]
        for f in findings
    ]
    return f'<section id="findings"><h2>Findings</h2>{table(["level", "kind", "tensor", "detail"], rows)}</section>'


def _cast_cell(cast: Mapping[str, Any] | None) -> str:
    if cast is None:
        return '<td data-sort="-1" class="muted">-</td>'
    parts = [f"{cast[check]:,} {label}" for check, label in _CAST_LABELS if cast.get(check)]
    total = sum(int(cast.get(check) or 0) for check, _ in _CAST_LABELS)
    order = _RANK.get(cast["level"], 0) * 10**15 + total
    return f'<td data-sort="{order}">{level_badge(cast["level"])} {" · ".join(parts)}</td>'


_CAST_LABELS = (("overflow", "over"), ("underflow", "under"), ("subnormal", "sub"), ("scaled_underflow", "scaled"))


def _tensor_table(tensors: Sequence[Mapping[str, Any]], targets: Sequence[str]) -> str:
    headers = ["#", "tensor", "dtype", "shape", "values", "level", "absmax", "min |x|>0", "nan", "inf", "zeros"]
    head = "".join(f"<th>{esc(h)}</th>" for h in [*headers, *targets])
    rows = []
    for index, t in enumerate(tensors):
        inf = None if t["posinf"] is None else t["posinf"] + t["neginf"]
        name = (
            f'<a href="#h{index}"><code>{esc(t["name"])}</code></a>'
            if t.get("log2_histogram")
            else f"<code>{esc(t['name'])}</code>"
        )
        cells = [
            f'<td class="num" data-sort="{index}">{index + 1}</td>',
            f'<td data-sort="{esc(t["name"])}">{name}</td>',
            f"<td>{esc(t['dtype'])}</td>",
            f"<td>{esc('x'.join(map(str, t['shape'])) or 'scalar')}</td>",
            f'<td class="num" data-sort="{t["numel"]}">{t["numel"]:,}</td>',
            f'<td data-sort="{_RANK.get(t["level"], 0)}">{level_badge(t["level"])}</td>',
            *(
                f'<td class="num" data-sort="{sort_key(v)}">{number(v)}</td>'
                for v in (t["absmax"], t["min_abs_nonzero"], t["nan"], inf, t["zeros"])
            ),
            *(_cast_cell(t["casts"].get(target)) for target in targets),
        ]
        rows.append(f'<tr data-name="{esc(t["name"])}" data-level="{esc(t["level"])}">{"".join(cells)}</tr>')
    filters = (
        '<div class="filters" data-filter-for="tensors" hidden>filter: <input type="search" placeholder="tensor name">'
        ' <select><option value="">every level</option><option>fail</option><option>warn</option>'
        "<option>ok</option></select> (click a column to sort)</div>"
    )
    return (
        f'<section id="tensor-table"><h2>Tensors, worst first</h2>{filters}'
        f'<table id="tensors" class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
        "</section>"
    )


def _bands(target: str) -> tuple[float, float, float] | None:
    """log2 of a float target's smallest subnormal, smallest normal and max; None for integer targets."""
    spec = lookup(target)
    if spec.kind != "float":
        return None
    fmt = spec.fmt
    return math.log2(fmt.smallest_positive), math.log2(fmt.smallest_normal), math.log2(fmt.max)


def _histograms(tensors: Sequence[Mapping[str, Any]], targets: Sequence[str]) -> str:
    windows = [(target, bands) for target in targets if (bands := _bands(target)) is not None]
    drawn: list[str] = []
    for index, t in enumerate(tensors):
        histogram = t.get("log2_histogram")
        if not histogram or len(drawn) >= HISTOGRAMS_SHOWN:
            continue
        drawn.append(
            f'<details id="h{index}" open><summary><code>{esc(t["name"])}</code> {level_badge(t["level"])}</summary>'
            f"{histogram_svg(histogram, windows)}</details>"
        )
    if not drawn:
        return ""
    legend = " ".join(
        f'<span style="background:{colour};padding:0 6px">{band}</span>' for band, colour in BAND_COLOUR.items()
    )
    left = sum(1 for t in tensors if t.get("log2_histogram")) - len(drawn)
    more = f'<p class="muted">{left:,} more histogram(s) not drawn.</p>' if left > 0 else ""
    return (
        '<section id="histograms"><h2>log2 |x| per tensor, against each target</h2>'
        f'<p class="muted">Bars: values per binade (log scale). Strips: each target\'s bands: {legend}.</p>'
        f"{''.join(drawn)}{more}</section>"
    )


def histogram_svg(histogram: Mapping[str, Any], windows: Sequence[tuple[str, tuple[float, float, float]]]) -> str:
    """One tensor's histogram with a strip per float target: underflow, subnormal, normal and overflow, on one
    log2 axis. Narrow targets are shown whole; a wide one (bfloat16's 2^-133..2^128) is cut at the edges."""
    start, counts = int(histogram["start"]), [int(c) for c in histogram["counts"]]
    every = int(histogram.get("sampled_every") or 1)
    occupied = [start + i for i, c in enumerate(counts) if c] or [start]
    narrow = [(low - 1, high + 1) for _, (low, _n, high) in windows if high - low < 80]
    left = math.floor(min([occupied[0], *(low for low, _ in narrow)])) - 2
    right = math.ceil(max([occupied[-1] + 1, *(high for _, high in narrow)])) + 2
    width, bar_height, strip, label = 760, 90, 12, 70
    plot = width - label - 10
    scale = plot / (right - left)
    peak = max(counts, default=0) or 1

    def x(e: float) -> float:
        return label + (min(max(e, left), right) - left) * scale

    parts = []
    for i, count in enumerate(counts):
        if not count:
            continue
        height = bar_height * math.log1p(count) / math.log1p(peak)
        e = start + i
        parts.append(
            f'<rect x="{x(e):.1f}" y="{bar_height - height:.1f}" width="{max(scale - 0.5, 0.8):.1f}" '
            f'height="{height:.1f}" fill="#4c72b0"><title>2^{e}: {count * every:,} values</title></rect>'
        )
    y = bar_height + 6
    for target, (low, normal, high) in windows:
        flush = low - 1  # values below half the smallest subnormal round to zero
        for band, lo, hi in (
            ("underflow", left, flush),
            ("subnormal", flush, normal),
            ("normal", normal, math.floor(high) + 1),
            ("overflow", math.floor(high) + 1, right),
        ):
            if x(hi) > x(lo):
                parts.append(
                    f'<rect x="{x(lo):.1f}" y="{y}" width="{x(hi) - x(lo):.1f}" height="{strip - 2}" '
                    f'fill="{BAND_COLOUR[band]}" data-target="{esc(target)}" data-band="{band}" '
                    f'data-from="{lo:g}" data-to="{hi:g}"><title>{esc(target)} {band}</title></rect>'
                )
        parts.append(f'<text x="0" y="{y + strip - 3}">{esc(target)}</text>')
        y += strip
    ticks = range(math.ceil(left / 8) * 8, right + 1, 8)
    for tick in ticks:
        parts.append(f'<text x="{x(tick) - 8:.1f}" y="{y + 12}">2^{tick}</text>')
    height = y + 18
    sampled = f" (every {every}th value)" if every > 1 else ""
    return (
        f'<svg width="{width}" height="{height}" role="img" '
        f'aria-label="log2 magnitude histogram{sampled}">{"".join(parts)}</svg>'
    )
