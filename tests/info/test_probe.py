"""Device measurements: each value measured on the CPU against numpy/ml_dtypes and direct torch casts."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from dtypecheck.dtypes import lookup
from dtypecheck.info import DeviceMeasurement, measure
from dtypecheck.info.probe import device_mismatches
from tests.info._describe import describe_float


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
    cpu = describe_float(name).devices["cpu"]
    assert cpu.supported
    assert cpu.eps == float(ref.eps)  # type: ignore[attr-defined]
    assert cpu.max == float(ref.max)  # type: ignore[attr-defined]
    assert cpu.smallest_subnormal == float(ref.smallest_subnormal)  # type: ignore[attr-defined]
    assert cpu.subnormals == "kept"


def test_arithmetic_and_cast_methods() -> None:
    assert describe_float("fp16").devices["cpu"].method == "arithmetic"
    assert describe_float("e4m3").devices["cpu"].method == "cast"


def test_overflow_cast_behaviour_on_cpu_matches_a_direct_cast() -> None:
    # What each measured label means, checked by doing the cast directly here.
    big = torch.tensor([1e6], dtype=torch.float64)
    assert describe_float("fp16").devices["cpu"].overflow_cast == "inf"
    assert torch.isinf(big.to(torch.float16)).all()
    assert describe_float("e4m3").devices["cpu"].overflow_cast == "saturate"
    assert big.to(torch.float8_e4m3fn).double().item() == 448.0
    assert describe_float("e4m3fnuz").devices["cpu"].overflow_cast == "nan"
    assert torch.isnan(big.to(torch.float8_e4m3fnuz).double()).all()


def test_device_mismatches_flag_flushing_and_disagreeing_devices() -> None:
    fmt = lookup("fp16").fmt
    good = DeviceMeasurement(True, "arithmetic", 2.0**-10, 65504.0, 2.0**-24, "kept", "inf")
    flushing = DeviceMeasurement(True, "arithmetic", 2.0**-10, 65504.0, 2.0**-14, "flushed", "saturate")
    found = device_mismatches(fmt, {"cpu": good, "cuda:0": flushing})
    fields = {(m.device, m.field, m.against) for m in found}
    assert ("cuda:0", "subnormals", "format") in fields
    assert ("cuda:0", "smallest_subnormal", "format") in fields
    assert ("cuda:0", "overflow_cast", "format") in fields
    assert ("cuda:0", "subnormals", "cpu") in fields
    assert not any(m.device == "cpu" for m in found)


def test_measure_unsupported_device_is_reported_not_raised() -> None:
    result = measure(lookup("fp4"), "cpu")
    assert (result.supported, result.eps, result.max) == (False, None, None)


@pytest.mark.skipif(not hasattr(torch, "float8_e8m0fnu"), reason="this torch has no float8_e8m0fnu")
def test_what_torch_makes_of_zero_and_negatives_in_e8m0_is_measured() -> None:
    cpu = describe_float("e8m0").devices["cpu"]
    direct = torch.tensor([0.0, -1.0], dtype=torch.float64).to(torch.float8_e8m0fnu).double().tolist()
    assert (cpu.zero_cast, cpu.negative_cast) == (direct[0], direct[1])
    # Neither is what was asked for: e8m0 has no 0 and no -1 to give.
    assert cpu.zero_cast != 0.0
    assert cpu.negative_cast != -1.0
    fp16 = describe_float("fp16").devices["cpu"]
    assert (fp16.zero_cast, fp16.negative_cast) == (None, None)
