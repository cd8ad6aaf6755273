"""Pickles as ``joblib.load`` and ``pandas.read_pickle`` read them: compressed, with numpy arrays between opcodes.

``joblib.dump(obj, f, compress=3)`` writes its pickle through zlib (gzip, bz2, lzma, xz or lz4 when asked), and
``joblib.load`` picks the decompressor again by the file's first bytes, whatever its name; ``pandas.read_pickle``
decompresses ``x.pkl.gz`` by its name. ``torch.load`` of such a file fails at its first byte, so reading it as
``torch.load`` does finds nothing. And joblib writes each numpy array's bytes into the stream right after the
``NumpyArrayWrapper`` that describes it, where its own unpickler reads them (an array of objects as a nested
pickle): read as a plain pickle, the first array's bytes end the stream, and what follows them was never judged.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from dtypecheck.errors import InputError
from dtypecheck.loaders._io.pickle_vm import GlobalRef, PickleLimitError, PickleObject, SafeUnpickler

MAX_DECOMPRESSED_BYTES = 512 << 20
"""Most bytes a compressed pickle is inflated to; past it, an ``unreadable-file`` ``fail``: a decompression bomb
is refused, not read (what ``joblib.load`` would run past it is unknown)."""
_CHUNK = 1 << 20
_HEAD = 16
"""Inflated bytes looked at before the rest is inflated, for a file that must inflate to a pickle to be read."""

WRAPPER = GlobalRef("joblib.numpy_pickle", "NumpyArrayWrapper")
"""What joblib pickles a numpy array as; its bytes follow the ``BUILD`` that gives it its state."""

_ZF_HEADER = 2 + 19
"""joblib < 0.10's ``ZF`` files (still read by ``joblib.load``): ``ZF``, the length in hex padded to 19
characters, then one zlib stream."""
MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"ZF", "joblib-zfile"),
    (b"\x78", "zlib"),
    (b"\x1f\x8b", "gzip"),
    (b"BZ", "bz2"),
    (b"\xfd7zXZ", "xz"),
    (b"\x5d\x00", "lzma"),
    (b"\x04\x22\x4d\x18", "lz4"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
"""joblib's prefixes, in the order ``joblib.load`` tries them, then zstd (``pandas.read_pickle`` of ``.zst``)."""
_PICKLE_SUFFIXES = (".joblib", ".jbl", ".pkl", ".pickle", ".pck", ".pcl")
_COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".lzma", ".z", ".lz4", ".zst")


def pickle_named(path: Path) -> bool:
    """A name whose loader unpickles it (``model.joblib``, ``x.pkl.gz``, ``scaler.pickle.z``)."""
    name = path.name.lower()
    for suffix in _COMPRESSED_SUFFIXES:
        if name.endswith(suffix):
            name = name.removesuffix(suffix)
            break
    return name.endswith(_PICKLE_SUFFIXES)


