"""Checkpoint loaders, one module per format, each yielding ``TensorRecord``s lazily.

``open_checkpoint`` detects the format by content, never by file extension. No loader executes anything from a
checkpoint: pickles go through ``pickle_vm.SafeUnpickler``. See ``base`` for how to consume a ``Checkpoint``.
"""

from __future__ import annotations

from pathlib import Path

from dtypecheck.errors import InputError
from dtypecheck.loaders.base import Checkpoint, Finding, TensorRecord, TensorSource
from dtypecheck.usercode import python_target

SNIFF_BYTES = 32


def open_checkpoint(target: str) -> Checkpoint:
    """Open a checkpoint file, a checkpoint folder, or a live model ``file.py:factory``, by content."""
    live = python_target(target)
    if live is not None and live[0].is_file():
        from dtypecheck.loaders.live_model import open_live_model

        return open_live_model(live[0], live[1], target)
    path = Path(target)
    if not path.exists():
        raise InputError(f"no such file or directory: {target}")
    if path.is_dir():
        if (path / ".metadata").is_file():
            from dtypecheck.loaders.dcp import DcpCheckpoint

            return DcpCheckpoint(path)
        from dtypecheck.loaders.folders import open_folder

        return open_folder(path, open_file, lambda p: _detect(p) is not None)
    return open_file(path)


def _sniff(path: Path) -> tuple[bytes, int]:
    size = path.stat().st_size
    with path.open("rb") as handle:
        return handle.read(SNIFF_BYTES), size


def _detect(path: Path) -> str | None:
    from dtypecheck.loaders.safetensors_format import looks_like_safetensors
    from dtypecheck.loaders.torch_legacy import looks_like_legacy_torch

    try:
        head, size = _sniff(path)
    except OSError:
        return None
    if looks_like_safetensors(head, size):
        return "safetensors"
    if head.startswith(b"PK\x03\x04"):
        return "zip"
    if looks_like_legacy_torch(head):
        return "torch-legacy"
    if head.startswith(b"GGUF"):
        return "gguf"
    return None


def open_file(path: Path) -> Checkpoint:
    """Open one checkpoint file by its first bytes."""
    if not path.is_file():
        raise InputError(f"not a regular file: {path}")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: empty file")
    kind = _detect(path)
    if kind == "safetensors":
        from dtypecheck.loaders.safetensors_format import SafetensorsCheckpoint

        return SafetensorsCheckpoint(path)
    if kind == "zip":
        from dtypecheck.loaders.torch_zip import TorchZipCheckpoint

        return TorchZipCheckpoint(path)
    if kind == "torch-legacy":
        from dtypecheck.loaders.torch_legacy import LegacyTorchCheckpoint

        return LegacyTorchCheckpoint(path)
    if kind == "gguf":
        from dtypecheck.loaders.gguf_format import GgufCheckpoint

        return GgufCheckpoint(path)
    from dtypecheck.loaders.safetensors_format import truncated_safetensors_header

    head, size = _sniff(path)
    declared = truncated_safetensors_header(head, size)
    if declared is not None:
        raise InputError(f"{path}: truncated safetensors file (header of {declared} bytes, file of {size})")
    raise InputError(
        f"{path}: not a checkpoint format dtypecheck reads (safetensors, torch zip or legacy, GGUF, "
        "a sharded or distributed checkpoint folder)"
    )


__all__ = ["Checkpoint", "Finding", "TensorRecord", "TensorSource", "open_checkpoint"]
