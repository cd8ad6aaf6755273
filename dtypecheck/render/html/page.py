"""The page every HTML report shares: one self-contained document (inline CSS, JS and SVG, nothing fetched).

Everything taken from the input (tensor, module and file names, source lines, findings) passes through ``esc``;
the Content-Security-Policy forbids every request, so a name that slipped through could still not reach out.
The page reads without JavaScript: the script only adds sorting and filtering to tables marked ``sortable``.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from dtypecheck import __version__

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
"""No request of any kind leaves the page: styles and the script are inline, images only ``data:``."""

LEVEL_COLOUR = {"ok": "#2e7d32", "warn": "#b26a00", "fail": "#c62828", "note": "#546e7a"}

_CSS = """
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1b1f24; background: #fff; }
header { background: #263238; color: #fff; padding: 14px 24px; }
header h1 { margin: 0; font-size: 20px; }
header p { margin: 4px 0 0; color: #cfd8dc; word-break: break-all; }
main { padding: 8px 24px 40px; max-width: 1400px; }
h2 { font-size: 17px; margin: 26px 0 8px; border-bottom: 1px solid #dde1e4; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border: 1px solid #dde1e4; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f5f7; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.sortable th { cursor: pointer; }
code, pre, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 13px; }
pre { background: #f6f8fa; border: 1px solid #dde1e4; padding: 8px; overflow-x: auto; }
.level { display: inline-block; padding: 0 8px; border-radius: 9px; color: #fff; font-weight: 600; }
.level-ok { background: #2e7d32; } .level-warn { background: #b26a00; } .level-fail { background: #c62828; }
.level-note { background: #546e7a; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { border: 1px solid #dde1e4; border-left: 6px solid #546e7a; border-radius: 4px; padding: 8px 12px;
        min-width: 240px; max-width: 440px; }
.card.level-border-ok { border-left-color: #2e7d32; } .card.level-border-warn { border-left-color: #b26a00; }
.card.level-border-fail { border-left-color: #c62828; }
.card h3 { margin: 0 0 4px; }
.culprit { background: #ffebee; font-weight: 600; }
.muted { color: #5f6b76; }
ul.tree { list-style: none; padding-left: 18px; margin: 2px 0; }
ul.tree li::before { content: "└ "; color: #90a4ae; }
.filters { margin: 6px 0; }
.filters input, .filters select { font: inherit; padding: 2px 6px; }
details { margin: 4px 0; } summary { cursor: pointer; }
svg text { font: 11px system-ui, sans-serif; }
"""

_SCRIPT = """
(function () {
  function key(cell) {
    var v = cell.getAttribute("data-sort");
    if (v === null) { v = cell.textContent; }
    var n = parseFloat(v);
    return isNaN(n) ? v.toLowerCase() : n;
  }
  document.querySelectorAll("table.sortable:not([data-bound])").forEach(function (table) {
    table.setAttribute("data-bound", "1");
    var body = table.tBodies[0];
    table.querySelectorAll("th").forEach(function (th, column) {
      th.addEventListener("click", function () {
        var up = th.getAttribute("data-dir") !== "up";
        th.setAttribute("data-dir", up ? "up" : "down");
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a.cells[column]), y = key(b.cells[column]);
          if (typeof x !== typeof y) { x = String(x); y = String(y); }
          return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1);
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
  document.querySelectorAll("[data-filter-for]:not([data-bound])").forEach(function (box) {
    box.setAttribute("data-bound", "1");
    var table = document.getElementById(box.getAttribute("data-filter-for"));
    var text = box.querySelector("input"), level = box.querySelector("select");
    box.hidden = false;
    function apply() {
      var needle = text.value.toLowerCase(), wanted = level.value;
      Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
        var name = (row.getAttribute("data-name") || "").toLowerCase();
        var ok = name.indexOf(needle) >= 0 && (!wanted || row.getAttribute("data-level") === wanted);
        row.hidden = !ok;
      });
    }
    text.addEventListener("input", apply);
    level.addEventListener("change", apply);
  });
})();
"""


class Page(NamedTuple):
    """What a command's renderer lays out: a plain-text title and subtitle, the report's level, HTML sections."""

    title: str
    subtitle: str
    level: str | None
    sections: tuple[str, ...]


def esc(value: object) -> str:
    """Text (and attribute values) from anywhere, escaped: ``<``, ``>``, ``&`` and both quotes."""
    return html.escape(str(value), quote=True)


def level_badge(level: str) -> str:
    return f'<span class="level level-{esc(level)}" data-level="{esc(level)}">{esc(level)}</span>'


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    numeric: Sequence[int] = (),
    table_id: str | None = None,
    sortable: bool = False,
    row_attributes: Sequence[str] | None = None,
) -> str:
    """A table of cells that are already HTML (escape them with ``esc`` first); ``numeric`` columns align right."""
    classes = ' class="sortable"' if sortable else ""
    ident = f' id="{esc(table_id)}"' if table_id else ""
    head = "".join(f"<th{' class=num' if i in numeric else ''}>{esc(h)}</th>" for i, h in enumerate(headers))
    lines = [f"<table{ident}{classes}><thead><tr>{head}</tr></thead><tbody>"]
    for index, row in enumerate(rows):
        attributes = row_attributes[index] if row_attributes else ""
        cells = "".join(f"<td{' class=num' if i in numeric else ''}>{cell}</td>" for i, cell in enumerate(row))
        lines.append(f"<tr{attributes}>{cells}</tr>")
    lines.append("</tbody></table>")
    return "".join(lines)


def definition_table(pairs: Iterable[tuple[str, str]]) -> str:
    """Two columns, the first a label: ``pairs`` of (label, HTML cell)."""
    rows = "".join(f"<tr><th>{esc(label)}</th><td>{cell}</td></tr>" for label, cell in pairs)
    return f"<table>{rows}</table>"


def _header(title: str, subtitle: str, level: str | None) -> str:
    badge = f" {level_badge(level)}" if level else ""
    return f"<header><h1>{esc(title)}{badge}</h1><p>{esc(subtitle)}</p></header>"


def page(title: str, subtitle: str, level: str | None, sections: Iterable[str]) -> str:
    """The whole document. ``title``/``subtitle`` are plain text (escaped here); ``sections`` are HTML."""
    body = "\n".join(sections)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta name="generator" content="dtypecheck {esc(__version__)}">\n'
        f"<title>{esc(title)}</title>\n<style>{_CSS}</style></head>\n"
        f"<body>{_header(title, subtitle, level)}\n<main>\n{body}\n</main>\n"
        f"<script>{_SCRIPT}</script>\n</body></html>\n"
    )


def _scoped_css(scope: str) -> str:
    """The page's style with every rule limited to ``scope`` (a notebook's own page keeps its look)."""
    rules = []
    for selectors, declarations in re.findall(r"([^{}]+)\{([^{}]*)\}", _CSS):
        scoped = []
        for each in selectors.split(","):
            selector = each.strip()
            if selector == ":root":
                continue
            scoped.append(scope if selector == "body" else f"{scope} {selector}")
        if scoped:
            rules.append(f"{', '.join(scoped)} {{{declarations}}}")
    return "\n".join(rules)


def fragment(title: str, subtitle: str, level: str | None, sections: Iterable[str]) -> str:
    """The report for a notebook cell: the same header, sections and style, scoped in one ``div``."""
    style = _scoped_css(".dtypecheck-report")
    body = "\n".join(sections)
    return (
        f'<div class="dtypecheck-report"><style>{style}</style>{_header(title, subtitle, level)}'
        f"<main>{body}</main><script>{_SCRIPT}</script></div>"
    )


def number(value: object, digits: int = 4) -> str:
    """A float from a JSON document (non-finite ones are the strings ``"nan"``, ``"inf"``, ``"-inf"``)."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return esc(value)
    if isinstance(value, bool):
        return esc(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return esc(value)
        return "0" if value == 0 else f"{value:.{digits}g}"
    return esc(value)


def sort_key(value: object) -> str:
    """``data-sort`` for a numeric cell: the number itself (non-finite: a very large one), empty for null."""
    if value is None:
        return ""
    if isinstance(value, str):
        return {"nan": "1e400", "inf": "1e400", "-inf": "-1e400"}.get(value, esc(value))
    return esc(value)
