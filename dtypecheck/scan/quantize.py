"""Exact round-to-nearest-even of float64 magnitudes onto a float format's grid, vectorised with numpy.

docs/contract.md's rounding rule (nearest, ties to even, exponent unbounded above, subnormals below the smallest normal)
on whole arrays, with no lookup tables and no per-format code: the grid spacing at ``|x|`` is
``2**(max(floor(log2|x|), emin) - mantissa_bits)``, read from the float64 exponent field; dividing by it (a power
of two: exact) leaves a number below ``2**(mantissa_bits + 1)``, which ``(y + 2**52) - 2**52`` rounds to an integer
with ties to even in float64's own rounding; multiplying back is exact again. Values beyond ``max`` are left
rounded on the unbounded grid: callers decide whether that is an overflow, a clip or an infinity.

Used for the precision measures (``precision``, ``blockscale``) and for counting torch's double rounding of
float64 sources (``via_float32``). Exact for every format with 1 to 51 mantissa bits and magnitudes of float64's
normal range; float64 subnormals (below any target's grid) round to zero.
"""

from __future__ import annotations

import numpy as np

from dtypecheck.dtypes import FloatFormat

_MAGIC = float(2**52)
_BIAS = 1023


def round_magnitudes(magnitudes: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """``RNE_fmt(a)`` for every finite, non-negative float64 ``a`` (unbounded above: no clip, no inf)."""
    a = np.ascontiguousarray(magnitudes, dtype=np.float64)
    exponent = (a.view(np.int64) >> 52) - _BIAS
    ulp_exponent = np.maximum(exponent, fmt.emin) - fmt.mantissa_bits
    inverse = ((_BIAS - ulp_exponent) << 52).view(np.float64)
    spacing = ((_BIAS + ulp_exponent) << 52).view(np.float64)
    steps = a * inverse
    steps += _MAGIC
    steps -= _MAGIC
    steps *= spacing
    result: np.ndarray = steps
    return result


def rounded(values: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """Signed ``RNE_fmt(x)`` of finite float64 values (the sign reattached)."""
    result: np.ndarray = np.copysign(round_magnitudes(np.abs(values), fmt), values)
    return result
