"""A small reading of an HTML report (``html.parser``, no third-party parser): what a test asks of the page.

The same reading serves the page as dtypecheck wrote it and the DOM a browser serialises after running it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"meta", "link", "br", "img", "input", "hr", "col", "area", "base", "source", "wbr"}
"""HTML elements without an end tag (SVG shapes end with ``/>`` or their own end tag)."""


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    def text(self) -> str:
        parts = [c if isinstance(c, str) else c.text() for c in self.children]
        return "".join(parts)

    def clean_text(self) -> str:
        return re.sub(r"\s+", " ", self.text()).strip()

    def iter(self) -> list[Element]:
        found = [self]
        for child in self.children:
            if isinstance(child, Element):
                found.extend(child.iter())
        return found

    def find_all(self, tag: str | None = None, **attrs: str) -> list[Element]:
        wanted = {k.rstrip("_").replace("_", "-"): v for k, v in attrs.items()}
        return [
            e
            for e in self.iter()
            if (tag is None or e.tag == tag) and all(e.attrs.get(k) == v for k, v in wanted.items())
        ]

    def by_id(self, ident: str) -> Element:
        (found,) = self.find_all(id=ident)
        return found


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(text: str) -> Element:
    builder = _Builder()
    builder.feed(text)
    builder.close()
    return builder.root


def table_rows(table: Element) -> list[list[str]]:
    """The body rows of a table, each cell's text with white space collapsed."""
    return [[cell.clean_text() for cell in row.find_all("td")] for row in table.find_all("tr") if row.find_all("td")]


EXTERNAL = re.compile(
    r"""(?:src|href|action|srcset|poster|data)\s*=\s*["']?\s*(?:https?:|//|ftp:)"""
    r"""|url\(\s*["']?\s*(?:https?:|//)|@import""",
    re.IGNORECASE,
)
"""What would make a browser fetch something from outside the file."""


def external_references(text: str) -> list[str]:
    return [m.group(0) for m in EXTERNAL.finditer(text)]
