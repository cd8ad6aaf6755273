"""Cell formatting every table shares: numbers, byte counts and the colour of each level. No rich here."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Final

from dtypecheck.findings import Level

_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""C0/C1 controls (ESC starts terminal sequences), bidi overrides that reorder what a reader sees, lone surrogates."""


def printable(text: str) -> str:
    """Text from an input file (a tensor name, a finding) made safe for a terminal: controls, bidi overrides and
    lone surrogates become their Python escapes (``\\x1b``), so a name cannot move the cursor, recolour or
    rewrite the report. Tables and the CLI's error lines use it; JSON keeps the true name."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)


LEVEL_STYLE: Final[Mapping[Level, str]] = {"ok": "green", "warn": "yellow", "fail": "bold red"}


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
