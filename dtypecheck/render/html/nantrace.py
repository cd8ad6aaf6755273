"""nan-trace's page: the first producer with its source lines, the chain of ops that carried the value to its
consequence, the module tree with the culprit highlighted, and the ops that came close (the warnings)."""

from __future__ import annotations

import linecache
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dtypecheck.render.html.page import Page, definition_table, esc, level_badge, number, table
from dtypecheck.render.nantrace_table import CAUSE_TEXT, CONSEQUENCE_TEXT

SOURCE_CONTEXT = 3
"""Lines shown before and after the first producer's line, when its file can still be read."""


def nantrace_page(doc: Mapping[str, Any]) -> Page:
    first = doc.get("first")
    level = "fail" if doc["status"] == "nonfinite" else ("warn" if doc.get("warnings") else "ok")
    steps = f", {doc['steps']:,} step(s)" if doc.get("steps") else ""
    subtitle = f"{doc['source']} · {doc['status']} · {doc['ops']:,} ops checked{steps}"
    sections: list[str] = [_status(doc, first)]
    if first is not None:
        sections += [_producer(first), _chain(first), _module_tree(first, doc)]
    sections.append(_came_close(doc.get("warnings") or ()))
    exception = doc.get("exception")
    if exception:
        sections.append(f'<section id="exception"><h2>The traced code raised</h2><pre>{esc(exception)}</pre></section>')
    notes = doc.get("notes") or ()
    if notes:
        items = "".join(f"<li>{esc(note)}</li>" for note in notes)
        sections.append(f'<section id="notes"><h2>Notes</h2><ul>{items}</ul></section>')
    return Page("dtypecheck nan-trace", subtitle, level, tuple(sections))


def _where(location: Mapping[str, Any] | None) -> str:
    if not location:
        return "-"
    return f"<code>{esc(Path(location['file']).name)}:{location['line']}</code>"


def _module_name(module: str | None) -> str:
    if module is None:
        return "-"
    return f"<code>{esc(module or '(model)')}</code>"


def _status(doc: Mapping[str, Any], first: Mapping[str, Any] | None) -> str:
    if first is None:
        text = "No NaN or inf was produced." if doc["status"] == "clean" else "Non-finite values were found."
    else:
        where = first.get("location") or {}
        line = f" at {esc(Path(where['file']).name)}:{where['line']}" if where else ""
        text = f"The first {esc(first['kind'])} came from <code>{esc(first['op'])}</code>{line}."
    status = f'<span id="status-value">{esc(doc["status"])}</span>'
    return f'<section id="status"><h2>Status: {status}</h2><p>{text}</p></section>'


def _source_lines(location: Mapping[str, Any]) -> str:
    """The producer's line with a few around it (from the file, when it can still be read; else the line the
    report holds), the producer's own line marked."""
    path, line = str(location["file"]), int(location["line"])
    numbers = range(max(1, line - SOURCE_CONTEXT), line + SOURCE_CONTEXT + 1)
    lines = [(n, linecache.getline(path, n).rstrip("\n")) for n in numbers]
    if not lines or not any(text for _, text in lines) or lines[line - numbers[0]][1].strip() != location["code"]:
        lines = [(line, str(location["code"]))]  # the file changed since the run, or is gone: only what was recorded
    rows = []
    for n, text in lines:
        mark = ' class="culprit"' if n == line else ""
        rows.append(f'<span{mark} data-line="{n}">{n:>5}  {esc(text)}</span>')
    return f'<pre id="source">{chr(10).join(rows)}</pre>'


def _producer(first: Mapping[str, Any]) -> str:
    location = first.get("location")
    counts = first.get("counts") or {}
    values = ", ".join(
        f"{name} {number(counts.get(name))}" for name in ("nan", "posinf", "neginf", "zeros", "subnormal")
    )
    pairs = [
        (
            "op",
            f'<code id="first-op">{esc(first["op"])}</code> ({esc(first["phase"])}, '
            f"step {number(first.get('step'))}, op #{number(first.get('op_index'))})",
        ),
        ("kind", level_badge(first.get("level") or "fail") + f" {esc(first['kind'])}"),
        ("module", _module_name(first.get("module"))),
        ("dtype", esc(first["dtype"])),
        ("values", values),
        ("absmax", f"{number(first.get('absmax'), 6)} (limit {number(first.get('limit'), 6)})"),
    ]
    if first.get("grad_fn"):
        pairs.append(("grad_fn", f"<code>{esc(first['grad_fn'])}</code>"))
    if first.get("cause"):
        pairs.append(("cause", esc(CAUSE_TEXT.get(first["cause"], first["cause"]).format(dtype=first["dtype"]))))
    if location:
        label = "forward line" if first["phase"] == "backward" else "line"
        line = f'<span id="culprit-line">{esc(location["file"])}:{location["line"]}</span>'
        where = f"{line} in <code>{esc(location['function'])}</code>"
        pairs.append((label, where))
    source = _source_lines(location) if location else ""
    return f'<section id="producer"><h2>First producer</h2>{definition_table(pairs)}{source}</section>'


