"""How much precision a cast loses (``--precision``): SQNR and the largest relative error, per target.

For float16/bfloat16 targets the values are cast as they are; for float8/float4 targets after per-tensor scaling
to the target's max (``x * max / absmax``, as fp8 training and inference do); ``blockscale`` adds per-channel and
MX block scaling. Rounding is docs/contract.md's single round-to-nearest-even (``quantize``), computed in float64 on
bounded sub-blocks of a chunk, and every sum is accumulated in float64, so memory stays at a few MiB per chunk in
flight however large the tensor. Non-finite values are left out (they are counted elsewhere), and so are values
a plain cast overflows (they already fail the tensor): the measures describe the values that survive.

``sqnr_db = 10 log10(sum x^2 / sum (x - cast(x))^2)`` (``inf`` when the cast is exact, None when every value is
zero); ``max_rel_error = max |x - cast(x)| / |x|`` over the nonzero values (1.0 as soon as one flushes to zero).

With numba the same arithmetic runs value by value in one compiled loop per chunk (``cast_loss_into``, and
``blockscale``'s per-channel and MX loops), with no float64 temporaries; the numpy functions stay as the reference
the tests hold it to (equal counts and max_rel_error, sums equal up to their order of addition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dtypecheck.dtypes import DtypeSpec
from dtypecheck.scan.kernel import jit, jit_sums
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


# --- the compiled loops: value by value, the arithmetic of ``round_magnitudes`` and ``grouped_loss`` ----------

_MAGIC = float(2**52)


@jit
def rne_magnitude(a: float, mantissa_bits: int, emin: int) -> float:
    """``round_magnitudes`` for one finite, non-negative float64 (the same operations, in the same order)."""
    exponent = (np.float64(a).view(np.int64) >> 52) - 1023
    ulp_exponent = max(exponent, emin) - mantissa_bits
    inverse = np.int64((1023 - ulp_exponent) << 52).view(np.float64)
    spacing = np.int64((1023 + ulp_exponent) << 52).view(np.float64)
    steps = a * inverse
    steps += _MAGIC
    steps -= _MAGIC
    return float(steps * spacing)


_BELOW = 1.0 - 2.0**-40
"""``|e| > max_rel * _BELOW * s`` holds for every value whose rounded ``|e| / s`` exceeds ``max_rel``: a cheap
filter that leaves the exact division to the few values that can raise the maximum."""


@jit
def relative_bar(max_rel: float) -> float:
    """The bar ``group_sums`` flags relative errors above: just below ``max_rel`` (``_BELOW``), or inf once
    ``max_rel`` is 1, which nothing exceeds (a rounding never errs by more than the value itself)."""
    return max_rel * _BELOW if max_rel < 1.0 else np.inf


@jit_sums
def group_sums(
    values: np.ndarray,
    start: int,
    stop: int,
    factor: float,
    mantissa_bits: int,
    emin: int,
    fmt_max: float,
    clip: bool,
    bar: float,
) -> tuple[float, float, int, int, int]:
    """(signal, noise, underflow, overflow, candidates) of ``values[start:stop]`` times ``factor``: the loop of
    ``group_loss_into`` without a branch, so that it vectorises. A value that cannot count is zeroed rather than
    skipped; ``candidates`` counts the values whose relative error might exceed ``bar`` (``max_relative``
    finds which, exactly). Each value's terms are those of the scalar loop; only the sums' order differs."""
    signal = 0.0
    noise = 0.0
    underflow = 0
    overflow = 0
    candidates = 0
    block = values[start:stop]  # indexes from 0 are known non-negative: no wraparound test, so no gathers
    for i in range(block.shape[0]):
        a = abs(np.float64(block[i]))
        finite = a < np.inf  # NaN and inf: neither signal nor error
        a = a if finite else 0.0
        scaled = a * factor
        rounded = rne_magnitude(scaled, mantissa_bits, emin)
        beyond = rounded > fmt_max
        kept = not beyond or clip
        rounded = fmt_max if beyond else rounded
        error = abs(scaled - rounded)
        a = a if kept else 0.0
        error = error if kept else 0.0
        overflow += beyond
        underflow += kept & (rounded == 0.0) & (scaled > 0.0)
        candidates += error > bar * scaled  # (never for scaled == 0: its error is 0)
        signal += a * a
        noise += error * error
    return signal, noise, underflow, overflow, candidates


@jit
def max_relative(
    values: np.ndarray,
    start: int,
    stop: int,
    factor: float,
    mantissa_bits: int,
    emin: int,
    fmt_max: float,
    clip: bool,
    max_rel: float,
) -> float:
    """The largest of ``max_rel`` and the relative errors of ``values[start:stop]`` that ``group_sums`` keeps."""
    bar = max_rel * _BELOW
    for i in range(start, stop):
        a = abs(np.float64(values[i]))
        if not a < np.inf:
            continue
        scaled = a * factor
        rounded = rne_magnitude(scaled, mantissa_bits, emin)
        if rounded > fmt_max:
            if not clip:
                continue
            rounded = fmt_max
        error = abs(scaled - rounded)
        if error > bar * scaled:
            relative = error / scaled
            if relative > max_rel:
                max_rel = relative
                bar = max_rel * _BELOW
    return max_rel


@jit
def group_loss_into(
    values: np.ndarray,
    start: int,
    stop: int,
    factor: float,
    mantissa_bits: int,
    emin: int,
    fmt_max: float,
    clip: bool,
    out: np.ndarray,
) -> None:
    """``grouped_loss`` of ``values[start:stop]`` (any float dtype; non-finite values skipped) times ``factor``,
    added into ``out``: [signal, noise, max_rel, underflow, overflow] (float64: counts stay exact below 2**53).

    One vectorised pass (``group_sums``) sums and counts and tells whether any value's relative error may
    exceed the largest so far; only then does a scalar pass (``max_relative``) look for it. Once a tensor's
    largest relative error is found (within its first few groups, for most data) the scalar pass seldom runs.
    The noise is summed in the scaled unit and divided by ``factor**2`` once per group (numpy divides each
    error first: the sums agree to a few ulps, like any change of summation order)."""
    max_rel = out[2]
    signal, noise, underflow, overflow, candidates = group_sums(
        values, start, stop, factor, mantissa_bits, emin, fmt_max, clip, relative_bar(max_rel)
    )
    if candidates:
        out[2] = max_relative(values, start, stop, factor, mantissa_bits, emin, fmt_max, clip, max_rel)
    out[0] += signal
    out[1] += noise / (factor * factor)
    out[3] += underflow
    out[4] += overflow


@jit
def cast_loss_into(
    values: np.ndarray, factor: float, mantissa_bits: int, emin: int, fmt_max: float, clip: bool, out: np.ndarray
) -> None:
    """``plain_or_tensor_scaled`` over a whole chunk, in blocks so that each partial sum stays short."""
    n = values.shape[0]
    for start in range(0, n, 4096):
        group_loss_into(values, start, min(n, start + 4096), factor, mantissa_bits, emin, fmt_max, clip, out)


def loss_of(out: np.ndarray) -> Loss:
    return Loss(float(out[0]), float(out[1]), float(out[2]), int(out[3]), int(out[4]))


def compiled_cast_loss(values: np.ndarray, target: DtypeSpec, absmax: float) -> Loss:
    """``plain_or_tensor_scaled`` through the compiled loop."""
    fmt = target.fmt
    factor = target.scale_max / absmax if target.scaled and absmax > 0 else 1.0
    out = np.zeros(5)
    cast_loss_into(values, factor, fmt.mantissa_bits, fmt.emin, fmt.max, target.scaled, out)
    return loss_of(out)
