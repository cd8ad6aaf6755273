"""info's page: each float dtype's number line (log2 axis: subnormals, normals, eps, 1 and max), its facts and what
each device measured; integers with their range; ``info --list`` as one table."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dtypecheck.render.html.page import Page, definition_table, esc, number, table


def info_page(doc: Mapping[str, Any]) -> Page:
    sections = [_dtype_section(d) for d in doc["dtypes"]]
    defaults = doc.get("defaults")
    if defaults:
        rows = [[f"<code>{esc(call)}</code>", esc(dtype)] for call, dtype in defaults.get("constructors", {}).items()]
        sections.append(
            f'<section id="defaults"><h2>Defaults (default dtype {esc(defaults.get("default_dtype"))})</h2>'
            f"{table(['call', 'dtype'], rows)}</section>"
        )
    promotion = doc.get("promotion")
    if promotion:
        sections.append(f'<section id="promotion"><h2>Promotion</h2><pre>{esc(promotion)}</pre></section>')
    names = ", ".join(d["name"] for d in doc["dtypes"])
    subtitle = f"{names} · torch {doc.get('torch_version', '?')}"
    return Page("dtypecheck info", subtitle, None, tuple(sections))


def list_page(doc: Mapping[str, Any]) -> Page:
    rows = [
        [f"<code>{esc(d['name'])}</code>", esc(d["kind"]), str(d["bits"]), esc(", ".join(d.get("aliases") or ()))]
        for d in doc["dtypes"]
    ]
    body = table(["dtype", "kind", "bits", "aliases"], rows, numeric=(2,), table_id="dtypes")
    return Page("dtypecheck info --list", f"{len(rows)} dtypes", None, (f'<section id="list">{body}</section>',))


def _dtype_section(d: Mapping[str, Any]) -> str:
    name = esc(d["name"])
    if d["kind"] not in ("float", "complex"):
        facts = definition_table(
            [("kind", esc(d["kind"])), ("bits", str(d["bits"])), ("range", f"[{d['min']:,}, {d['max']:,}]")]
        )
        return f'<section class="dtype" id="dtype-{name}"><h2>{name}</h2>{facts}</section>'
    facts = definition_table(
        [
            (
                "bits",
                f"{d['bits']} (exponent {d['exponent_bits']}, mantissa {d['mantissa_bits']}, "
                f"bias {d['exponent_bias']})",
            ),
            ("max", f'<span class="max">{number(d["max"], 8)}</span>'),
            ("smallest normal", number(d["smallest_normal"], 6)),
            ("smallest subnormal", number(d["smallest_subnormal"], 6) if d["smallest_subnormal"] else "none"),
            ("eps (spacing at 1)", number(d["eps"], 6)),
            (
                "inf / nan / -0",
                " / ".join("yes" if d[k] else "no" for k in ("has_inf", "has_nan", "has_negative_zero")),
            ),
        ]
    )
    mismatches = d.get("mismatches") or ()
    wrong = ""
    if mismatches:
        rows = [[esc(m["field"]), number(m["torch"], 8), number(m["true"], 8)] for m in mismatches]
        wrong = f"<h3>Where torch.finfo is wrong</h3>{table(['field', 'torch.finfo', 'true'], rows)}"
    devices = d.get("devices") or {}
    rows = [
        [
            esc(device),
            number(m.get("eps"), 6),
            number(m.get("max"), 8),
            number(m.get("smallest_subnormal"), 6),
            esc(m.get("subnormals", "-")),
            esc(m.get("overflow_cast", "-")),
        ]
        for device, m in devices.items()
    ]
    measured = (
        table(["device", "eps", "max", "smallest subnormal", "subnormals", "overflow cast"], rows) if rows else ""
    )
    return (
        f'<section class="dtype" id="dtype-{name}"><h2>{name}</h2>{number_line(d)}{facts}{wrong}'
        f"{'<h3>Measured</h3>' + measured if measured else ''}</section>"
    )


def number_line(d: Mapping[str, Any]) -> str:
    """The dtype's positive numbers on its own log2 axis: the subnormal range (yellow), the normal range (green),
    and marks at the smallest subnormal, the smallest normal, eps, 1 and max."""
    tiny, top = float(d["smallest_normal"]), float(d["max"])
    sub = float(d["smallest_subnormal"] or 0) or None
    left = math.floor(math.log2(sub or tiny)) - 4
    right = math.ceil(math.log2(top)) + 4
    width, margin = 760, 20
    scale = (width - 2 * margin) / (right - left)

    def x(value: float) -> float:
        return margin + (math.log2(value) - left) * scale

    parts = [f'<line x1="{margin}" x2="{width - margin}" y1="40" y2="40" stroke="#90a4ae"/>']
    if sub is not None:
        parts.append(
            f'<rect x="{x(sub):.1f}" y="34" width="{x(tiny) - x(sub):.1f}" height="12" fill="#ffd54f">'
            "<title>subnormal</title></rect>"
        )
    parts.append(
        f'<rect x="{x(tiny):.1f}" y="34" width="{max(x(top) - x(tiny), 1):.1f}" height="12" fill="#81c784">'
        "<title>normal</title></rect>"
    )
    marks = [
        (label, value)
        for label, value in (("sub", sub), ("tiny", tiny), ("eps", float(d["eps"])), ("1", 1.0), ("max", top))
        if value
    ]
    for row, (label, value) in enumerate(marks):
        assert value is not None
        px = x(value)
        y = (12, 24, 62, 74)[row % 4]
        parts.append(
            f'<line x1="{px:.1f}" x2="{px:.1f}" y1="30" y2="50" stroke="#263238"/>'
            f'<text x="{px - 10:.1f}" y="{y}">{label} 2^{math.log2(value):.4g}</text>'
        )
    step = max(1, math.ceil((right - left) / 8 / 5) * 5)
    for tick in range(math.ceil(left / step) * step, right + 1, step):
        parts.append(f'<text x="{margin + (tick - left) * scale - 10:.1f}" y="92" fill="#5f6b76">2^{tick}</text>')
    svg = f'<svg class="number-line" width="{width}" height="98" role="img" aria-label="number line">'
    return f"{svg}{''.join(parts)}</svg>\n"