def _chain(first: Mapping[str, Any]) -> str:
    history: Sequence[Mapping[str, Any]] = first.get("history") or ()
    rows = [
        [
            f"<code>{esc(entry['op'])}</code>",
            esc(entry["phase"]),
            _module_name(entry.get("module")),
            esc(entry["dtype"]),
            number(entry.get("absmax"), 6),
            number(entry.get("ratio"), 3),
            _where(entry.get("location")),
            f"<code>{esc((entry.get('location') or {}).get('code', ''))}</code>",
        ]
        for entry in history
    ]
    rows.append(
        [
            f'<code class="culprit">{esc(first["op"])}</code>',
            esc(first["phase"]),
            _module_name(first.get("module")),
            esc(first["dtype"]),
            number(first.get("absmax"), 6),
            "-",
            _where(first.get("location")),
            f"<code>{esc((first.get('location') or {}).get('code', ''))}</code>",
        ]
    )
    consequence = first.get("consequence")
    then = (
        f'<p>Then it <strong id="consequence">{esc(CONSEQUENCE_TEXT.get(consequence, consequence))}</strong>.</p>'
        if consequence
        else ""
    )
    headers = ["op", "phase", "module", "dtype", "absmax", "/ max", "line", "code"]
    return (
        '<section id="chain"><h2>The chain of ops</h2><p class="muted">The checked ops before it, then the producer '
        f"(highlighted).</p>{table(headers, rows, numeric=(4, 5))}{then}</section>"
    )


def _modules_seen(doc: Mapping[str, Any], first: Mapping[str, Any]) -> list[str]:
    events: list[Mapping[str, Any]] = [first, *(doc.get("events") or ()), *(doc.get("warnings") or ())]
    found = [m for e in events for m in (e.get("module"), *(h.get("module") for h in e.get("history") or ()))]
    return sorted({m for m in found if m})


def _module_tree(first: Mapping[str, Any], doc: Mapping[str, Any]) -> str:
    """The modules the report names (the producer's, and those of the ops before it and of every event), as a
    tree under the model, the culprit's path highlighted."""
    culprit = first.get("module")
    on_path = set()
    if culprit:
        parts = culprit.split(".")
        on_path = {".".join(parts[: i + 1]) for i in range(len(parts))}
    tree: dict[str, Any] = {}
    for path in _modules_seen(doc, first):
        node = tree
        for part in path.split("."):
            node = node.setdefault(part, {})

    def draw(node: Mapping[str, Any], prefix: str) -> str:
        items = []
        for name, children in node.items():
            path = f"{prefix}{name}"
            mark = (
                ' class="culprit" id="culprit-module"'
                if path == culprit
                else (' class="culprit"' if path in on_path else "")
            )
            items.append(f"<li><code{mark}>{esc(name)}</code>{draw(children, path + '.') if children else ''}</li>")
        return f'<ul class="tree">{"".join(items)}</ul>' if items else ""

    root_mark = ' class="culprit" id="culprit-module"' if culprit == "" else ""
    note = (
        '<p class="muted">The producer ran outside every module (in the script or step function itself).</p>'
        if culprit is None
        else ""
    )
    return (
        f'<section id="modules"><h2>Module tree</h2>{note}<ul class="tree"><li><code{root_mark}>(model)</code>'
        f"{draw(tree, '')}</li></ul></section>"
    )


def _came_close(warnings: Iterable[Mapping[str, Any]]) -> str:
    rows = [
        [
            esc(w["kind"]),
            f"<code>{esc(w['op'])}</code>",
            esc(w["phase"]),
            _module_name(w.get("module")),
            esc(w["dtype"]),
            number(w.get("absmax"), 6),
            number(w.get("limit"), 6),
            number((w.get("counts") or {}).get("subnormal")),
            _where(w.get("location")),
        ]
        for w in warnings
    ]
    if not rows:
        return '<section id="came-close"><h2>Came close</h2><p>No op came close to its dtype\'s limits.</p></section>'
    headers = ["kind", "op", "phase", "module", "dtype", "absmax", "limit", "subnormal", "line"]
    return f'<section id="came-close"><h2>Came close</h2>{table(headers, rows, numeric=(5, 6, 7))}</section>'
