"""The contract's rounding rule for one value, exactly, in pure Python.

``round_to_format`` is round-to-nearest-even onto a format's grid with an unbounded exponent range at the top
(so overflow is visible as ``|r| > max`` even for formats that saturate on cast) and the format's subnormal
spacing at the bottom. It is the scalar reference that the vectorised counters are tested against.
"""

from __future__ import annotations

import math
from typing import Literal

from dtypecheck.dtypes import FloatFormat

CastVerdict = Literal["ok", "overflow", "underflow", "subnormal", "nonfinite"]


def round_to_format(x: float, fmt: FloatFormat) -> float:
    """RNE of a finite float64 ``x`` onto ``fmt``'s grid, exponent unbounded above."""
    if x == 0 or not math.isfinite(x):
        return x
    _, exponent = math.frexp(abs(x))  # abs(x) = m * 2**exponent with m in [0.5, 1)
    binade = max(exponent - 1, fmt.emin)
    shift = fmt.mantissa_bits - binade
    # Scaling by a power of two is exact, and Python's round() of a float ties to even.
    return math.ldexp(float(round(math.ldexp(x, shift))), -shift)


def judge_cast(x: float, fmt: FloatFormat) -> CastVerdict:
    """What casting ``x`` to ``fmt`` does to it, by docs/contract.md's rounding rules."""
    if not math.isfinite(x):
        return "nonfinite"
    r = round_to_format(x, fmt)
    if abs(r) > fmt.max:
        return "overflow"
    if x != 0 and r == 0:
        return "underflow"
    if r != 0 and abs(r) < fmt.smallest_normal:
        return "subnormal"
    return "ok"
