"""How a report shows itself in a Jupyter notebook: ``_repr_html_``, drawn by the same renderer as ``--format html``.

The cores never import ``render/`` (their results are data; only ``cli/`` and ``render/`` present them), so this
mixin names the renderer the way an entry point does, by module and attribute, and imports it on first display.
"""

from __future__ import annotations

import importlib

HTML_RENDERER = ("dtypecheck.render.html", "render_html_fragment")
"""Module and function that turn a report into the HTML of a notebook cell."""


class ShowsAsHtml:
    """Base of every report class: a notebook cell whose value is a report shows the HTML report."""

    __slots__ = ()

    def _repr_html_(self) -> str:
        module, name = HTML_RENDERER
        return str(getattr(importlib.import_module(module), name)(self))
