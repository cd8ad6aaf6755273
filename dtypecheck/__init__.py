"""dtypecheck: will this model, checkpoint or training step survive in dtype X on device Y?

The public Python API re-exports the core functions of each command; they return frozen dataclasses and
never print.
"""

from __future__ import annotations

import os as _os
import sys as _sys

if _sys.argv[:1] == ["-m"] and _sys.path and _sys.path[0] in ("", _os.getcwd()):  # noqa: PTH109  (no pathlib import here)
    # ``python -m dtypecheck`` put the working folder first on the path, before the standard library: a scan run
    # inside a checkpoint's folder would import a shipped ``dataclasses.py`` or ``decimal.py`` (issue 27).
    del _sys.path[0]

__version__ = "0.1.0"

from dtypecheck.dtypes import DtypeSpec, FloatFormat, lookup
from dtypecheck.errors import DtypecheckError, ExitCode
from dtypecheck.info import FloatInfo, InfoReport, IntInfo, describe_dtypes
from dtypecheck.nantrace import NanTraceReport, trace  # torch-free until a trace starts

# scan (numba) and memory (torch) load heavy modules: imported on first use so `dtypecheck --help` stays instant.
_LAZY = {
    "scan_checkpoint": "dtypecheck.scan",
    "ScanReport": "dtypecheck.scan.report",
    "ScanPolicy": "dtypecheck.config",
    "load_config": "dtypecheck.config",
    "estimate_memory": "dtypecheck.memory",
    "open_subject": "dtypecheck.memory",
    "EstimateOptions": "dtypecheck.memory",
    "MemoryReport": "dtypecheck.memory",
    "open_checkpoint": "dtypecheck.loaders",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dtypecheck' has no attribute {name!r}")


__all__ = [
    "DtypeSpec",
    "DtypecheckError",
    "EstimateOptions",
    "ExitCode",
    "FloatFormat",
    "FloatInfo",
    "InfoReport",
    "IntInfo",
    "MemoryReport",
    "NanTraceReport",
    "ScanPolicy",
    "ScanReport",
    "__version__",
    "describe_dtypes",
    "estimate_memory",
    "load_config",
    "lookup",
    "open_checkpoint",
    "open_subject",
    "scan_checkpoint",
    "trace",
]
