"""Memory-mapped byte ranges: bounded reads for parsers, and tensor sources that read data in chunks.

Every loader maps its file once (mapping reads nothing) and hands out views of it, so a 1 GiB tensor is walked
in ``max_bytes`` chunks and the process's private memory stays small whatever the checkpoint's size.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from dtypecheck.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    import torch

    from dtypecheck.findings import Finding
    from dtypecheck.loaders.base import Checkpoint, TensorRecord, TensorSource


MAX_HOLE_BYTES = 1 << 30
"""Most bytes of holes a checkpoint file may have (``FileMap.refuse_sparse``)."""
MAX_EXTENTS = 100_000
"""Most data extents ``hole_bytes`` walks; past them the rest of the file counts as data."""


def hole_bytes(fd: int, size: int) -> int:
    """Bytes of ``fd``'s holes, found with ``SEEK_DATA``/``SEEK_HOLE`` (0 where the system cannot say)."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return 0
    holes = position = 0
    try:
        for _ in range(MAX_EXTENTS):
            try:
                data = os.lseek(fd, position, seek_data)
            except OSError:  # ENXIO: no data after ``position``, the rest is a hole
                return holes + size - position
            holes += data - position
            position = os.lseek(fd, data, seek_hole)
            if position >= size:
                return holes
    except OSError:
        return 0
    return holes


class FileMap:
    """A read-only map of a whole file, closed with the checkpoint that opened it.

    Headers (through ``Window``) and tensor data are read with ``pread`` (``read_range``), not through the map:
    if the file is truncated while it is read, touching a mapped page past the new end would kill the process with
    SIGBUS (no Python handler can resume from it), whereas a short ``pread`` is an ``InputError``. The map itself
    only identifies the file (and serves a strided view larger than ``STRIDED_COPY_LIMIT``, after a size check).
    """

    def __init__(self, path: Path) -> None:
        from dtypecheck.loaders._io.regular import open_regular

        self.path = path
        self.fd = open_regular(path)  # a FIFO or a device is refused before anything is read
        try:
            status = os.fstat(self.fd)
            self.size = status.st_size
            self.stamp = (status.st_size, status.st_mtime_ns)
            """(size, modification time) when opened: a read that finds them changed is an InputError."""
            if self.size == 0:
                raise InputError(f"{path}: empty file")
            self.buffer = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(self.fd)
            raise
        _FILES[id(self.buffer)] = self

    def refuse_sparse(self) -> None:
        """An ``InputError`` when over ``MAX_HOLE_BYTES`` of the file are holes (never written: they read as
        zeros). A scan reads every byte of a tensor, and a 512 GiB file that holds 4 KiB on disk would keep it
        reading zeros for hours; a checkpoint as frameworks write it has no holes. The holes are found with
        ``SEEK_HOLE``/``SEEK_DATA``, only when the blocks allocated show they can be there."""
        status = os.fstat(self.fd)
        allocated = getattr(status, "st_blocks", None)
        if allocated is None or allocated * 512 + MAX_HOLE_BYTES >= self.size:
            return
        holes = hole_bytes(self.fd, self.size)
        if holes > MAX_HOLE_BYTES:
            raise InputError(
                f"{self.path}: a sparse file: {holes} of its {self.size} bytes are holes (never written, read as "
                f"zeros), over the {MAX_HOLE_BYTES} limit; not read (write it out in full to scan it)"
            )

    @classmethod
    @contextlib.contextmanager
    def kept_if_parsed(cls, path: Path) -> Iterator[FileMap]:
        """A map of ``path`` for a loader to parse in the ``with`` block: closed again if the block raises (a
        file that fails to parse leaks no map or descriptor), left open for the loader's ``close()`` otherwise.

        ``with FileMap.kept_if_parsed(path) as self._map: self._parse()``
        """
        mapped = cls(path)
        try:
            mapped.refuse_sparse()
            yield mapped
        except BaseException:
            mapped.close()
            raise

    def pread(self, offset: int, nbytes: int, into: memoryview | None = None) -> memoryview:
        """``nbytes`` of the file from ``offset``, read now (not mapped), into ``into`` (a reusable buffer of at
        least ``nbytes``) or a new one; a file that shrank, or was written to since it was opened, is an
        InputError (checked after the read, so the bytes returned are the file's as it was opened)."""
        import numpy as np

        if into is None:
            into = memoryview(np.empty(nbytes, np.uint8).data)  # not zero-filled: pread writes every byte
        view = into[:nbytes]
        done = 0
        while done < nbytes:
            got = os.preadv(self.fd, [view[done:]], offset + done)
            if got == 0:
                self.check_size(offset + nbytes)
                raise InputError(f"{self.path}: short read at byte {offset + done} (changed during the scan?)")
            done += got
        self.check_size(offset + nbytes)
        return view

    def check_size(self, end: int) -> None:
        """An InputError when the file no longer reaches ``end`` (before reading the map there), or no longer has
        the size and modification time it had when opened (rewritten in place, or truncated and written again:
        its bytes may now mix two versions)."""
        now = os.fstat(self.fd)
        if now.st_size < max(end, self.size):
            raise InputError(
                f"{self.path}: the file shrank to {now.st_size} bytes while it was read (changed during the scan)"
            )
        if (now.st_size, now.st_mtime_ns) != self.stamp:
            raise InputError(f"{self.path}: the file was written to while it was read (changed during the scan)")

    def close(self) -> None:
        _FILES.pop(id(self.buffer), None)
        # A caller may still hold a chunk viewing the map; it is unmapped when that chunk is freed.
        with contextlib.suppress(BufferError):
            self.buffer.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


