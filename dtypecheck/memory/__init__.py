"""``dtypecheck estimate-memory``: what a model needs for inference and training, per dtype, optimizer and
sharding, from model states computed exactly and activations traced on fake tensors."""

from __future__ import annotations

from dtypecheck.memory.estimate import DEFAULT_DTYPES, EstimateOptions, estimate_memory
from dtypecheck.memory.report import MemoryBytes, MemoryEstimate, MemoryReport, ModelInfo, Sharding
from dtypecheck.memory.subject import open_subject

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
