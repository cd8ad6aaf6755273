"""Where a cast's verdict changes, as exact rationals, and as bit patterns of the format the kernel reads.

``cast_edges`` derives, from ``dtypes.FloatFormat`` alone, the magnitudes at which docs/contract.md's rounding rule
(round-to-nearest-even, exponent unbounded above) flushes a value to zero, starts giving a normal, and
overflows, ties included:

- a value of exactly half the smallest subnormal is a tie between 0 and the smallest subnormal: 0 is even, so
  it flushes;
- a value half a subnormal step below the smallest normal ties between the largest subnormal (odd) and the
  smallest normal (even): it becomes normal;
- a value half an ulp above ``max`` ties between ``max`` and the next grid value. It overflows when ``max``'s
  integer significand is odd (float16: 65520 -> 65536), and stays ``max`` when it is even (float8_e4m3fn,
  whose top mantissa pattern is NaN: 464 -> 448).

``KernelFormat.first_magnitude`` turns such an edge into the first magnitude bit pattern of float32/float64 on
the far side of it, so the kernel only ever compares integers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Any, Literal

import numpy as np

from dtypecheck.dtypes import DtypeSpec, FloatFormat, lookup


@dataclass(frozen=True)
class CastEdges:
    """Exact magnitudes where casting to one float format changes verdict."""

    flush_max: Fraction
    """``0 < |x| <= flush_max`` rounds to zero (underflow)."""
    normal_min: Fraction
    """``|x| >= normal_min`` rounds to a normal number or beyond (below it, and above ``flush_max``: subnormal)."""
    overflow_at: Fraction
    """The tie between ``max`` and the next grid value above it."""
    overflow_inclusive: bool
    """Whether the tie itself overflows (``max``'s significand is odd) or stays ``max`` (even)."""


def cast_edges(fmt: FloatFormat) -> CastEdges:
    """The rounding edges of ``fmt`` under round-to-nearest-even with an unbounded exponent."""
    step_at_bottom = Fraction(2) ** (fmt.emin - fmt.mantissa_bits)  # subnormal spacing (normal, without them)
    flush_max = step_at_bottom / 2
    normal_min = max(Fraction(fmt.smallest_normal) - step_at_bottom / 2, flush_max)
    ulp_at_max = Fraction(2) ** (fmt.emax - fmt.mantissa_bits)
    significand = Fraction(fmt.max) / ulp_at_max
    if significand.denominator != 1:
        raise AssertionError(f"max of {fmt} is off its own grid")
    return CastEdges(
        flush_max=flush_max,
        normal_min=normal_min,
        overflow_at=Fraction(fmt.max) + ulp_at_max / 2,
        overflow_inclusive=significand.numerator % 2 == 1,
    )


@dataclass(frozen=True)
class KernelFormat:
    """float32 or float64 seen as integers: what every chunk is converted to before the kernel reads it."""

    name: Literal["float32", "float64"]

    @property
    def fmt(self) -> FloatFormat:
        return lookup(self.name).fmt

    @property
    def bits(self) -> int:
        return self.fmt.bits

    @property
    def int_dtype(self) -> type[np.signedinteger]:
        return np.int32 if self.name == "float32" else np.int64

    @property
    def float_dtype(self) -> type[np.floating]:
        return np.float32 if self.name == "float32" else np.float64

    @property
    def shift(self) -> int:
        """Right shift from a magnitude pattern to its exponent field (the histogram bin)."""
        return self.fmt.mantissa_bits

    @property
    def mask(self) -> int:
        return (1 << (self.bits - 1)) - 1

    @property
    def inf_bits(self) -> int:
        return ((1 << self.fmt.exponent_bits) - 1) << self.fmt.mantissa_bits

    @property
    def bins(self) -> int:
        return 1 << self.fmt.exponent_bits

    def scalar(self, value: int) -> Any:
        """A numpy scalar of the kernel's integer type (so numba types every operand alike)."""
        return self.int_dtype(value)

    def value_of(self, magnitude: int) -> Fraction | None:
        """The exact value of a magnitude pattern (None for inf; NaN patterns are never asked for)."""
        if magnitude >= self.inf_bits:
            return None
        code = "<I" if self.bits == 32 else "<Q"
        as_float = struct.unpack("<f" if self.bits == 32 else "<d", struct.pack(code, magnitude))[0]
        return Fraction(as_float)

    def first_magnitude(self, edge: Fraction, *, inclusive: bool) -> int:
        """The smallest magnitude pattern whose value is ``>= edge`` (``> edge`` when not inclusive); the inf
        pattern when no finite value is."""
        low, high = 0, self.inf_bits  # answer in [low, high]
        while low < high:
            middle = (low + high) // 2
            value = self.value_of(middle)
            beyond = value is None or (value >= edge if inclusive else value > edge)
            if beyond:
                high = middle
            else:
                low = middle + 1
        return low

    def float_of_key(self, key: int) -> float:
        """Undo the kernel's sign folding (``b ^ ((b >> sign) & mask)`` is its own inverse) into a float."""
        pattern = np.array([key], dtype=self.int_dtype)
        pattern ^= (pattern >> (self.bits - 1)) & self.int_dtype(self.mask)
        return float(pattern.view(self.float_dtype)[0])

    def float_of_magnitude(self, magnitude: int) -> float:
        return float(np.array([magnitude], dtype=self.int_dtype).view(self.float_dtype)[0])

    def binade_of_bin(self, index: int) -> int:
        """``floor(log2|x|)`` of the values in a histogram bin of normal numbers."""
        return index - self.fmt.exponent_bias


FLOAT32 = KernelFormat("float32")
FLOAT64 = KernelFormat("float64")


@dataclass(frozen=True)
class TargetPatterns:
    """A float target's edges as kernel magnitude patterns (counts are differences of ``#(|x| >= p)``)."""

    survive: int
    """First magnitude that does not flush to zero."""
    normal: int
    """First magnitude that rounds to a normal."""
    overflow: int
    """First magnitude that overflows (the inf pattern when no finite value does)."""


@cache
def target_patterns(target: FloatFormat, kernel: KernelFormat) -> TargetPatterns:
    """A target's bit-pattern thresholds in a kernel format (exact, with fractions; cached: a checkpoint of 100,000
    tensors asks for the same few)."""
    edges = cast_edges(target)
    survive = kernel.first_magnitude(edges.flush_max, inclusive=False)
    return TargetPatterns(
        survive=survive,
        normal=max(survive, kernel.first_magnitude(edges.normal_min, inclusive=True)),
        overflow=kernel.first_magnitude(edges.overflow_at, inclusive=edges.overflow_inclusive),
    )


@cache
def normal_threshold(own: FloatFormat, kernel: KernelFormat) -> int:
    """The first kernel bit pattern at or above ``own``'s smallest normal (cached, as ``target_patterns``)."""
    return kernel.first_magnitude(Fraction(own.smallest_normal), inclusive=True)


def scaled_survive_pattern(target: DtypeSpec, kernel: KernelFormat, absmax: float) -> int:
    """First magnitude that survives a cast to ``target`` after scaling the tensor by ``target.max / absmax``.

    ``|x| * max / absmax <= flush_max`` exactly when ``|x| <= flush_max * absmax / max``: no rounding of the
    scale factor enters the count.
    """
    edge = cast_edges(target.fmt).flush_max * Fraction(absmax) / Fraction(target.scale_max)
    return kernel.first_magnitude(edge, inclusive=False)
