"""dtypecheck: will this model, checkpoint or training step survive in dtype X on device Y?

The public Python API re-exports the core functions of each command; they return frozen dataclasses and
never print.
"""

from __future__ import annotations

__version__ = "0.1.0"

from dtypecheck.dtypes import DtypeSpec, FloatFormat, lookup
from dtypecheck.errors import DtypecheckError, ExitCode
from dtypecheck.info import FloatInfo, InfoReport, IntInfo, describe_dtypes
from dtypecheck.nantrace import NanTraceReport, trace  # torch-free until a trace starts

__all__ = [
    "DtypeSpec",
    "DtypecheckError",
    "ExitCode",
    "FloatFormat",
    "FloatInfo",
    "InfoReport",
    "IntInfo",
    "NanTraceReport",
    "__version__",
    "describe_dtypes",
    "lookup",
    "trace",
]
