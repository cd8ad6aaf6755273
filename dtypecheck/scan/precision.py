"""How much precision a cast loses (``--precision``): SQNR and the largest relative error, per target.

For float16/bfloat16 targets the values are cast as they are; for float8/float4 targets after per-tensor scaling
to the target's max (``x * max / absmax``, as fp8 training and inference do); ``blockscale`` adds per-channel and
MX block scaling. Rounding is docs/contract.md's single round-to-nearest-even (``quantize``), computed in float64 on
bounded sub-blocks of a chunk, and every sum is accumulated in float64, so memory stays at a few MiB per chunk in
flight however large the tensor. Non-finite values are left out (they are counted elsewhere), and so are values
a plain cast overflows (they already fail the tensor): the measures describe the values that survive.

``sqnr_db = 10 log10(sum x^2 / sum (x - cast(x))^2)`` (``inf`` when the cast is exact, None when every value is
zero); ``max_rel_error = max |x - cast(x)| / |x|`` over the nonzero values (1.0 as soon as one flushes to zero).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dtypecheck.dtypes import DtypeSpec
from dtypecheck.scan.quantize import round_magnitudes

SUB_BLOCK = 1 << 16
"""Values per float64 working block: its temporaries stay in cache and bound each chunk's extra memory."""


@dataclass
class Loss:
    """Partial sums of one cast's error over some of a tensor's values (merged across chunks with ``add``)."""

    signal: float = 0.0
    """``sum x^2`` over the values measured (in any fixed unit: the ratio does not depend on it)."""
    noise: float = 0.0
    """``sum (x - cast(x))^2`` in the same unit."""
    max_rel: float = 0.0
    underflow: int = 0
    """Nonzero values that became zero."""
    overflow: int = 0
    """Values beyond the target's max (clipped where the scheme clips, else left out)."""

    def add(self, other: Loss) -> None:
        self.signal += other.signal
        self.noise += other.noise
        self.max_rel = max(self.max_rel, other.max_rel)
        self.underflow += other.underflow
        self.overflow += other.overflow

    @property
    def sqnr_db(self) -> float | None:
        if self.signal == 0.0:
            return None
        if self.noise == 0.0:
            return math.inf
        return 10.0 * math.log10(self.signal / self.noise)

    @property
    def max_rel_error(self) -> float | None:
        return None if self.signal == 0.0 else self.max_rel


def grouped_loss(magnitudes: np.ndarray, factors: np.ndarray | float, target: DtypeSpec, *, clip: bool) -> Loss:
    """The loss of casting ``magnitudes * factors`` (finite, non-negative float64; ``factors`` broadcast per
    group) to ``target``, measured back in the unit of ``magnitudes``.

    ``clip``: values rounding beyond max become max (scaled casts saturate), and are counted as overflow; else
    they are counted and left out of the sums (a plain cast turns them into inf).
    """
    fmt = target.fmt
    scaled = magnitudes * factors
    rounded = round_magnitudes(scaled, fmt)
    beyond = rounded > fmt.max
    overflow = int(np.count_nonzero(beyond))
    signal_values = magnitudes
    if overflow:
        if clip:
            rounded[beyond] = fmt.max
        else:
            keep = ~beyond
            rounded, scaled = rounded[keep], scaled[keep]
            signal_values = magnitudes[keep]
            factors = factors[keep] if isinstance(factors, np.ndarray) else factors
    error = scaled - rounded
    nonzero = scaled > 0
    underflow = int(np.count_nonzero(nonzero & (rounded == 0)))
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = np.abs(error) / scaled
    max_rel = float(relative[nonzero].max()) if nonzero.any() else 0.0
    error /= factors
    signal_flat, error_flat = signal_values.ravel(), error.ravel()
    return Loss(
        signal=float(np.dot(signal_flat, signal_flat)),
        noise=float(np.dot(error_flat, error_flat)),
        max_rel=max_rel,
        underflow=underflow,
        overflow=overflow,
    )


def finite_magnitudes(values: np.ndarray) -> np.ndarray:
    """``|x|`` as float64 with NaN and inf replaced by 0 (they are neither signal nor error)."""
    magnitudes = np.abs(values.astype(np.float64, copy=False))
    finite = np.isfinite(magnitudes)
    if not finite.all():
        magnitudes = np.where(finite, magnitudes, 0.0)
    return magnitudes


def plain_or_tensor_scaled(values: np.ndarray, target: DtypeSpec, absmax: float) -> Loss:
    """The loss of the cast a scan judges: plain for unscaled targets, per-tensor scaled for float8/float4."""
    total = Loss()
    factor = target.scale_max / absmax if target.scaled and absmax > 0 else 1.0
    for start in range(0, values.shape[0], SUB_BLOCK):
        block = finite_magnitudes(values[start : start + SUB_BLOCK])
        total.add(grouped_loss(block, factor, target, clip=target.scaled))
    return total
