"""True values from the bit layout against torch.finfo/torch.iinfo."""

from __future__ import annotations

import torch

from dtypecheck.dtypes import lookup
from dtypecheck.info import Mismatch
from dtypecheck.info.formats import mismatches, torch_finfo, true_finfo
from tests.info._describe import describe_float


def test_torch_finfo_mismatch_found_for_e5m2fnuz() -> None:
    info = describe_float("float8_e5m2fnuz")
    # Two stored mantissa bits: 1.00 -> 1.01 is a step of 0.25, whatever torch.finfo says.
    reported = float(torch.finfo(torch.float8_e5m2fnuz).eps)
    assert reported != 0.25
    assert [(m.field, m.torch, m.true) for m in info.mismatches] == [("eps", reported, 0.25)]
    assert describe_float("float16").mismatches == ()


def test_true_finfo_of_float16_is_numpys_and_torch_agrees() -> None:
    truth = true_finfo(lookup("fp16").fmt)
    assert truth == {
        "bits": 16,
        "eps": 2.0**-10,
        "max": 65504.0,
        "min": -65504.0,
        "smallest_normal": 2.0**-14,
        "resolution": 0.001,
    }
    assert mismatches(torch_finfo(torch.float16), truth) == ()
    assert mismatches({"eps": 0.5}, truth) == (Mismatch("eps", 0.5, 2.0**-10),)
    assert mismatches(None, truth) == ()


def test_float4_is_described_although_torch_cannot_compute_with_it() -> None:
    info = describe_float("fp4")
    assert info.torch_finfo is None
    assert info.max == 6.0
    assert info.smallest_subnormal == 0.5
    assert not info.devices["cpu"].supported
    assert info.devices["cpu"].error
