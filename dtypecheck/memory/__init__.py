"""``dtypecheck estimate-memory``: what a model needs for inference and training, per dtype, optimizer and
sharding, from model states computed exactly and activations traced on fake tensors.

The names below load torch on first use (PEP 562). The torch-free word lists live on the ground floor
(``dtypecheck.memory_words``), so that the config validation reads them without torch and without this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtypecheck.memory.estimate import DEFAULT_DTYPES, EstimateOptions
    from dtypecheck.memory.report import MemoryBytes, MemoryEstimate, MemoryReport, ModelInfo, Sharding
    from dtypecheck.memory.run import estimate_memory, open_subject

_LAZY = {
    "DEFAULT_DTYPES": "dtypecheck.memory.estimate",
    "EstimateOptions": "dtypecheck.memory.estimate",
    "MemoryBytes": "dtypecheck.memory.report",
    "MemoryEstimate": "dtypecheck.memory.report",
    "MemoryReport": "dtypecheck.memory.report",
    "ModelInfo": "dtypecheck.memory.report",
    "Sharding": "dtypecheck.memory.report",
    "estimate_memory": "dtypecheck.memory.run",
    "open_subject": "dtypecheck.memory.run",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dtypecheck.memory' has no attribute {name!r}")


__all__ = [
    "DEFAULT_DTYPES",
    "EstimateOptions",
    "MemoryBytes",
    "MemoryEstimate",
    "MemoryReport",
    "ModelInfo",
    "Sharding",
    "estimate_memory",
    "open_subject",
]