class _Readable(Protocol):
    def read1(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class Inflated:
    """A compressed file's content, as far as it could be inflated."""

    kind: str
    """Its format (``MAGIC``)."""
    data: bytes
    problem: str | None = None
    """Why inflating stopped before the end (a truncated or corrupt stream), or None."""
    refused: str | None = None
    """Why it was not inflated at all (no reader installed, over ``MAX_DECOMPRESSED_BYTES``): what a loader would
    run is unknown, a ``fail``."""


def compression(head: bytes) -> str | None:
    """The format ``head`` (a file's first bytes) starts with, or None."""
    return next((kind for magic, kind in MAGIC if head.startswith(magic)), None)


def inflate(path: Path, kind: str, wanted: Callable[[bytes], bool] | None = None) -> Inflated | None:
    """``path``'s content inflated as ``kind``, up to ``MAX_DECOMPRESSED_BYTES``; None when ``wanted`` is given
    and its first inflated bytes are not (a compressed file of some other kind of data)."""
    with path.open("rb") as handle:
        if kind == "joblib-zfile":
            return _zfile(handle, wanted)
        try:
            reader = _reader(kind, handle)
        except ImportError:
            return Inflated(kind, b"", refused=f"{kind}-compressed, and no {kind} reader is installed here")
        return _read_capped(kind, reader, wanted)


def _reader(kind: str, handle: IO[bytes]) -> _Readable:
    if kind == "zlib":
        return _ZlibReader(handle)
    if kind == "gzip":
        return gzip.GzipFile(fileobj=handle)
    if kind == "bz2":
        return bz2.BZ2File(handle)
    if kind in {"xz", "lzma"}:
        return lzma.LZMAFile(handle)
    if kind == "lz4":
        import lz4.frame  # type: ignore[import-not-found]  # joblib's optional compressor

        return lz4.frame.LZ4FrameFile(handle)  # type: ignore[no-any-return]
    import zstandard  # type: ignore[import-not-found]  # pandas' reader of .zst

    return zstandard.ZstdDecompressor().stream_reader(handle)  # type: ignore[no-any-return]


def _read_capped(kind: str, reader: _Readable, wanted: Callable[[bytes], bool] | None) -> Inflated | None:
    """Read ``reader`` to its end, or to the first error (a loader reading it streams, and has run what came before
    it), refusing it past ``MAX_DECOMPRESSED_BYTES``."""
    out = bytearray()
    problem = None
    try:
        while chunk := reader.read1(_CHUNK):  # read1: what was inflated before an error is returned, not lost
            out += chunk
            if wanted is not None and len(out) >= _HEAD:
                if not wanted(bytes(out[:_HEAD])):
                    return None
                wanted = None
            if len(out) > MAX_DECOMPRESSED_BYTES:
                return Inflated(kind, b"", refused=_over_cap(kind))
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
        problem = f"{kind} stream breaks off ({exc})"
    if wanted is not None and not wanted(bytes(out)):  # fewer than _HEAD bytes in all
        return None
    return Inflated(kind, bytes(out), problem)


def _over_cap(kind: str) -> str:
    return f"{kind}-compressed, inflating to over {MAX_DECOMPRESSED_BYTES >> 20} MiB (a decompression bomb?): not read"


def _zfile(handle: IO[bytes], wanted: Callable[[bytes], bool] | None) -> Inflated | None:
    """A ``ZF`` file: ``joblib.load`` inflates it whole into a buffer of the size its header gives."""
    header = handle.read(_ZF_HEADER)
    try:
        length = int(header[2:], 16)
    except ValueError:
        return Inflated("joblib-zfile", b"", problem="malformed ZF header (joblib.load fails here)")
    if length > MAX_DECOMPRESSED_BYTES:
        return Inflated("joblib-zfile", b"", refused=_over_cap("joblib-zfile"))
    if handle.read(1) != b" ":  # joblib <= 0.8.4 wrote one more space
        handle.seek(_ZF_HEADER)
    inflated = _read_capped("joblib-zfile", _ZlibReader(handle), wanted)
    # joblib.load inflates the whole with one zlib.decompress: a broken stream gives nothing to unpickle.
    if inflated is not None and inflated.problem is not None:
        return Inflated("joblib-zfile", b"", problem=inflated.problem)
    return inflated


class _ZlibReader(io.RawIOBase):
    """A zlib stream read a chunk at a time (joblib's ``BinaryZlibFile``; streams back to back are read on)."""

    def __init__(self, handle: IO[bytes]) -> None:
        super().__init__()
        self._handle = handle
        self._inflater = zlib.decompressobj()
        self._pending = b""

    def readable(self) -> bool:
        return True

    def read1(self, size: int = -1) -> bytes:
        limit = _CHUNK if size < 0 else size
        while True:
            if self._inflater.eof:
                rest = self._inflater.unused_data or self._handle.read(_CHUNK)
                if not rest:
                    return b""
                self._inflater, self._pending = zlib.decompressobj(), rest
            data = self._pending or self._inflater.unconsumed_tail or self._handle.read(_CHUNK)
            self._pending = b""
            if not data:
                raise EOFError("compressed stream ended before the end-of-stream marker")
            out = self._inflater.decompress(data, limit)
            if out:
                return out


def array_bytes(machine: SafeUnpickler, built: Any) -> None:
    """``SafeUnpickler.after_build`` for joblib's reading: after a ``NumpyArrayWrapper``'s ``BUILD``, read past
    its array as ``NumpyArrayWrapper.read_array`` does (an object array's nested pickle is interpreted, its globals
    counted as the stream's). An array of a layout not read here, or one cut short, stops the reading."""
    if not isinstance(built, PickleObject) or built.factory != WRAPPER or not isinstance(built.state, dict):
        return
    stream = machine.stream
    count, itemsize, objects = _layout(built.state)
    if objects:
        nested = SafeUnpickler(stream, where=f"{machine.where}: an array of objects", after_build=array_bytes)
        try:
            nested.load()
        finally:
            machine.absorb(nested.globals_seen)
        return
    if built.state.get("numpy_array_alignment_bytes") is not None:
        stream.seek(int.from_bytes(stream.read(1) or b"\x00", "little"), io.SEEK_CUR)
    end = stream.tell() + count * itemsize
    if end > stream.seek(0, io.SEEK_END):
        raise InputError(f"{machine.where}: a joblib array's bytes are cut short (joblib.load stops here)")
    stream.seek(end)


def _layout(state: dict[Any, Any]) -> tuple[int, int, bool]:
    """(elements, bytes per element, holds objects) of the array a ``NumpyArrayWrapper``'s state describes."""
    shape, dtype = state.get("shape"), state.get("dtype")
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise InputError(f"a joblib array of shape {shape!r}, which joblib.load cannot read either")
    count = 1
    for n in shape:
        count *= n
    if not isinstance(dtype, PickleObject) or not dtype.args or not isinstance(dtype.args[0], str):
        raise _unread_layout(dtype)
    code, numpy_state = dtype.args[0], dtype.state
    flags = numpy_state[7] if isinstance(numpy_state, tuple) and len(numpy_state) > 7 else 0
    if code.startswith("O") or (isinstance(flags, int) and flags & 1):  # NPY_ITEM_REFCOUNT: holds objects
        return count, 0, True
    size = numpy_state[5] if isinstance(numpy_state, tuple) and len(numpy_state) > 5 else -1
    if not (isinstance(size, int) and size > 0):
        digits = code.lstrip("?bBhHiIlLqQefdgFDGSUVMmcu<>=|")  # builtin types: the byte count follows the letter
        size = int(digits) if digits.isdigit() else -1
    if size <= 0:
        raise _unread_layout(dtype)
    return count, size, False


def _unread_layout(dtype: Any) -> InputError:
    return PickleLimitError(f"a joblib array of a dtype dtypecheck does not read ({dtype}): joblib.load reads on")
