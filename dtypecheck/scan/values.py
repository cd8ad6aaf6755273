"""Turning a chunk into numbers: float chunks into the kernel's float32/float64 values, integer chunks into
their statistics (numpy; integers need no fused kernel: their checkpoints' integer tensors are small)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dtypecheck.dtypes import DtypeSpec, FloatFormat, spec_of
from dtypecheck.scan.thresholds import FLOAT64, KernelFormat

if TYPE_CHECKING:
    import torch

    from dtypecheck.scan.measures import Losses


@dataclass(frozen=True)
class ChunkResult:
    values: int
    hist: np.ndarray | None = None
    counts: np.ndarray | None = None
    extrema: np.ndarray | None = None
    int_overflow: tuple[int, ...] = ()
    int_stats: tuple[int, int, int, int | None] | None = None
    """Integer tensors: (min, max, zeros, smallest nonzero magnitude)."""
    double_rounding: tuple[int, ...] = ()
    """float64 chunks: per target cast through float32, values whose result differs from a single rounding."""
    losses: Losses | None = None
    """``--precision``: the plain casts' losses over this chunk (``MeasurePlan.measure_unscaled``)."""


def float4_table(fmt: FloatFormat) -> np.ndarray:
    """The value of every 4-bit pattern of a ``none``-encoded float4 (no inf, no NaN)."""
    values = []
    for code in range(16):
        sign = -1.0 if code >> 3 else 1.0
        exponent = (code >> fmt.mantissa_bits) & ((1 << fmt.exponent_bits) - 1)
        fraction = code & ((1 << fmt.mantissa_bits) - 1)
        if exponent == 0:
            magnitude = fraction * 2.0 ** (fmt.emin - fmt.mantissa_bits)
        else:
            magnitude = (1 + fraction / (1 << fmt.mantissa_bits)) * 2.0 ** (exponent - fmt.exponent_bias)
        values.append(sign * magnitude)
    return np.array(values, dtype=np.float32)


def float_values(chunk: torch.Tensor | np.ndarray, kernel: KernelFormat, float4: np.ndarray | None) -> np.ndarray:
    """The chunk's values as a flat float32 (float64 for 64-bit formats) array: every conversion is exact;
    complex chunks give their real and imaginary parts, float4 chunks both values of each byte. A numpy chunk
    is float16, float32 or float64 (``NUMPY_DTYPES``), or uint16 holding bfloat16 bit patterns: bfloat16 is
    float32 without its low 16 bits, so shifting them back in is the exact conversion."""
    if isinstance(chunk, np.ndarray):  # read by numpy (``MappedSource`` arrays): no torch needed
        flat = chunk.reshape(-1)
        if flat.dtype == np.uint16:
            widened: np.ndarray = (flat.astype(np.uint32) << np.uint32(16)).view(np.float32)
            return widened
        kernel_dtype = np.float64 if kernel is FLOAT64 else np.float32
        return flat if flat.dtype == kernel_dtype else flat.astype(kernel_dtype)
    import torch

    if float4 is not None:
        packed = chunk.view(getattr(torch, spec_of(chunk.dtype).storage_dtype)).numpy()
        return np.concatenate([float4[packed & 15], float4[packed >> 4]])
    if chunk.is_complex():
        chunk = torch.view_as_real(chunk).reshape(-1)
    wanted = torch.float64 if kernel is FLOAT64 else torch.float32
    if chunk.dtype != wanted:
        chunk = chunk.to(wanted)
    return chunk.contiguous().numpy()


def float_to_int_overflow(values: np.ndarray, target: DtypeSpec) -> int:
    """``trunc(x) > hi`` is ``x >= hi + 1``, and ``trunc(x) < lo`` is tested as such; both bounds are powers of
    two (or 0), exact in every float format. Infinities are counted here and removed by the caller."""
    assert target.int_range is not None
    low, high = target.int_range
    with np.errstate(invalid="ignore"):
        above = np.count_nonzero(values >= float(high + 1))
        below = np.count_nonzero(np.trunc(values) < float(low))
    return int(above + below)


def integer_chunk(chunk: torch.Tensor | np.ndarray, targets: Sequence[DtypeSpec]) -> ChunkResult:
    """min, max, zeros, smallest nonzero magnitude and each integer target's overflow count of one chunk."""
    if isinstance(chunk, np.ndarray):
        values = chunk.reshape(-1).view(np.uint8) if chunk.dtype == np.bool_ else chunk.reshape(-1)
    else:
        import torch

        storage = spec_of(chunk.dtype).storage_dtype  # numpy has no view of bool's bits
        if str(chunk.dtype) != f"torch.{storage}":
            chunk = chunk.view(getattr(torch, storage))
        values = chunk.numpy()
    if values.size == 0:
        return ChunkResult(values=0)
    info = np.iinfo(values.dtype)
    magnitudes = []
    if np.any(values > 0):
        magnitudes.append(int(np.min(values, where=values > 0, initial=info.max)))
    if info.min < 0 and np.any(values < 0):
        magnitudes.append(-int(np.max(values, where=values < 0, initial=info.min)))
    zeros = int(np.count_nonzero(values == 0))
    stats = (int(values.min()), int(values.max()), zeros, min(magnitudes, default=None))
    overflow = []
    for target in targets:
        assert target.int_range is not None
        low, high = target.int_range
        count = 0
        if high < info.max:  # (comparing with a bound outside the dtype's range would not even convert)
            count += int(np.count_nonzero(values > high))
        if low > info.min:
            count += int(np.count_nonzero(values < low))
        overflow.append(count)
    return ChunkResult(values=values.size, int_overflow=tuple(overflow), int_stats=stats)
