"""Independent references the tests compare against: numpy and ml_dtypes scalar types per dtypecheck name."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

ML_DTYPES_SCALAR: dict[str, Any] = {
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "float4_e2m1fn_x2": ml_dtypes.float4_e2m1fn,
}
