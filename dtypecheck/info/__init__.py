"""``dtypecheck info``: the true limits of each dtype, torch.finfo's view of them, and what each device does.

The format values come from the bit layout (``dtypes.FloatFormat``, ``formats``); the device values are *measured*
(``probe``) by running arithmetic (or, for storage-only formats like float8, casts) on each device, so that a device
that flushes subnormals or saturates on overflow shows up as such. ``advice`` derives the guidance rows users look
up, ``build`` assembles the report, and ``names`` lists every dtype name (``info --list``).
"""

from __future__ import annotations

from dtypecheck.info.advice import guidance
from dtypecheck.info.build import describe_dtypes
from dtypecheck.info.names import DtypeList, DtypeName, list_dtypes
from dtypecheck.info.probe import available_devices, measure
from dtypecheck.info.report import (
    DeviceMeasurement,
    DeviceMismatch,
    FloatInfo,
    Guidance,
    InfoReport,
    IntInfo,
    Mismatch,
)

__all__ = [
    "DeviceMeasurement",
    "DeviceMismatch",
    "DtypeList",
    "DtypeName",
    "FloatInfo",
    "Guidance",
    "InfoReport",
    "IntInfo",
    "Mismatch",
    "available_devices",
    "describe_dtypes",
    "guidance",
    "list_dtypes",
    "measure",
]
