"""estimate-memory's page: per estimate row, a bar of its terms stacked, with the step's peak (``total``) marked;
and, where the report carries one, the step's memory over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dtypecheck.render.cells import fmt_bytes, fmt_count
from dtypecheck.render.html.page import Page, definition_table, esc, table

TERM_COLOUR = {
    "parameters": "#4c72b0",
    "buffers": "#64b5f6",
    "gradients": "#dd8452",
    "optimizer_states": "#55a868",
    "master_weights": "#8172b3",
    "activations": "#c44e52",
    "kv_cache": "#937860",
    "quantization_overhead": "#da8bc3",
    "optimizer_step_transient": "#8c8c8c",
    "gathered_parameters": "#ccb974",
}
"""The byte terms of an estimate, in the order they stack; a term the report adds later is drawn in grey."""


def memory_page(doc: Mapping[str, Any]) -> Page:
    model = doc["model"]
    subtitle = f"{model['source']} · {fmt_count(model['parameters'])} parameters"
    sections = [_model(model), _bars(doc["estimates"]), _numbers(doc["estimates"])]
    sections += [_timeline(i, e) for i, e in enumerate(doc["estimates"]) if _points(e)]
    measured = [m for m in (doc.get("measurements") or ()) if m] or ([doc["measured"]] if doc.get("measured") else [])
    if measured:
        rows = [
            [esc(m.get("device", "-")), fmt_bytes(m.get("peak_bytes")), f"{float(m.get('error') or 0):+.1%}"]
            for m in measured
        ]
        sections.append(f'<section id="measured"><h2>Measured</h2>{table(["device", "peak", "error"], rows)}</section>')
    return Page("dtypecheck estimate-memory", subtitle, None, tuple(sections))


def _model(model: Mapping[str, Any]) -> str:
    pairs = [
        ("source", f"<code>{esc(model['source'])}</code>"),
        ("parameters", f"{fmt_count(model['parameters'])} ({fmt_count(model['trainable_parameters'])} trainable)"),
        ("buffers", f"{fmt_count(model['buffers'])} ({fmt_bytes(model['buffer_bytes'])})"),
    ]
    for key in ("architecture", "model_class", "kind"):
        if model.get(key):
            pairs.append((key.replace("_", " "), esc(model[key])))
    return f'<section id="model"><h2>Model</h2>{definition_table(pairs)}</section>'


def row_label(estimate: Mapping[str, Any]) -> str:
    """``bfloat16 training adamw amp, batch 8`` (plain text)."""
    parts = [estimate["dtype"], estimate["mode"]]
    if estimate.get("optimizer"):
        parts.append(estimate["optimizer"])
    parts.append(estimate["precision"])
    sharding = estimate.get("sharding") or {}
    if sharding.get("strategy") not in (None, "none"):
        parts.append(f"{sharding['strategy']}x{sharding.get('world_size')}")
    return " ".join(str(p) for p in parts) + f", batch {estimate['batch_size']}"


def terms(estimate: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The nonzero byte terms of a row in stacking order (``total`` is the peak, not a term)."""
    counts = estimate["bytes"]
    names = [*TERM_COLOUR, *(k for k in counts if k not in TERM_COLOUR and k != "total")]
    return [(name, int(counts[name])) for name in names if isinstance(counts.get(name), int) and counts[name] > 0]


