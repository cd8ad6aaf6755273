"""Assembling the info report: integer facts, the default dtype set, complex components, what a format lacks."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import ml_dtypes
import numpy as np

from dtypecheck.dtypes import lookup
from dtypecheck.info import (
    DeviceMeasurement,
    DtypeList,
    DtypeName,
    FloatInfo,
    Guidance,
    InfoReport,
    IntInfo,
    describe_dtypes,
)
from tests.info._describe import describe_float


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
    info = describe_float("complex64")
    assert (info.kind, info.bits, info.eps) == ("complex", 64, float(np.finfo(np.complex64).eps))
    assert info.devices["cpu"].max == float(np.finfo(np.float32).max)


def test_e8m0_states_it_has_no_zero_and_no_negatives() -> None:
    e8m0 = describe_float("e8m0")
    # Decode all 256 patterns: no zero and nothing negative among e8m0's values, unlike float8_e4m3fn's.
    values = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    finite = values[~np.isnan(values)]
    assert (e8m0.has_zero, e8m0.has_negative) == (bool((finite == 0).any()), bool((finite < 0).any())) == (False, False)
    assert e8m0.min == float(finite.min()) == 2.0**-127
    e4m3 = describe_float("e4m3")
    e4m3_values = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert (e4m3.has_zero, e4m3.has_negative) == (bool((e4m3_values == 0).any()), bool((e4m3_values < 0).any()))
    assert (e4m3.has_zero, e4m3.has_negative) == (True, True)


def test_every_info_json_field_is_documented() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "json.md").read_text(encoding="utf-8")
    for report in (FloatInfo, IntInfo, DeviceMeasurement, Guidance, InfoReport, DtypeName, DtypeList):
        for field in dataclasses.fields(report):
            assert re.search(rf"\b{field.name}\b", docs), f"{report.__name__}.{field.name} is not in docs/json.md"
