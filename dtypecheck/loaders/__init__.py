"""Checkpoint loaders, one module per format, each yielding ``TensorRecord``s lazily.

``open_checkpoint`` detects the format by content, never by file extension.
"""

from __future__ import annotations

from pathlib import Path

from dtypecheck.errors import InputError
from dtypecheck.loaders.base import Checkpoint, Finding, TensorRecord, TensorSource
from dtypecheck.loaders.safetensors_format import SafetensorsCheckpoint, looks_like_safetensors


def open_checkpoint(target: str) -> Checkpoint:
    """Open a checkpoint file or folder by its content."""
    path = Path(target)
    if not path.exists():
        raise InputError(f"no such file or directory: {target}")
    if path.is_dir():
        raise InputError(f"{target}: no checkpoint found in this folder")
    size = path.stat().st_size
    if size == 0:
        raise InputError(f"{target}: empty file")
    with path.open("rb") as handle:
        head = handle.read(16)
    if looks_like_safetensors(head, size):
        return SafetensorsCheckpoint(path)
    raise InputError(f"{target}: not a checkpoint format dtypecheck reads")


__all__ = ["Checkpoint", "Finding", "TensorRecord", "TensorSource", "open_checkpoint"]
