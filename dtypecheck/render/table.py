"""Table rendering with rich: the registry of per-report renderers and the shared cell formatting."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any, TypeVar

from rich.console import Console, RenderableType

Renderer = Callable[[Any], list[RenderableType]]
_RENDERERS: dict[type, Renderer] = {}
R = TypeVar("R", bound=Renderer)

LEVEL_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def table_renderer(report_type: type) -> Callable[[R], R]:
    """Register the function that turns one report type into rich renderables."""

    def register(func: R) -> R:
        _RENDERERS[report_type] = func
        return func

    return register


def _load_renderers() -> None:
    # Imported for their registrations; kept here so rich loads only when a table is drawn.
    from dtypecheck.render import (
        info_table,  # noqa: F401
        memory_table,  # noqa: F401
        nantrace_table,  # noqa: F401
        scan_table,  # noqa: F401
    )


def render_table(report: Any, *, color: bool = False, width: int | None = None) -> str:
    _load_renderers()
    renderer = _RENDERERS.get(type(report))
    if renderer is None:
        raise TypeError(f"no table renderer for {type(report).__name__}")
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width or 120,
        force_terminal=color,
        no_color=not color,
        color_system="standard" if color else None,
        highlight=False,
        emoji=False,
        legacy_windows=False,
    )
    for renderable in renderer(report):
        console.print(renderable)
    return buffer.getvalue()


def fmt_float(value: float | None, digits: int = 4) -> str:
    """A compact, unambiguous cell: powers of two as such, everything else in %g."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    return f"{value:.{digits}g}"


def fmt_pow2(value: float | None, digits: int = 4) -> str:
    """``2^-24 (5.96e-08)`` for exact powers of two, else plain ``fmt_float``."""
    if value is None or value == 0 or not math.isfinite(value):
        return fmt_float(value, digits)
    mantissa, exponent = math.frexp(abs(value))
    if mantissa == 0.5:
        sign = "-" if value < 0 else ""
        return f"{sign}2^{exponent - 1} ({fmt_float(abs(value), 3)})"
    return fmt_float(value, digits)


def fmt_bytes(count: int | None) -> str:
    """IEC units; byte counts stay integers until this point."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_count(count: int | None) -> str:
    return "-" if count is None else f"{count:,}"
