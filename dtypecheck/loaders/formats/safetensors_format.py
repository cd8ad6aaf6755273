"""safetensors: an 8-byte little-endian header length, a JSON header, then raw little-endian data.

Parsed by hand (not with ``safetensors.safe_open``) so every offset is checked against the file size before
anything is read, and the data is memory-mapped so a tensor is read in chunks.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtypecheck.dtypes import SAFETENSORS_DTYPES
from dtypecheck.errors import InputError
from dtypecheck.loaders._io.mapped import EMPTY_SOURCE, FileMap, MappedSource, itemsize_of
from dtypecheck.loaders._io.pickle_files import polyglot_findings
from dtypecheck.loaders._io.safetensors_head import MAX_HEADER_BYTES
from dtypecheck.loaders.base import Checkpoint, Finding, TensorRecord, check_count, check_dims

ST_DTYPES = SAFETENSORS_DTYPES  # the codes are facts of each dtype: dtypes.DtypeSpec.safetensors


@dataclass
class SafetensorsCheckpoint:
    path: Path
    source: str = ""
    format: str = "safetensors"
    findings: list[Finding] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    _entries: list[tuple[str, str, tuple[int, ...], int, int]] = field(default_factory=list)
    _map: FileMap | None = None

    def __post_init__(self) -> None:
        self.source = str(self.path)
        size = self.path.stat().st_size
        with self.path.open("rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise InputError(f"{self.path}: truncated safetensors file (no header length)")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES or length > size - 8:
                raise InputError(f"{self.path}: safetensors header length {length} exceeds the file or the limit")
            raw = handle.read(length)
        try:
            header = json.loads(raw, object_pairs_hook=_no_duplicate_keys)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise InputError(f"{self.path}: malformed safetensors header ({exc})") from None
        if not isinstance(header, dict):
            raise InputError(f"{self.path}: safetensors header is not a JSON object")
        data_start = 8 + length
        data_size = size - data_start
        check_count(len(header) - ("__metadata__" in header), str(self.path))
        for name, entry in header.items():
            if name == "__metadata__":
                if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                    raise InputError(f"{self.path}: safetensors __metadata__ must map strings to strings")
                self.metadata = dict(entry)
                continue
            self._entries.append(self._check_entry(name, entry, data_start, data_size))
        self._check_layout(data_start, data_size)
        self._map = FileMap(self.path) if size > 8 + length else None
        if self._map is not None:
            try:
                self._map.refuse_sparse()
            except InputError:
                self._map.close()
                raise
        # torch.load of this file under another name reads it as a zip, a tar or a pickle: judge that too.
        probe = self._map if self._map is not None else FileMap(self.path)
        try:
            self.findings.extend(polyglot_findings(probe.buffer, probe.size, self.source, self.format))
        finally:
            if probe is not self._map:
                probe.close()

    def _check_layout(self, data_start: int, data_size: int) -> None:
        """Tensors tile the data section exactly, as the reference reader requires: no overlap, no gap, no
        bytes left over at the end."""
        self._entries.sort(key=lambda e: (e[3], e[4]))
        end = data_start
        for name, _dtype, _shape, offset, nbytes in self._entries:
            if offset < end:
                raise InputError(f"{self.path}: tensor {name!r} overlaps the tensor before it in the file")
            if offset > end:
                raise InputError(f"{self.path}: {offset - end} unused bytes before tensor {name!r} (a gap)")
            end = offset + nbytes
        if end != data_start + data_size:
            raise InputError(f"{self.path}: {data_start + data_size - end} bytes after the last tensor")

    def _check_entry(
        self, name: str, entry: object, data_start: int, data_size: int
    ) -> tuple[str, str, tuple[int, ...], int, int]:
        if not isinstance(entry, dict):
            raise InputError(f"{self.path}: tensor {name!r} has a malformed header entry")
        code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(code, str) or code not in ST_DTYPES:
            raise InputError(f"{self.path}: tensor {name!r} has unknown safetensors dtype {code!r}")
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**63 for s in shape
        ):
            raise InputError(f"{self.path}: tensor {name!r} has a malformed shape {shape!r}")
        check_dims(shape, name, str(self.path))
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            raise InputError(f"{self.path}: tensor {name!r} has data offsets {offsets!r} outside the file")
        dtype = ST_DTYPES[str(code)]
        numel = 1
        for s in shape:
            numel *= s
        bits = {"float4_e2m1fn_x2": 4, "bool": 8}.get(dtype)
        itemsize_bits = bits if bits is not None else itemsize_of(dtype) * 8  # (the registry's: no torch import)
        expected = (numel * itemsize_bits + 7) // 8
        if offsets[1] - offsets[0] != expected:
            raise InputError(
                f"{self.path}: tensor {name!r} of shape {tuple(shape)} {dtype} needs {expected} bytes, "
                f"header gives {offsets[1] - offsets[0]}"
            )
        return name, dtype, tuple(shape), data_start + offsets[0], offsets[1] - offsets[0]

    def records(self) -> Iterator[TensorRecord]:
        buffer = self._map.buffer if self._map is not None else None
        for name, dtype, shape, offset, nbytes in self._entries:
            source = MappedSource(buffer, offset, nbytes, dtype) if buffer is not None else EMPTY_SOURCE
            yield TensorRecord(name, dtype, shape, nbytes, source)

    def parts(self) -> list[Checkpoint]:
        return [self]

    def close(self) -> None:
        if self._map is not None:
            self._map.close()


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        counts = Counter(key for key, _ in pairs)
        raise ValueError(f"duplicate key {next(key for key, count in counts.items() if count > 1)!r}")
    return result
