"""The vectorised ``--precision`` loops on the values where rounding is hardest, against numpy and ml_dtypes.

For each target: exact ties (to even, up and down), the smallest subnormal and its half (a tie that flushes to
zero), the top subnormal's tie into the smallest normal, the largest value and the ties around it (saturation of
the scaled targets, overflow of the plain ones), negative zero, NaN and the infinities, float32 subnormals. The
reference rounds with ml_dtypes' (or numpy's float16) cast from float32, a single rounding, and reads each
format's limits from ``ml_dtypes.finfo``: nothing of dtypecheck's own rounding is used.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dtypecheck.dtypes import lookup
from dtypecheck.scan.blockscale import compiled_mx_loss, compiled_per_channel_loss
from dtypecheck.scan.kernel import NUMBA
from dtypecheck.scan.precision import SUB_BLOCK, Loss, compiled_cast_loss
from tests._references import ML_DTYPES_SCALAR

pytestmark = pytest.mark.skipif(not NUMBA, reason="the compiled loops need numba")

PLAIN = ("float16", "bfloat16")
SCALED = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")


def _edges(name: str) -> np.ndarray:
    """float32 edge values of target ``name`` (both signs), the IEEE specials and float32 subnormals."""
    info = ml_dtypes.finfo(ML_DTYPES_SCALAR[name])
    tiny, normal = float(info.smallest_subnormal), float(info.smallest_normal)
    top, eps = float(info.max), float(info.eps)
    ulp_top = _ulp_at_max(name)
    magnitudes = [
        tiny,
        tiny / 2,  # tie between 0 and tiny: to even, zero (an underflow)
        tiny * 0.75,
        tiny * 1.5,  # tie between 1 and 2 steps: up, to 2
        tiny * 2.5,  # tie between 2 and 3 steps: down, to 2
        normal - tiny / 2,  # the top subnormal's tie into the smallest normal (even)
        normal - tiny,
        normal,
        1.0 + eps / 2,  # tie: down to 1
        1.0 + 1.5 * eps,  # tie: up to 1 + 2 eps
        top - ulp_top / 2,  # tie below max: to even
        top,
        top + ulp_top / 2,  # tie above max: overflows when max is odd
        top + ulp_top / 4,
        top + ulp_top,
        top * 4,
    ]
    kept = [m for m in magnitudes if m <= float(np.finfo(np.float32).max)]  # (bfloat16's beyond are float32's inf)
    values = np.array(kept, dtype=np.float32)
    assert np.all(values.astype(np.float64) == np.array(kept)), "every edge is a float32"
    rng = np.random.default_rng(3)
    exponents = rng.uniform(np.log2(tiny) - 2, np.log2(top) - 2, 200)
    middle = (rng.standard_normal(200) * np.exp2(exponents)).astype(np.float32)
    specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-42, -3e-45, 1.2e-38], dtype=np.float32)
    return np.concatenate([values, -values, specials, middle])


def _reference(x: np.ndarray, name: str, *, clip: bool) -> Loss:
    """The loss of casting float32 ``x`` to ``name`` with one rounding: beyond max is an overflow, clipped to max
    (``clip``) or left out; NaN and inf are left out."""
    scalar = ML_DTYPES_SCALAR[name]
    top = float(ml_dtypes.finfo(scalar).max)
    finite = x[np.isfinite(x)].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        cast = np.abs(finite.astype(np.float32).astype(scalar).astype(np.float64))
    magnitude = np.abs(finite)
    # A cast past max gives inf or NaN, or saturates (float4 has neither): the rounding with an unbounded exponent
    # is beyond max when the cast is not finite, when the value is past the tie above max, or on that tie when
    # max is odd (ties go to even).
    ulp_top = _ulp_at_max(name)
    tie = top + ulp_top / 2
    beyond = ~np.isfinite(cast) | (magnitude > tie) | ((magnitude == tie) & _max_is_odd(name))
    if clip:
        cast = np.where(beyond, top, cast)
        kept = np.ones_like(beyond)
    else:
        kept = ~beyond
    error = np.abs(magnitude - cast)[kept]
    kept_x = magnitude[kept]
    nonzero = kept_x > 0
    return Loss(
        signal=float(np.sum(kept_x * kept_x)),
        noise=float(np.sum(error * error)),
        max_rel=float(np.max(error[nonzero] / kept_x[nonzero])),
        underflow=int(np.count_nonzero(nonzero & (cast[kept] == 0))),
        overflow=int(np.count_nonzero(beyond)),
    )


def _ulp_at_max(name: str) -> float:
    """The grid step at max: ``2**floor(log2 max) * eps``."""
    info = ml_dtypes.finfo(ML_DTYPES_SCALAR[name])
    _, exponent = np.frexp(float(info.max))
    return float(np.ldexp(float(info.eps), int(exponent) - 1))


def _max_is_odd(name: str) -> bool:
    """Whether max's last mantissa bit is set (a tie just above it then rounds away, to the next binade)."""
    scalar = ML_DTYPES_SCALAR[name]
    bits = np.array([ml_dtypes.finfo(scalar).max], dtype=scalar).view(np.uint8)[0]
    return bool(bits & 1)


