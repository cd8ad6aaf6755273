"""What torch's ``.to()`` really does to float64 values: narrow targets are reached through float32.

Measured on torch 2.13's CPU casts (tests/scan/test_via_float32.py checks it against the installed torch): from
float64 to float16, bfloat16 and every float8 format, ``x.to(T)`` equals ``x.to(float32).to(T)`` -- two
round-to-nearest-even steps, not docs/contract.md's one. The two disagree exactly when the float32 rounding lands on a
tie of ``T``'s grid that ``x`` itself was not on: ``65520 * (1 - 2**-40)`` is below float16's overflow tie (single
rounding: 65504), but rounds to 65520.0 in float32, a tie that float16 breaks upwards (inf).

A scan reports what the cast gives (the counts of float64 tensors use the thresholds below), and counts per target
the values whose result differs from single rounding (``double_rounding``), so a reader sees when the two rules part.
Casts to float32 and wider are a single rounding; float4 has no torch cast, so CONTRACT's rule stands for it.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dtypecheck.dtypes import DtypeSpec, FloatFormat
from dtypecheck.scan.quantize import round_magnitudes
from dtypecheck.scan.thresholds import (
    FLOAT32,
    FLOAT64,
    KernelFormat,
    TargetPatterns,
    target_patterns,
)

_FLOAT32_OVERFLOW = Fraction(2**128 - 2**103)
"""The tie between float32's max and 2**128: its significand is odd, so the tie itself rounds to inf."""


def goes_via_float32(target: DtypeSpec, kernel: KernelFormat) -> bool:
    """Whether torch casts values read as ``kernel`` to ``target`` through float32 (float64 to a narrow float)."""
    return kernel is FLOAT64 and target.kind == "float" and target.packed == 1 and target.fmt.bits < 32


def _lift(pattern32: int) -> int:
    """The first float64 magnitude pattern whose float32 rounding is at least the float32 pattern ``pattern32``.

    It is the midpoint between ``pattern32 - 1`` and ``pattern32``; the midpoint itself rounds to whichever of the
    two is even, so it belongs to ``pattern32`` exactly when ``pattern32`` is even.
    """
    if pattern32 == 0:
        return 0
    if pattern32 >= FLOAT32.inf_bits:
        return FLOAT64.first_magnitude(_FLOAT32_OVERFLOW, inclusive=True)
    low, high = FLOAT32.value_of(pattern32 - 1), FLOAT32.value_of(pattern32)
    assert low is not None
    assert high is not None
    return FLOAT64.first_magnitude((low + high) / 2, inclusive=pattern32 % 2 == 0)


def torch_patterns(target: DtypeSpec, kernel: KernelFormat) -> TargetPatterns:
    """The kernel thresholds of the cast torch performs: through float32 where it does, else direct."""
    if not goes_via_float32(target, kernel):
        return target_patterns(target.fmt, kernel)
    inner = target_patterns(target.fmt, FLOAT32)
    return TargetPatterns(survive=_lift(inner.survive), normal=_lift(inner.normal), overflow=_lift(inner.overflow))


def _results(magnitudes: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """``RNE_fmt`` of finite magnitudes, with every overflow (CONTRACT: ``|r| > max``) as inf."""
    result = round_magnitudes(magnitudes, fmt)
    result[result > fmt.max] = np.inf
    return result


def double_rounding_count(values: np.ndarray, fmt: FloatFormat) -> int:
    """How many finite float64 ``values`` cast to ``fmt`` through float32 differ from a single rounding."""
    magnitudes = np.abs(values)
    finite = np.isfinite(magnitudes)
    if not finite.all():
        magnitudes = magnitudes[finite]
    with np.errstate(over="ignore"):
        via = magnitudes.astype(np.float32).astype(np.float64)
    too_big = np.isinf(via)
    via[too_big] = 0.0
    twice = _results(via, fmt)
    twice[too_big] = np.inf
    return int(np.count_nonzero(twice != _results(magnitudes, fmt)))
