"""Helpers the loader tests use to build checkpoints by hand (no downloads) and to read records back."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from dtypecheck.loaders import Checkpoint, TensorRecord, open_checkpoint


def read_tensor(record: TensorRecord, max_bytes: int = 1 << 20) -> torch.Tensor:
    """All of a record's elements, reassembled to its shape from its chunks."""
    assert record.source is not None
    chunks = list(record.source.iter_chunks(max_bytes))
    for chunk in chunks:
        assert chunk.dim() == 1
        assert chunk.device.type == "cpu"
        assert str(chunk.dtype) == f"torch.{record.dtype}"
        assert chunk.numel() * chunk.element_size() <= max(max_bytes, chunk.element_size())
    dtype = getattr(torch, record.dtype)
    flat = torch.cat(chunks) if chunks else torch.empty(0, dtype=dtype)
    return flat.reshape(record.shape)


def same(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Bit-exact equality, including float8 dtypes (compared as raw bytes) and NaNs."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    left, right = actual.contiguous().reshape(-1), expected.contiguous().reshape(-1)
    if left.numel() == 0:
        return True
    return bool(torch.equal(left.view(torch.uint8), right.view(torch.uint8)))


@contextmanager
def opened(target: str | Path) -> Iterator[Checkpoint]:
    checkpoint = open_checkpoint(str(target))
    try:
        yield checkpoint
    finally:
        checkpoint.close()


def load_all(target: str | Path, max_bytes: int = 1 << 20) -> dict[str, torch.Tensor]:
    with opened(target) as checkpoint:
        return {record.name: read_tensor(record, max_bytes) for record in checkpoint.records()}


def write_torch_zip(path: Path, pickle_bytes: bytes, storages: dict[str, bytes] | None = None) -> Path:
    """A torch-style zip archive written by hand: ``archive/data.pkl`` plus ``archive/data/<key>`` entries."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickle_bytes)
        archive.writestr("archive/byteorder", b"little")
        for key, data in (storages or {}).items():
            archive.writestr(f"archive/data/{key}", data)
        archive.writestr("archive/version", b"3\n")
    return path


@contextmanager
def saved_as_if_on(location: str) -> Iterator[None]:
    """Make ``torch.save`` tag every storage with ``location`` (e.g. ``cuda:0``), as on a GPU machine.

    torch writes each storage's location from the first matching tagger in its package registry; this puts one
    in front for the duration of the block. The data itself is the CPU bytes, exactly as a GPU save writes them.
    """
    registry = torch.serialization._package_registry
    entry = (-1, lambda _storage: location, lambda obj, _location: obj)
    registry.insert(0, entry)
    try:
        yield
    finally:
        registry.remove(entry)
