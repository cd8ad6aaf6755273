"""What every checkpoint loader yields: tensor records whose data is read lazily, in bounded chunks.

A loader never materialises a whole checkpoint. ``TensorRecord.source`` reads the tensor's bytes on demand
(usually from a memory map of the file), so a scanner can walk a 1 GiB tensor in 64 MiB chunks and a 100 GB
sharded checkpoint one tensor at a time.

How to consume a checkpoint:

- ``open_checkpoint(target)`` parses headers only (safetensors JSON, torch pickles through the safe unpickler,
  GGUF headers, shard indexes, ``torch.distributed.checkpoint`` metadata) and checks every offset, length and
  shape against the file sizes, so a bad file fails here with ``InputError``, never halfway through a scan.
  ``records()`` yields every tensor's name, dtype and shape without reading any tensor data, so it is also the
  cheap path for memory estimates. ``records()`` may be iterated more than once. (A ``file.py:factory`` target
  is the exception: opening it runs the user's file and factory.)
- Data is read only through ``record.source.iter_chunks(max_bytes)``, after ``open_checkpoint`` and before
  ``close()``. ``source`` is ``None`` only when the data cannot be read at all (a meta-device parameter of a
  live model, a GGUF block-quantized tensor without the ``gguf`` package; a finding says so). A zero-size tensor
  has a source that yields no chunks.
- ``record.saved_device`` is the device the tensor was saved from (``"cpu"``, ``"cuda:0"`` for a GPU-saved torch
  file), or ``None`` where the format does not say (safetensors, GGUF). Data is always read on the CPU.
- Parallel scanning: ``checkpoint.parts()`` returns independent sub-checkpoints (one per shard file of a sharded
  folder; ``[checkpoint]`` itself for a single file). Each part may be consumed in its own thread (its own
  ``records()`` and sources; the memory maps are read-only). Their records together are exactly
  ``checkpoint.records()``. Do not close parts; close the parent once, after every thread is done.
- ``checkpoint.findings`` is complete as soon as ``open_checkpoint`` returns, and for a sharded checkpoint it
  already includes every part's findings (deduplicated): read the parent's, not the parts'.
- ``close()`` unmaps the files; chunks still referenced keep their map alive until they are freed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from dtypecheck.errors import InputError
from dtypecheck.findings import Finding, Level

if TYPE_CHECKING:
    import torch

__all__ = [
    "MAX_TENSORS_PER_FILE",
    "MAX_TENSOR_DIMS",
    "Checkpoint",
    "Finding",
    "Level",
    "TensorRecord",
    "TensorSource",
    "check_count",
    "check_dims",
]

MAX_TENSORS_PER_FILE = 250_000
"""Most tensors one checkpoint file may hold. The largest real files hold tens of thousands (a sharded model's files
each hold a share); a header of 1.4 million empty tensors costs 80 MB to write and would cost an hour to report."""


MAX_TENSOR_DIMS = 64
"""Most dimensions a tensor may have: what torch's kernels are built for (``TensorIterator``, CUDA's
``MAX_DIMS``); this CPU build of torch makes a 1500-dimension view of one element, which no real checkpoint holds
and whose walk would only recurse (a scan of it once ended in a ``RecursionError``)."""


def check_dims(shape: tuple[int, ...] | list[int], name: str, where: str) -> None:
    """An ``InputError`` for a tensor with more than ``MAX_TENSOR_DIMS`` dimensions."""
    if len(shape) > MAX_TENSOR_DIMS:
        raise InputError(f"{where}: tensor {name!r} has {len(shape)} dimensions, over the {MAX_TENSOR_DIMS} limit")


def check_count(count: int, where: str) -> None:
    """An ``InputError`` for a file that lists more than ``MAX_TENSORS_PER_FILE`` tensors."""
    if count > MAX_TENSORS_PER_FILE:
        raise InputError(f"{where}: {count} tensors in one file, over the {MAX_TENSORS_PER_FILE} limit")


class TensorSource(Protocol):
    """Lazy access to one tensor's data."""

    def iter_chunks(self, max_bytes: int) -> Iterator[torch.Tensor]:
        """Flat 1-D CPU tensors of the record's dtype covering all elements in order, each at most
        ``max_bytes`` (at least one element). Packed sub-byte dtypes yield their storage dtype."""
        ...


@dataclass(frozen=True)
class TensorRecord:
    """One tensor of a checkpoint: its key path, layout, and a handle on its data."""

    name: str
    """Key path: nested mapping keys and sequence indexes joined by ``.``."""
    dtype: str
    """torch dtype name without ``torch.`` (a ``dtypes.REGISTRY`` name)."""
    shape: tuple[int, ...]
    nbytes: int
    source: TensorSource | None = field(default=None, repr=False, compare=False)
    """``None`` when only metadata is known (headers read for memory estimates)."""
    saved_device: str | None = None
    """The device the tensor lived on when saved (``cuda:0`` for a GPU-saved file), when the format says."""
    stored: str | None = None
    """How the file stores the data when not as ``dtype`` (a GGUF quantization type, ``Q4_K``, dequantized to
    ``dtype`` when read); None when stored as ``dtype``."""
    stored_bytes: int | None = None
    """The bytes the file holds for it when ``stored`` is set (``nbytes`` is the size in ``dtype``)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class Checkpoint(Protocol):
    """An opened checkpoint (see the module docstring for how to consume one)."""

    @property
    def source(self) -> str:
        """The path (or ``file.py:factory``) it was opened from."""
        ...

    @property
    def format(self) -> str:
        """A ``formats.FORMATS`` name (``safetensors``, ``torchscript``, ``torch-zip``, ``torch-legacy``, ``gguf``,
        ``torch-dcp``, ``hf-sharded``), ``folder`` or ``live-model``."""
        ...

    @property
    def findings(self) -> list[Finding]:
        """Non-numeric findings: ``pickle-global`` (detail ``module.name``), ``missing-shard``,
        ``index-mismatch``, ``index-total-size``, ``unsupported-tensor``, ``gguf-quantized``, ``contains-code``..."""
        ...

    def records(self) -> Iterator[TensorRecord]: ...

    def parts(self) -> list[Checkpoint]:
        """Independent sub-checkpoints that may be scanned in parallel threads (``[self]`` for a single file)."""
        ...

    def close(self) -> None: ...