def _bars(estimates: Sequence[Mapping[str, Any]]) -> str:
    widest = max([1, *(max(sum(b for _, b in terms(e)), int(e["bytes"]["total"])) for e in estimates)])
    label, width, height = 260, 560, 22
    parts = []
    for row, estimate in enumerate(estimates):
        y = row * (height + 8)
        parts.append(f'<text x="0" y="{y + 15}">{esc(row_label(estimate))}</text>')
        x = float(label)
        for name, count in terms(estimate):
            w = width * count / widest
            colour = TERM_COLOUR.get(name, "#9e9e9e")
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{height}" fill="{colour}">'
                f"<title>{esc(name)}: {fmt_bytes(count)}</title></rect>"
            )
            x += w
        total = int(estimate["bytes"]["total"])
        peak_x = label + width * total / widest
        parts.append(
            f'<line x1="{peak_x:.1f}" x2="{peak_x:.1f}" y1="{y - 2}" y2="{y + height + 2}" stroke="#000" '
            f'stroke-width="2"><title>peak {fmt_bytes(total)}</title></line>'
            f'<text x="{min(peak_x + 4, label + width + 4):.1f}" y="{y + 15}">{fmt_bytes(total)}</text>'
        )
    svg_height = len(estimates) * (height + 8) + 4
    used = {name for e in estimates for name, _ in terms(e)}
    legend = " ".join(
        f'<span style="background:{colour};color:#fff;padding:0 6px">{esc(name)}</span>'
        for name, colour in TERM_COLOUR.items()
        if name in used
    )
    return (
        '<section id="bars"><h2>Memory per device, term by term</h2>'
        f'<p class="muted">Each bar stacks the terms; the black line is the step\'s peak (total). {legend}</p>'
        f'<svg width="{label + width + 90}" height="{svg_height}" role="img" aria-label="stacked memory bars">'
        f"{''.join(parts)}</svg></section>"
    )


def _numbers(estimates: Sequence[Mapping[str, Any]]) -> str:
    names = list(dict.fromkeys(name for e in estimates for name, _ in terms(e)))
    rows = []
    for estimate in estimates:
        counts = dict(terms(estimate))
        cells = [esc(row_label(estimate)), *(fmt_bytes(counts.get(name, 0)) for name in names)]
        cells.append(f'<strong class="total">{fmt_bytes(int(estimate["bytes"]["total"]))}</strong>')
        fit = estimate.get("fit")
        cells.append(esc(fit.get("verdict", fit) if isinstance(fit, dict) else "-") if fit else "-")
        rows.append(cells)
    headers = ["row", *names, "total (peak)", "fit"]
    numeric = tuple(range(1, len(names) + 2))
    body = table(headers, rows, numeric=numeric, table_id="estimates")
    return f'<section id="numbers"><h2>The numbers</h2>{body}</section>'


def _points(estimate: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The step's memory over time, where the report has it (``timeline``: a list of points, each with its bytes
    in ``total`` or ``bytes`` and a label in ``label``, ``op`` or ``phase``); empty otherwise."""
    timeline = estimate.get("timeline")
    if not isinstance(timeline, list):
        return []
    points = []
    for index, point in enumerate(timeline):
        if isinstance(point, Mapping):
            value = point.get("total", point.get("bytes"))
            name = point.get("label") or point.get("op") or point.get("phase") or str(index)
        else:
            value, name = point, str(index)
        if isinstance(value, int) and not isinstance(value, bool):
            points.append((str(name), value))
    return points


def _timeline(index: int, estimate: Mapping[str, Any]) -> str:
    points = _points(estimate)
    width, height, left = 720, 160, 70
    top = max([1, *(v for _, v in points)])
    step = (width - left) / max(1, len(points) - 1)
    xy = [(left + i * step, height - 10 - (height - 30) * v / top) for i, (_, v) in enumerate(points)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    dots = "".join(
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#c44e52"><title>{esc(name)}: {fmt_bytes(v)}</title></circle>'
        for (x, y), (name, v) in zip(xy, points, strict=True)
    )
    return (
        f'<section class="timeline" id="timeline-{index}"><h2>Over the step: {esc(row_label(estimate))}</h2>'
        f'<svg width="{width}" height="{height}" role="img" aria-label="memory over the step">'
        f'<text x="0" y="14">{fmt_bytes(top)}</text><text x="0" y="{height - 10}">0</text>'
        f'<polyline points="{line}" fill="none" stroke="#4c72b0" stroke-width="2"/>{dots}</svg></section>'
    )