def _same(got: Loss, want: Loss) -> None:
    assert (got.underflow, got.overflow) == (want.underflow, want.overflow)
    assert got.max_rel == want.max_rel
    assert got.signal == pytest.approx(want.signal, rel=1e-12, abs=0)
    assert got.noise == pytest.approx(want.noise, rel=1e-12, abs=0)


@pytest.mark.parametrize("name", PLAIN)
def test_plain_casts_on_edge_values(name: str) -> None:
    x = _edges(name)
    want = _reference(x, name, clip=False)
    assert want.overflow >= 2  # the edges really overflow and flush
    assert want.underflow >= 2
    _same(compiled_cast_loss(x, lookup(name), 0.0), want)


@pytest.mark.parametrize("name", SCALED)
def test_saturating_casts_on_edge_values(name: str) -> None:
    """With absmax == max the per-tensor factor is exactly 1: the edges meet the grid as they are."""
    x = _edges(name)
    top = float(ml_dtypes.finfo(ML_DTYPES_SCALAR[name]).max)
    want = _reference(x, name, clip=True)
    assert want.overflow >= 4
    assert want.underflow >= 2
    _same(compiled_cast_loss(x, lookup(name), top), want)


@pytest.mark.parametrize("name", SCALED)
def test_mx_blocks_of_edge_values(name: str) -> None:
    """Each MX block holds one edge value and 31 zeros, so its scale puts that value at the element format's
    top binade: the block's cast is the edge's cast times a power of two (done here in float32, exactly)."""
    edges = _edges(name)
    finite = edges[np.isfinite(edges) & (edges != 0)]
    blocks = np.zeros((finite.size, 32), dtype=np.float32)
    blocks[:, 5] = finite
    emax = int(np.frexp(float(ml_dtypes.finfo(ML_DTYPES_SCALAR[name]).max))[1]) - 1  # floor(log2 max)
    exponent = np.frexp(finite.astype(np.float64))[1] - 1  # floor(log2 |x|), exactly
    factor = np.exp2(np.clip(exponent - emax, -127, 127))  # one power of two per block: the OCP MX scale
    scaled = (finite / factor).astype(np.float32)
    assert np.all(scaled.astype(np.float64) * factor == finite), "scaling by a power of two is exact here"
    want = _reference(scaled, name, clip=True)
    got = compiled_mx_loss(blocks.reshape(-1), 32, lookup(name))
    assert (got.underflow, got.overflow, got.max_rel) == (want.underflow, want.overflow, want.max_rel)
    noise = np.sum(((np.abs(scaled.astype(np.float64)) - _cast_clipped(scaled, name)) * factor) ** 2)
    assert got.signal == pytest.approx(float(np.sum(finite.astype(np.float64) ** 2)), rel=1e-12, abs=0)
    assert got.noise == pytest.approx(float(noise), rel=1e-12, abs=0)


def _cast_clipped(x: np.ndarray, name: str) -> np.ndarray:
    scalar = ML_DTYPES_SCALAR[name]
    top = float(ml_dtypes.finfo(scalar).max)
    with np.errstate(over="ignore", invalid="ignore"):
        cast = np.abs(x.astype(scalar).astype(np.float64))
    return np.where(np.isfinite(cast) & (cast <= top), cast, top)


def test_a_rising_relative_error_is_found_in_every_group() -> None:
    """Each 4096-value group's largest relative error beats the previous one's, so the exact scalar search runs
    for every group (the vectorised pass only says when it must): the maximum is still the reference's."""
    groups = 3 * SUB_BLOCK // 4096
    rng = np.random.default_rng(5)
    x = (1.0 + rng.uniform(0, 2**-12, groups * 4096)).astype(np.float32)  # errors below half a float16 step
    for g in range(groups):  # one value per group rounding a little worse than the group before
        x[g * 4096 + 17] = np.float32(1.0 + 2**-11 * (0.5 + 0.5 * g / groups))
    assert x.dtype == np.float32
    _same(compiled_cast_loss(x, lookup("float16"), 0.0), _reference(x, "float16", clip=False))


def test_per_channel_rows_of_edge_values() -> None:
    """Rows scaled to e4m3's max by their own largest value: each row is the same edges times a power of two and
    holds 448 times it, so its scale undoes the power of two exactly and every row casts as the edges do."""
    name = "float8_e4m3fn"
    edges = _edges(name)
    finite = np.abs(edges[np.isfinite(edges)])
    row = np.concatenate([finite[finite <= 448.0], [448.0]]).astype(np.float32)
    powers = np.array([1.0, 2.0**5, 2.0**30], dtype=np.float32)
    rows = np.stack([row * power for power in powers])
    assert np.all(rows / powers[:, None] == row), "scaling by the powers of two is exact"
    want = _reference(np.tile(row, 3), name, clip=True)
    got = compiled_per_channel_loss(rows.reshape(-1), row.size, lookup(name))
    assert (got.underflow, got.overflow, got.max_rel) == (want.underflow, want.overflow, want.max_rel)
    error = np.abs(row.astype(np.float64)) - _cast_clipped(row, name)
    square = (powers.astype(np.float64) ** 2)[:, None]
    assert got.signal == pytest.approx(float(np.sum(square * row.astype(np.float64) ** 2)), rel=1e-12, abs=0)
    assert got.noise == pytest.approx(float(np.sum(square * error**2)), rel=1e-12, abs=0)
