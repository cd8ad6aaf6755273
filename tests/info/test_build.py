"""``dtypecheck info``'s core: format values, torch.finfo mismatches, device measurements and guidance."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from dtypecheck.dtypes import lookup
from dtypecheck.info import (
    DeviceMeasurement,
    FloatInfo,
    IntInfo,
    _device_mismatches,
    describe_dtypes,
    measure,
)


def _float(name: str) -> FloatInfo:
    info = describe_dtypes([lookup(name)], devices=["cpu"]).dtypes[0]
    assert isinstance(info, FloatInfo)
    return info


@pytest.mark.parametrize(
    ("name", "ref"),
    [
        ("float64", np.finfo(np.float64)),
        ("float32", np.finfo(np.float32)),
        ("float16", np.finfo(np.float16)),
        ("bfloat16", ml_dtypes.finfo(ml_dtypes.bfloat16)),
        ("float8_e4m3fn", ml_dtypes.finfo(ml_dtypes.float8_e4m3fn)),
        ("float8_e4m3fnuz", ml_dtypes.finfo(ml_dtypes.float8_e4m3fnuz)),
        ("float8_e5m2", ml_dtypes.finfo(ml_dtypes.float8_e5m2)),
        ("float8_e5m2fnuz", ml_dtypes.finfo(ml_dtypes.float8_e5m2fnuz)),
    ],
)
def test_cpu_measurement_matches_reference(name: str, ref: object) -> None:
    cpu = _float(name).devices["cpu"]
    assert cpu.supported
    assert cpu.eps == float(ref.eps)  # type: ignore[attr-defined]
    assert cpu.max == float(ref.max)  # type: ignore[attr-defined]
    assert cpu.smallest_subnormal == float(ref.smallest_subnormal)  # type: ignore[attr-defined]
    assert cpu.subnormals == "kept"


def test_arithmetic_and_cast_methods() -> None:
    assert _float("fp16").devices["cpu"].method == "arithmetic"
    assert _float("e4m3").devices["cpu"].method == "cast"


def test_overflow_cast_behaviour_on_cpu_matches_a_direct_cast() -> None:
    # What each measured label means, checked by doing the cast directly here.
    big = torch.tensor([1e6], dtype=torch.float64)
    assert _float("fp16").devices["cpu"].overflow_cast == "inf"
    assert torch.isinf(big.to(torch.float16)).all()
    assert _float("e4m3").devices["cpu"].overflow_cast == "saturate"
    assert big.to(torch.float8_e4m3fn).double().item() == 448.0
    assert _float("e4m3fnuz").devices["cpu"].overflow_cast == "nan"
    assert torch.isnan(big.to(torch.float8_e4m3fnuz).double()).all()


def test_torch_finfo_mismatch_found_for_e5m2fnuz() -> None:
    info = _float("float8_e5m2fnuz")
    # Two stored mantissa bits: 1.00 -> 1.01 is a step of 0.25, whatever torch.finfo says.
    reported = float(torch.finfo(torch.float8_e5m2fnuz).eps)
    assert reported != 0.25
    assert [(m.field, m.torch, m.true) for m in info.mismatches] == [("eps", reported, 0.25)]
    assert _float("float16").mismatches == ()


def test_float4_is_described_although_torch_cannot_compute_with_it() -> None:
    info = _float("fp4")
    assert info.torch_finfo is None
    assert info.max == 6.0
    assert info.smallest_subnormal == 0.5
    assert not info.devices["cpu"].supported
    assert info.devices["cpu"].error


def test_device_mismatches_flag_flushing_and_disagreeing_devices() -> None:
    fmt = lookup("fp16").fmt
    good = DeviceMeasurement(True, "arithmetic", 2.0**-10, 65504.0, 2.0**-24, "kept", "inf")
    flushing = DeviceMeasurement(True, "arithmetic", 2.0**-10, 65504.0, 2.0**-14, "flushed", "saturate")
    found = _device_mismatches(fmt, {"cpu": good, "cuda:0": flushing})
    fields = {(m.device, m.field, m.against) for m in found}
    assert ("cuda:0", "subnormals", "format") in fields
    assert ("cuda:0", "smallest_subnormal", "format") in fields
    assert ("cuda:0", "overflow_cast", "format") in fields
    assert ("cuda:0", "subnormals", "cpu") in fields
    assert not any(m.device == "cpu" for m in found)


def test_guidance_against_numpy_and_ml_dtypes() -> None:
    fp16 = _float("fp16").guidance
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
    bf16 = _float("bf16").guidance
    assert bf16.adam_eps_1e_8 == float(ml_dtypes.bfloat16(1e-8))
    assert bf16.max_exact_integer == 256
    assert _float("e4m3").guidance.max_exact_integer == 16
    assert _float("fp4").guidance.max_exact_integer == 4
    assert _float("fp4").guidance.unit_interval == (0.5, 0.75)


def test_integer_info_and_iinfo_gaps() -> None:
    report = describe_dtypes([lookup("int8"), lookup("int4"), lookup("bool"), lookup("qint8")], devices=["cpu"])
    int8, int4, boolean, qint8 = report.dtypes
    assert isinstance(int8, IntInfo)
    assert (int8.min, int8.max, int8.bits) == (-128, 127, 8)
    assert int8.torch_iinfo == {"bits": 8, "min": -128, "max": 127}
    assert isinstance(int4, IntInfo)
    assert (int4.min, int4.max) == (-8, 7)
    assert int4.torch_iinfo is None  # torch.iinfo raises for sub-byte integers
    assert isinstance(boolean, IntInfo)
    assert (boolean.kind, boolean.min, boolean.max) == ("bool", 0, 1)
    assert isinstance(qint8, IntInfo)
    assert qint8.quantized


def test_default_is_every_available_float_dtype() -> None:
    names = [d.name for d in describe_dtypes(devices=["cpu"]).dtypes]
    assert names[:4] == ["float64", "float32", "bfloat16", "float16"]
    assert "float8_e4m3fn" in names
    assert all(isinstance(d, FloatInfo) and d.kind == "float" for d in describe_dtypes(devices=["cpu"]).dtypes)


def test_complex_describes_its_component() -> None:
    info = _float("complex64")
    assert (info.kind, info.bits, info.eps) == ("complex", 64, float(np.finfo(np.complex64).eps))
    assert info.devices["cpu"].max == float(np.finfo(np.float32).max)


def test_measure_unsupported_device_is_reported_not_raised() -> None:
    result = measure(lookup("fp4"), "cpu")
    assert (result.supported, result.eps, result.max) == (False, None, None)
