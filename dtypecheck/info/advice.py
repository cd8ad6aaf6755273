"""Guidance rows: the numbers users look up before writing ``log``, Adam, ``exp`` or probabilities in a dtype."""

from __future__ import annotations

import math

from dtypecheck.dtypes import FloatFormat
from dtypecheck.info.report import Guidance
from dtypecheck.rounding import round_to_format


def largest_below_one(fmt: FloatFormat) -> float:
    """The largest representable value below 1: one grid step under 1 in the binade ``[1/2, 1)``.

    That binade's step is ``2**(e - mantissa_bits)`` with ``e = -1`` where it is normal; where it is subnormal
    (float4_e2m1fn, whose smallest normal is 1) the step is the subnormal spacing, ``e = emin``.
    """
    return 1.0 - math.ldexp(1.0, max(-1, fmt.emin) - fmt.mantissa_bits)


def unit_interval(fmt: FloatFormat) -> tuple[float, float]:
    """``[lo, hi]`` for probabilities: the smallest full-precision value below 1 (the smallest normal, or the
    smallest positive value where no normal lies below 1) and the largest value below 1."""
    low = fmt.smallest_normal if fmt.smallest_normal < 1 else fmt.smallest_positive
    return low, largest_below_one(fmt)


def guidance(fmt: FloatFormat) -> Guidance:
    """Every guidance row of ``fmt``, exactly, from its bit layout."""
    sub = fmt.smallest_subnormal
    return Guidance(
        log_clamp_min=fmt.smallest_normal,
        adam_eps_min=fmt.smallest_normal,
        adam_eps_1e_8=round_to_format(1e-8, fmt) if fmt.has_zero else max(round_to_format(1e-8, fmt), fmt.min),
        unit_interval=unit_interval(fmt),
        exp_max_arg=math.log(fmt.max),
        exp_zero_below=math.log(sub) - math.log(2) if sub is not None else None,
        max_exact_integer=int(min(2 ** (fmt.mantissa_bits + 1), fmt.max)),
        decimal_digits=round((fmt.mantissa_bits + 1) * math.log10(2), 2),
    )
