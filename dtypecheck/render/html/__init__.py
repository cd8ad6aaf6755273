"""HTML reports: one self-contained page per run (``--format html``), and the same content in a notebook cell.

Each renderer reads the report's JSON document (``render.json.document``), so a page states exactly the facts the
JSON of the same run holds, and fields other parts of dtypecheck add to a document are there to show.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from dtypecheck.render.html.page import Page, fragment, page
from dtypecheck.render.json import document

PageRenderer = Callable[[Mapping[str, Any]], Page]


@cache
def html_renderers() -> Mapping[str, PageRenderer]:
    """Document schema -> the function that lays out its page; the one place HTML renderers are listed."""
    from dtypecheck.render.html.info import info_page, list_page
    from dtypecheck.render.html.memory import memory_page
    from dtypecheck.render.html.nantrace import nantrace_page
    from dtypecheck.render.html.scan import scan_page

    return {
        "dtypecheck.info/1": info_page,
        "dtypecheck.info-list/1": list_page,
        "dtypecheck.memory/1": memory_page,
        "dtypecheck.nantrace/1": nantrace_page,
        "dtypecheck.scan/1": scan_page,
    }


def _layout(report: object) -> Page:
    body = document(report)
    renderer = html_renderers().get(str(body["schema"]))
    if renderer is None:
        raise TypeError(f"no HTML renderer for {type(report).__name__}")
    return renderer(body)


def render_html(report: object) -> str:
    """The whole page (``--format html``)."""
    laid_out = _layout(report)
    return page(laid_out.title, laid_out.subtitle, laid_out.level, laid_out.sections)


def render_html_fragment(report: object) -> str:
    """The report as a notebook cell shows it (``_repr_html_``): the same sections, no page around them."""
    laid_out = _layout(report)
    return fragment(laid_out.title, laid_out.subtitle, laid_out.level, laid_out.sections)
