"""Finer-grained scaling for float8/float4 targets (``--precision``): per output channel, and OCP MX blocks.

- **per channel**: every row along dim 0 (an output channel of a ``Linear``/``Conv`` weight) is scaled by
  ``max / rowmax`` before the cast, as per-channel fp8 weight quantisation does;
- **MX** (OCP Microscaling Formats v1.0): 32 consecutive values along the last dimension share one scale, a power
  of two stored as e8m0: ``X = 2**(floor(log2(blockmax)) - emax_elem)`` (``emax_elem``: the element format's
  largest exponent, 8 for e4m3, 15 for e5m2, 2 for e2m1), clamped to e8m0's ``2**-127 .. 2**127``. Each value
  becomes ``cast(x / X)``; the block's largest value can round beyond the element's max (1.9 * 2**8 for e4m3):
  such values are clipped to max, as the spec's conversion does, and counted as ``overflow``. A last dimension
  that is not a multiple of 32 ends each row with a shorter block (padded with zeros, which change nothing).

Both need whole rows in a chunk: ``chunk_unit`` says how many values a chunk must be a multiple of, and
``regroup`` re-cuts a tensor's chunks to it (one copy only where a source chunk ends mid-row).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from dtypecheck.dtypes import DtypeSpec
from dtypecheck.scan.kernel import jit, jit_sums
from dtypecheck.scan.precision import (
    SUB_BLOCK,
    Loss,
    finite_magnitudes,
    group_loss_into,
    group_sums,
    grouped_loss,
    loss_of,
    max_relative,
    relative_bar,
)

if TYPE_CHECKING:
    import torch

MX_BLOCK = 32
"""Values per MX block (OCP MX v1.0: every concrete MX format uses k = 32)."""
E8M0_EXPONENTS = (-127, 127)
"""The exponents an e8m0 scale can hold (the all-ones pattern is NaN)."""
MAX_ROW_VALUES = 1 << 22
"""Rows longer than this are not regrouped (a chunk must hold whole rows): per-channel is then not measured."""


def chunk_unit(shape: tuple[int, ...], values_per_element: int) -> tuple[int | None, int | None]:
    """(values per dim-0 row, values per last-dim row) this tensor's chunks are cut to, each None where the
    scheme is not measured: per channel needs two dimensions and a row of at most ``MAX_ROW_VALUES``; MX needs a
    last dimension of at most ``MAX_ROW_VALUES`` or a multiple of 32."""
    if not shape or values_per_element != 1:
        return None, None
    numel = 1
    for size in shape:
        numel *= size
    if numel == 0:
        return None, None
    channel = numel // shape[0] if len(shape) >= 2 and numel // shape[0] <= MAX_ROW_VALUES else None
    last = shape[-1]
    if last > MAX_ROW_VALUES:
        return channel, (MX_BLOCK if last % MX_BLOCK == 0 else None)
    return channel, last


def regroup(chunks: Iterator[torch.Tensor], unit: int) -> Iterator[torch.Tensor]:
    """``chunks`` re-cut so that each holds a whole number of ``unit`` elements (at least one unit)."""
    import torch

    carry: list[torch.Tensor] = []
    carried = 0
    for chunk in chunks:
        if carried == 0 and chunk.numel() % unit == 0:
            yield chunk
            continue
        carry.append(chunk)
        carried += chunk.numel()
        whole = carried - carried % unit
        if whole == 0:
            continue
        joined = torch.cat(carry)
        yield joined[:whole]
        rest = joined[whole:]
        carry, carried = ([rest.clone()], rest.numel()) if rest.numel() else ([], 0)
    if carried:
        yield torch.cat(carry)


def per_channel_loss(values: np.ndarray, row: int, target: DtypeSpec) -> Loss:
    """The loss of casting whole dim-0 rows of ``values`` each scaled by ``max / rowmax``."""
    total = Loss()
    rows = values.reshape(-1, row)
    step = max(1, SUB_BLOCK // row)
    for start in range(0, rows.shape[0], step):
        block = finite_magnitudes(rows[start : start + step])
        rowmax = block.max(axis=1, keepdims=True)
        with np.errstate(divide="ignore"):
            factors = np.where(rowmax > 0, target.scale_max / rowmax, 1.0)
        total.add(grouped_loss(block, factors, target, clip=True))
    return total


def mx_factors(blockmax: np.ndarray, target: DtypeSpec) -> np.ndarray:
    """``1 / X`` per block: ``X = 2**clamp(floor(log2 blockmax) - emax_elem)`` (1 for an all-zero block)."""
    exponent = (blockmax.view(np.int64) >> 52) - 1023  # floor(log2) of a normal float64, exactly
    shared = np.clip(exponent - target.fmt.emax, *E8M0_EXPONENTS)
    return np.where(blockmax > 0, np.ldexp(1.0, -shared), 1.0)


def mx_loss(values: np.ndarray, last: int, target: DtypeSpec) -> Loss:
    """The loss of casting ``values`` (whole rows of ``last`` values) in 32-value MX blocks."""
    total = Loss()
    rows = values.reshape(-1, last)
    padded = -last % MX_BLOCK
    step = max(1, SUB_BLOCK // (last + padded))
    for start in range(0, rows.shape[0], step):
        block = finite_magnitudes(rows[start : start + step])
        if padded:
            block = np.pad(block, ((0, 0), (0, padded)))
        blocks = block.reshape(-1, MX_BLOCK)
        blockmax = np.ascontiguousarray(blocks.max(axis=1, keepdims=True))
        total.add(grouped_loss(blocks, mx_factors(blockmax, target), target, clip=True))
    return total


# --- the compiled loops (``precision.group_loss_into`` per row or block; the numpy functions above are the reference)


@jit
def _finite_max(values: np.ndarray, start: int, stop: int) -> float:
    """The largest finite magnitude of ``values[start:stop]`` (0.0 when none), as the largest bit pattern: a
    float maximum would not vectorise (it must keep NaN's ordering), non-negative floats order as integers."""
    best = 0
    block = values[start:stop]  # (indexes from 0: no wraparound test, the loop vectorises)
    for i in range(block.shape[0]):
        a = abs(np.float64(block[i]))
        finite = np.float64(a if a < np.inf else 0.0)
        best = max(best, finite.view(np.int64))
    found = np.int64(best)
    return float(found.view(np.float64))


@jit
def _per_channel_into(
    values: np.ndarray, row: int, scale_max: float, mantissa_bits: int, emin: int, fmt_max: float, out: np.ndarray
) -> None:
    for start in range(0, values.shape[0] - row + 1, row):
        rowmax = _finite_max(values, start, start + row)
        factor = scale_max / rowmax if rowmax > 0.0 else 1.0
        group_loss_into(values, start, start + row, factor, mantissa_bits, emin, fmt_max, True, out)


@jit
def _mx_factor(values: np.ndarray, start: int, stop: int, emax: int) -> float:
    """``mx_factors``: 1 / 2**clamp(floor(log2 blockmax) - emax, e8m0's exponents), 1 for an all-zero block."""
    blockmax = _finite_max(values, start, stop)
    if blockmax == 0.0:
        return 1.0
    exponent = (np.float64(blockmax).view(np.int64) >> 52) - 1023
    shared = min(max(exponent - emax, E8M0_EXPONENTS[0]), E8M0_EXPONENTS[1])
    factor: float = np.int64((1023 - shared) << 52).view(np.float64)
    return factor


@jit_sums
def _mx_row_sums(
    values: np.ndarray, row: int, last: int, emax: int, mantissa_bits: int, emin: int, fmt_max: float, bar: float
) -> tuple[float, float, int, int, int]:
    """``group_sums`` of every MX block of one row, added up (one call per row, not per 32 values)."""
    signal = 0.0
    noise = 0.0
    underflow = 0
    overflow = 0
    candidates = 0
    for start in range(row, row + last, MX_BLOCK):
        stop = min(start + MX_BLOCK, row + last)
        factor = _mx_factor(values, start, stop, emax)
        sums = group_sums(values, start, stop, factor, mantissa_bits, emin, fmt_max, True, bar)
        signal += sums[0]
        noise += sums[1] / (factor * factor)  # (a power of two: exact)
        underflow += sums[2]
        overflow += sums[3]
        candidates += sums[4]
    return signal, noise, underflow, overflow, candidates


@jit
def _mx_into(
    values: np.ndarray, last: int, emax: int, mantissa_bits: int, emin: int, fmt_max: float, out: np.ndarray
) -> None:
    for row in range(0, values.shape[0] - last + 1, last):
        bar = relative_bar(out[2])
        signal, noise, underflow, overflow, candidates = _mx_row_sums(
            values, row, last, emax, mantissa_bits, emin, fmt_max, bar
        )
        if candidates:
            for start in range(row, row + last, MX_BLOCK):
                stop = min(start + MX_BLOCK, row + last)
                factor = _mx_factor(values, start, stop, emax)
                out[2] = max_relative(values, start, stop, factor, mantissa_bits, emin, fmt_max, True, out[2])
        out[0] += signal
        out[1] += noise
        out[3] += underflow
        out[4] += overflow


def compiled_per_channel_loss(values: np.ndarray, row: int, target: DtypeSpec) -> Loss:
    """``per_channel_loss`` through the compiled loop."""
    out = np.zeros(5)
    fmt = target.fmt
    _per_channel_into(values, row, target.scale_max, fmt.mantissa_bits, fmt.emin, fmt.max, out)
    return loss_of(out)


def compiled_mx_loss(values: np.ndarray, last: int, target: DtypeSpec) -> Loss:
    """``mx_loss`` through the compiled loop."""
    out = np.zeros(5)
    fmt = target.fmt
    _mx_into(values, last, fmt.emax, fmt.mantissa_bits, fmt.emin, fmt.max, out)
    return loss_of(out)
