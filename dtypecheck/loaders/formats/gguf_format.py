"""GGUF files (llama.cpp). The header is parsed here, every count and offset checked against the file size;
the optional ``gguf`` package (``pip install dtypecheck[gguf]``) is used only to dequantize block-quantized types.

(``gguf.GGUFReader`` trusts array lengths: a 30-byte hostile file makes it loop for hours.)

Plain types (F32, F16, BF16, F64, I8..I64) are read straight from the file's memory map. Block-quantized types
(Q4_K, Q8_0, ...) have no torch dtype: they are dequantized to float32 a few rows at a time, and a
``gguf-quantized`` finding says so. GGUF lists dimensions innermost first; shapes here are in torch's order.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dtypecheck.dtypes import GGUF_PLAIN_TYPES
from dtypecheck.errors import InputError
from dtypecheck.loaders._io.mapped import EMPTY_SOURCE, FileCheckpoint, MappedSource, read_range
from dtypecheck.loaders.base import Finding, TensorRecord, TensorSource, check_count

if TYPE_CHECKING:
    import mmap

    import torch

PLAIN_TYPES = GGUF_PLAIN_TYPES  # the ids are facts of each dtype: dtypes.DtypeSpec.gguf
SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
MAX_ARRAY_NESTING = 8
MAX_DIMS = 8
DEFAULT_ALIGNMENT = 32


class _Reader:
    """Little-endian reads from a mapped file that never pass its end."""

    def __init__(self, buffer: mmap.mmap, size: int, where: str) -> None:
        self.buffer, self.size, self.where, self.pos = buffer, size, where, 0

    def take(self, count: int) -> bytes:
        if count < 0 or self.pos + count > self.size:
            raise InputError(f"{self.where}: malformed GGUF file (a field runs past the end)")
        data = bytes(read_range(self.buffer, self.pos, count))
        self.pos += count
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.unpack("<Q")).decode("utf-8", errors="replace")

    def value(self, kind: int, depth: int = 0) -> Any:
        if kind in SCALAR_FORMATS:
            return self.unpack(SCALAR_FORMATS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY and depth < MAX_ARRAY_NESTING:
            item_kind, count = self.unpack("<I"), self.unpack("<Q")
            if count > self.size - self.pos:  # every item takes at least one byte
                raise InputError(f"{self.where}: malformed GGUF file (array of {count} items)")
            if item_kind in SCALAR_FORMATS:
                self.take(count * struct.calcsize(SCALAR_FORMATS[item_kind]))  # skipped: metadata is not scanned
                return None
            for _ in range(count):
                self.value(item_kind, depth + 1)
            return None
        raise InputError(f"{self.where}: malformed GGUF file (value type {kind})")


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int


@dataclass(frozen=True)
class DequantizedSource:
    """A block-quantized tensor, dequantized to float32 a run of whole blocks at a time (at most ``max_bytes`` of
    float32 per chunk, however long a row is: blocks are independent, so a row may be cut between any two)."""

    buffer: mmap.mmap
    offset: int
    rows: int
    bytes_per_row: int
    ggml_type: int

    def iter_chunks(self, max_bytes: int) -> Iterator[torch.Tensor]:
        import numpy as np
        import torch
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import dequantize

        qtype = GGMLQuantizationType(self.ggml_type)
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        blocks = self.rows * self.bytes_per_row // type_size
        step = max(1, max_bytes // (4 * block_size))
        for begin in range(0, blocks, step):
            count = min(step, blocks - begin)
            raw = np.frombuffer(read_range(self.buffer, self.offset + begin * type_size, count * type_size), np.uint8)
            values = dequantize(raw.reshape(1, -1), qtype).astype(np.float32).reshape(-1)
            yield from torch.split(torch.from_numpy(values), max(1, max_bytes // 4))  # a block may exceed max_bytes


def _dequantizable(ggml_type: int, type_size: int) -> bool:
    """Whether the installed gguf package can dequantize this type (some types it only names)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        dequantize(np.zeros((1, type_size), np.uint8), GGMLQuantizationType(ggml_type))
    except Exception:  # noqa: BLE001  (NotImplementedError today; whatever the package raises means "cannot")
        return False
    return True


def _quant_sizes(ggml_type: int, where: str) -> tuple[int, int] | None:
    """(block size, bytes per block) from the gguf package; None if the package is missing."""
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError:
        return None
    try:
        sizes: tuple[int, int] = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise InputError(f"{where}: malformed GGUF file (unknown tensor type {ggml_type})") from None
    return sizes


