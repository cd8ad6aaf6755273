"""What every checkpoint loader yields: tensor records whose data is read lazily, in bounded chunks.

A loader never materialises a whole checkpoint. ``TensorRecord.source`` reads the tensor's bytes on demand
(usually from a memory map of the file), so a scanner can walk a 1 GiB tensor in 64 MiB chunks and a 100 GB
sharded checkpoint one tensor at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import torch

Level = Literal["ok", "warn", "fail"]


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

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


@dataclass(frozen=True)
class Finding:
    """A non-numeric finding about a checkpoint: a pickle global, a missing shard, an index mismatch."""

    kind: str
    level: Level
    detail: str
    tensor: str | None = None


class Checkpoint(Protocol):
    """An opened checkpoint. ``records()`` may be called once; ``findings`` is complete after it is exhausted."""

    source: str
    format: str
    findings: list[Finding]

    def records(self) -> Iterator[TensorRecord]: ...

    def close(self) -> None: ...
