"""The one way these tests describe a float dtype: on the CPU only, so results do not depend on the machine."""

from __future__ import annotations

from dtypecheck.dtypes import lookup
from dtypecheck.info import FloatInfo, describe_dtypes


def describe_float(name: str) -> FloatInfo:
    info = describe_dtypes([lookup(name)], devices=["cpu"]).dtypes[0]
    assert isinstance(info, FloatInfo)
    return info
