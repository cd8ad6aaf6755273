"""Guidance rows against numpy, ml_dtypes and exact decodes of every bit pattern."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from dtypecheck.dtypes import float_specs, lookup
from dtypecheck.info import guidance
from tests.info._describe import describe_float

# Every real float format dtypecheck knows, as numpy/ml_dtypes spell it: the independent reference.
REFERENCE: dict[str, type] = {
    "float64": np.float64,
    "float32": np.float32,
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
    "float4_e2m1fn_x2": ml_dtypes.float4_e2m1fn,  # torch packs two per byte; each value is a float4_e2m1fn
}
FLOAT_NAMES = [spec.name for spec in float_specs(available_only=False)]


def test_every_float_format_has_a_reference() -> None:
    assert sorted(REFERENCE) == sorted(FLOAT_NAMES)


def _every_value(reference: type) -> np.ndarray:
    """Exact decode of every bit pattern of a format of at most 16 bits, as float64 (NaNs dropped)."""
    bits = 16 if np.dtype(reference).itemsize == 2 else 8
    patterns = np.arange(2**bits, dtype=np.uint16 if bits == 16 else np.uint8)
    if reference is ml_dtypes.float4_e2m1fn:
        patterns = patterns[:16]  # one byte holds one float4 in ml_dtypes; the top nibble is unused
    with np.errstate(invalid="ignore"):  # NaN patterns cast to float64 NaN, which is then dropped
        values = patterns.view(reference).astype(np.float64)
    return values[~np.isnan(values)]


@pytest.mark.parametrize("name", FLOAT_NAMES)
def test_unit_interval_bounds_are_representable_and_what_the_row_defines(name: str) -> None:
    """``[lo, hi]``: ``lo`` the smallest full-precision (normal) value below 1, or the smallest positive value
    where no normal lies below 1; ``hi`` the largest value below 1. Both must be values of the format."""
    reference = REFERENCE[name]
    low, high = guidance(lookup(name).fmt).unit_interval
    tiny = float(ml_dtypes.finfo(reference).smallest_normal)
    if np.dtype(reference).itemsize > 2:
        # Too many patterns to decode: the format's own neighbours of 1 and its tiny, from numpy.
        assert high == float(np.nextafter(reference(1), reference(0)))
        assert low == tiny
    else:
        values = _every_value(reference)
        below_one = np.sort(values[(values > 0) & (values < 1)])
        normal = below_one[below_one >= tiny]
        assert high == float(below_one[-1])
        assert low == float(normal[0] if normal.size else below_one[0])
    for bound in (low, high):
        assert float(reference(bound)) == bound, f"{bound} is not representable in {name}"
    assert 0 < low <= high < 1


def test_fp4_unit_interval_is_its_one_value_below_one() -> None:
    # float4_e2m1fn's values below 1 are 0 and 0.5 (a subnormal); 0.75 is not a float4 value.
    assert float(ml_dtypes.float4_e2m1fn(0.75)) != 0.75
    assert guidance(lookup("fp4").fmt).unit_interval == (0.5, 0.5)


def test_guidance_against_numpy_and_ml_dtypes() -> None:
    fp16 = describe_float("fp16").guidance
    assert fp16.adam_eps_1e_8 == float(np.float16(1e-8)) == 0.0
    assert fp16.log_clamp_min == float(np.finfo(np.float16).tiny)
    assert fp16.unit_interval[1] == float(np.nextafter(np.float16(1), np.float16(0)))
    assert fp16.exp_max_arg == math.log(65504.0)
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(np.float16(fp16.exp_max_arg + 0.01)))
    assert fp16.max_exact_integer == 2048
    assert float(np.float16(2049)) != 2049.0
    assert fp16.exp_zero_below is not None
    assert float(np.exp(np.float64(fp16.exp_zero_below) - 0.01).astype(np.float16)) == 0.0
    assert float(np.exp(np.float64(fp16.exp_zero_below) + 0.01).astype(np.float16)) > 0.0
    bf16 = describe_float("bf16").guidance
    assert bf16.adam_eps_1e_8 == float(ml_dtypes.bfloat16(1e-8))
    assert bf16.max_exact_integer == 256
    assert describe_float("e4m3").guidance.max_exact_integer == 16
    assert describe_float("fp4").guidance.max_exact_integer == 4