class GgufCheckpoint(FileCheckpoint):
    format = "gguf"

    def _parse(self) -> None:
        reader = _Reader(self._map.buffer, self._map.size, self.source)
        if reader.take(4) != b"GGUF":
            raise InputError(f"{self.source}: not a GGUF file")
        version, tensor_count, kv_count = reader.unpack("<I"), reader.unpack("<Q"), reader.unpack("<Q")
        if version not in {2, 3}:
            raise InputError(f"{self.source}: GGUF version {version} is not supported (2 and 3 are)")
        if tensor_count > self._map.size or kv_count > self._map.size:
            raise InputError(f"{self.source}: malformed GGUF file ({tensor_count} tensors, {kv_count} keys)")
        check_count(tensor_count, self.source)
        alignment = DEFAULT_ALIGNMENT
        for _ in range(kv_count):
            key, kind = reader.string(), reader.unpack("<I")
            value = reader.value(kind)
            if key == "general.alignment" and isinstance(value, int) and value > 0:
                alignment = value
        infos = []
        for _ in range(tensor_count):
            name, n_dims = reader.string(), reader.unpack("<I")
            if n_dims > MAX_DIMS:
                raise InputError(f"{self.source}: tensor {name!r} has {n_dims} dimensions")
            dims = [reader.unpack("<Q") for _ in range(n_dims)]
            ggml_type, offset = reader.unpack("<I"), reader.unpack("<Q")
            infos.append(_TensorInfo(name, tuple(reversed(dims)), ggml_type, offset))
        data_start = -(-reader.pos // alignment) * alignment
        self._records = [self._record(info, data_start) for info in infos]
        from dtypecheck.loaders._io.pickle_files import polyglot_findings

        # GGUF metadata strings can hold a whole tar, which torch.load of this file opens before anything else.
        self.findings.extend(polyglot_findings(self._map.buffer, self._map.size, self.source, self.format))

    def _record(self, info: _TensorInfo, data_start: int) -> TensorRecord:
        numel = 1
        for size in info.shape:
            numel *= size
        start = data_start + info.offset
        source: TensorSource | None
        stored_as: str | None = None
        if info.ggml_type in PLAIN_TYPES:
            dtype = PLAIN_TYPES[info.ggml_type]
            from dtypecheck.loaders._io.mapped import itemsize_of

            stored = nbytes = numel * itemsize_of(dtype)
            source = MappedSource(self._map.buffer, start, nbytes, dtype) if nbytes else EMPTY_SOURCE
        else:
            dtype, nbytes = "float32", numel * 4
            sizes = _quant_sizes(info.ggml_type, self.source)
            if sizes is None:
                detail = f"GGML type {info.ggml_type} needs the gguf package (pip install 'dtypecheck[gguf]')"
                self.findings.append(Finding("gguf-quantized", "warn", detail + "; not scanned", info.name))
                return TensorRecord(info.name, dtype, info.shape, nbytes, None)
            block_size, type_size = sizes
            if not _dequantizable(info.ggml_type, type_size):
                detail = f"GGML type {info.ggml_type} cannot be dequantized by the installed gguf package; not scanned"
                self.findings.append(Finding("gguf-quantized", "warn", detail, info.name))
                return TensorRecord(info.name, dtype, info.shape, nbytes, None)
            row = info.shape[-1] if info.shape else 1
            if row % block_size:
                raise InputError(f"{self.source}: tensor {info.name!r} rows are not whole quantization blocks")
            bytes_per_row = row // block_size * type_size
            rows = numel // row if row else 0
            stored = rows * bytes_per_row
            source = DequantizedSource(self._map.buffer, start, rows, bytes_per_row, info.ggml_type)
            source = source if numel else EMPTY_SOURCE
            from gguf import GGMLQuantizationType

            type_name = stored_as = GGMLQuantizationType(info.ggml_type).name
            self.findings.append(Finding("gguf-quantized", "ok", f"{type_name} dequantized to float32", info.name))
        if start + stored > self._map.size:
            raise InputError(f"{self.source}: tensor {info.name!r} lies outside the file (truncated?)")
        as_stored = stored if stored_as is not None else None
        return TensorRecord(info.name, dtype, info.shape, nbytes, source, stored=stored_as, stored_bytes=as_stored)