_FILES: dict[int, FileMap] = {}
"""Open ``FileMap``s by ``id`` of their map, so a source holding the map can read its file with ``pread``."""


class FileCheckpoint:
    """A checkpoint of one file, parsed from its map when opened: ``_parse`` sets ``findings`` and ``_records``
    (a parse error closes the map); the map stays open for the tensors' reads until ``close``."""

    format: str

    def __init__(self, path: Path) -> None:
        self.source = str(path)
        self.findings: list[Finding] = []
        self._records: list[TensorRecord] = []
        with FileMap.kept_if_parsed(path) as self._map:
            self._parse()

    def _parse(self) -> None:
        raise NotImplementedError

    def records(self) -> Iterator[TensorRecord]:
        return iter(self._records)

    def parts(self) -> list[Checkpoint]:
        return [self]

    def close(self) -> None:
        self._map.close()


def read_range(buffer: mmap.mmap | bytes, offset: int, nbytes: int, into: memoryview | None = None) -> memoryview:
    """``buffer[offset:offset+nbytes]`` as a private, writable copy (in ``into`` when given): through ``pread``
    for a ``FileMap``'s map."""
    owner = _FILES.get(id(buffer))
    if owner is None:
        return memoryview(bytearray(buffer[offset : offset + nbytes]))
    return owner.pread(offset, nbytes, into)


class Window(io.RawIOBase):
    """A read-only file object over ``buffer[start:start+length]`` whose reads never go past the window.

    Parsers (``zipfile``, ``pickletools``) believe lengths written in the file; here a length larger than what is
    left simply returns less, so a hostile length cannot make anyone allocate it. A ``FileMap``'s bytes are read
    with ``pread`` (``read_range``), never through the map, a block at a time, so a file truncated while it is
    parsed is an ``InputError`` and not a SIGBUS.
    """

    BLOCK = 64 * 1024
    MAX_LINE = 256 << 20
    """Longest line ``readline`` returns (a pickle's text argument): past it, ``LineTooLongError``. 160 MB lines
    are read (a hostile pickle's string may be code); a safetensors file whose header length starts a protocol-0
    opcode (``P``, ``p``) is not read to its end in search of a newline."""

    def __init__(self, buffer: mmap.mmap | bytes, start: int, length: int) -> None:
        super().__init__()
        self.buffer = buffer
        self.start = start
        self.length = length
        self.pos = 0
        self._block_at = 0
        self._block = b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.length}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _cached(self, count: int) -> bytes:
        """``count`` bytes from ``pos`` (already clipped to the window), through the block cache."""
        offset = self.pos - self._block_at
        if offset >= 0 and offset + count <= len(self._block):
            return self._block[offset : offset + count]
        if count >= self.BLOCK:
            return bytes(read_range(self.buffer, self.start + self.pos, count))
        self._block_at = self.pos
        self._block = bytes(read_range(self.buffer, self.start + self.pos, min(self.BLOCK, self.length - self.pos)))
        return self._block[:count]

    def read(self, size: int | None = -1) -> bytes:
        remaining = max(0, self.length - self.pos)
        count = remaining if size is None or size < 0 else min(size, remaining)
        data = self._cached(count) if count else b""
        self.pos += count
        return data

    def readinto(self, target: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(target))
        target[: len(data)] = data
        return len(data)

    def readline(self, size: int | None = -1) -> bytes:
        limit = max(0, self.length - self.pos) if size is None or size < 0 else min(size, self.length - self.pos)
        # Pieces are joined once at the end: ``line += piece`` would copy the line so far for every block, and a
        # 160 MB line (a hostile pickle's string argument) would cost hours instead of a second.
        pieces: list[bytes] = []
        taken = 0
        while taken < limit:
            piece = self.read(min(self.BLOCK, limit - taken))
            if not piece:
                break
            found = piece.find(b"\n")
            if found >= 0:
                self.pos -= len(piece) - found - 1
                pieces.append(piece[: found + 1])
                break
            pieces.append(piece)
            taken += len(piece)
            if taken > self.MAX_LINE:
                raise LineTooLongError(f"a line of over {self.MAX_LINE} bytes at byte {self.pos - taken}")
        return b"".join(pieces)


class LineTooLongError(InputError):
    """``Window.readline`` met no newline within ``Window.MAX_LINE`` bytes: a reader stopped at its own limit (a
    real unpickler would read on)."""


def itemsize_of(dtype: str) -> int:
    """Bytes per element of torch dtype ``dtype`` (sub-byte integers take a byte each, as in torch), from the
    dtype registry: reading a checkpoint's layout needs no torch import."""
    from dtypecheck.dtypes import lookup

    try:
        bits = lookup(dtype).itemsize_bits
    except Exception:  # noqa: BLE001 - a torch dtype the registry does not know: ask torch
        import torch

        size: int = getattr(torch, dtype).itemsize
        return size
    return (bits + 7) // 8


NUMPY_DTYPES = frozenset(
    ("float16", "float32", "float64", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
)
"""torch dtypes whose bytes numpy reads as the same values (little-endian, as checkpoints store them)."""
BIT_PATTERN_ARRAYS = {"bfloat16": "uint16"}
"""torch dtypes numpy has not, read as arrays of their bit patterns (``scan.values.float_values`` widens them)."""


def _frombuffer(buffer: mmap.mmap, offset: int, nbytes: int, dtype: str) -> torch.Tensor:
    import torch

    view = memoryview(buffer)[offset : offset + nbytes]
    with warnings.catch_warnings():
        # The map is read-only and we never write through the tensor; torch warns regardless.
        warnings.simplefilter("ignore", UserWarning)
        chunk = torch.frombuffer(view, dtype=torch.uint8)
    return chunk.view(getattr(torch, dtype))


@dataclass(frozen=True)
class MappedSource:
    """A contiguous byte range of a mapped file, read as a flat tensor of one dtype (each chunk by ``pread``)."""

    buffer: mmap.mmap
    offset: int
    nbytes: int
    dtype: str

    def iter_chunks(self, max_bytes: int) -> Iterator[torch.Tensor]:
        for offset, nbytes in self._cuts(max_bytes):
            yield self._read(offset, nbytes)

    def _cuts(self, max_bytes: int) -> Iterator[tuple[int, int]]:
        itemsize = itemsize_of(self.dtype)
        step = max(itemsize, (max_bytes // itemsize) * itemsize)
        for start in range(0, self.nbytes, step):
            yield self.offset + start, min(step, self.nbytes - start)

    def iter_readers(
        self, max_bytes: int, *, arrays: bool = False
    ) -> Iterator[tuple[Callable[..., torch.Tensor | np.ndarray], int]]:
        """(read one chunk, its bytes) for each chunk, without reading yet: a scanner calls the readers on its
        worker threads, so the copies out of the page cache run in parallel. A reader takes an optional ``into``
        buffer to reuse (the chunk then lives in it: the caller must be done with it before the next read).

        With ``arrays``, a dtype numpy reads (``NUMPY_DTYPES``) comes as a flat numpy array, and bfloat16 as its
        bit patterns (``BIT_PATTERN_ARRAYS``), so that a scan of such a checkpoint never imports torch (about a
        second of start-up); other dtypes as torch tensors."""
        numpy_reads = self.dtype in NUMPY_DTYPES or self.dtype in BIT_PATTERN_ARRAYS
        read = self._read_array if arrays and numpy_reads else self._read
        for offset, nbytes in self._cuts(max_bytes):
            yield partial(read, offset, nbytes), nbytes

    def _read(self, offset: int, nbytes: int, into: memoryview | None = None) -> torch.Tensor:
        import torch

        data = read_range(self.buffer, offset, nbytes, into)
        return torch.frombuffer(data, dtype=torch.uint8).view(getattr(torch, self.dtype))

    def _read_array(self, offset: int, nbytes: int, into: memoryview | None = None) -> np.ndarray:
        import numpy as np

        data = read_range(self.buffer, offset, nbytes, into)
        return np.frombuffer(data, dtype=np.dtype(BIT_PATTERN_ARRAYS.get(self.dtype, self.dtype)).newbyteorder("<"))


STRIDED_COPY_LIMIT = 64 << 20
"""A strided view's storage up to this size is copied with ``pread`` first; a larger one is gathered from the map
chunk by chunk, after checking that the file still reaches the storage's end."""


@dataclass(frozen=True)
class StridedSource:
    """A non-contiguous view (strides, storage offset) of a mapped storage, yielded in logical order.

    Each chunk is a copy of at most ``max_bytes``, gathered with ``torch.as_strided``.
    """

    buffer: mmap.mmap
    storage_offset: int
    storage_nbytes: int
    dtype: str
    element_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def iter_chunks(self, max_bytes: int) -> Iterator[torch.Tensor]:
        import torch

        itemsize = itemsize_of(self.dtype)
        usable = (self.storage_nbytes // itemsize) * itemsize
        owner = _FILES.get(id(self.buffer))
        if usable <= STRIDED_COPY_LIMIT or owner is None:
            data = read_range(self.buffer, self.storage_offset, usable)
            base = torch.frombuffer(data, dtype=torch.uint8).view(getattr(torch, self.dtype))
        else:
            base = _frombuffer(self.buffer, self.storage_offset, usable, self.dtype)
        view = torch.as_strided(base, self.shape, self.stride, self.element_offset)
        guard = None
        if owner is not None and usable > STRIDED_COPY_LIMIT:
            end = self.storage_offset + usable

            def guard() -> None:  # each gather below reads the map: the file must still reach the storage's end
                owner.check_size(end)

        yield from _ordered_chunks(view, max(1, max_bytes // itemsize), guard)


def _ordered_chunks(
    view: torch.Tensor, max_elements: int, guard: Callable[[], None] | None = None
) -> Iterator[torch.Tensor]:
    """Copies of ``view``'s elements in logical order, each at most ``max_elements``; ``guard()`` runs before
    each copy."""
    total = view.numel()
    if total == 0:
        return
    if total <= max_elements or view.dim() == 0:
        if guard is not None:
            guard()
        yield view.reshape(-1).clone()
        return
    rows = view.shape[0]
    per_row = total // rows
    if per_row <= max_elements:
        step = max_elements // per_row
        for begin in range(0, rows, step):
            if guard is not None:
                guard()
            yield view[begin : begin + step].reshape(-1).clone()
    else:
        for row in range(rows):
            yield from _ordered_chunks(view[row], max_elements, guard)


@dataclass(frozen=True)
class ChainSource:
    """Several sources read one after the other (a tensor stored as several chunks)."""

    parts: tuple[TensorSource, ...]

    def iter_chunks(self, max_bytes: int) -> Iterator[torch.Tensor]:
        for part in self.parts:
            yield from part.iter_chunks(max_bytes)


@dataclass(frozen=True)
class LiveSource:
    """A tensor already in memory (a live model's parameter), read in chunks and copied to the CPU."""

    tensor: torch.Tensor

    def iter_chunks(self, max_bytes: int) -> Iterator[torch.Tensor]:
        flat = self.tensor.detach().reshape(-1)
        step = max(1, max_bytes // max(1, flat.element_size()))
        for begin in range(0, flat.numel(), step):
            yield flat[begin : begin + step].cpu()


@dataclass(frozen=True)
class EmptySource:
    """The data of a zero-size tensor: no chunks."""

    def iter_chunks(self, max_bytes: int) -> Iterator[torch.Tensor]:
        return iter(())


EMPTY_SOURCE = EmptySource()
