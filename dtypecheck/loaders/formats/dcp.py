"""``torch.distributed.checkpoint`` folders: a pickled ``.metadata`` plus ``*.distcp`` data files.

``.metadata`` (read with the safe unpickler) lists each tensor's dtype, size and chunks; ``storage_data`` maps
each chunk to a byte range of a ``.distcp`` file, which holds a small ``torch.save`` zip per chunk. Non-tensor
entries (``BytesStorageMetadata``) are ``torch.save``d objects: their pickles are read too, for their globals.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dtypecheck.errors import InputError
from dtypecheck.loaders._io.mapped import ChainSource, FileMap, itemsize_of
from dtypecheck.loaders._io.pickle_globals import global_findings, worst_first
from dtypecheck.loaders._io.pickle_vm import PickleObject, SafeUnpickler
from dtypecheck.loaders._io.regular import read_regular_file
from dtypecheck.loaders._io.torch_objects import dtype_from_global, torch_call
from dtypecheck.loaders.base import Checkpoint, Finding, TensorRecord, check_dims
from dtypecheck.loaders.formats.torch_zip import TorchArchive

MAX_METADATA_BYTES = 256 * 1024 * 1024


def _fields(value: Any) -> dict[Any, Any]:
    """The attributes of an inert dataclass instance (its ``BUILD`` state)."""
    if isinstance(value, PickleObject):
        state = value.state
        if isinstance(state, tuple) and len(state) == 2 and state[0] is None and isinstance(state[1], dict):
            return state[1]  # (None, slots) for dataclasses with __slots__
        if isinstance(state, dict):
            return state
    return {}


def _ints(value: Any) -> tuple[int, ...] | None:
    """``value`` as a tuple of non-negative ints (a size or an offset), or None when it is anything else."""
    if isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return value
    return None


def _class_name(value: Any) -> str:
    return str(value.factory.name) if isinstance(value, PickleObject) and hasattr(value.factory, "name") else ""


def _properties_dtype(properties: Any) -> str | None:
    if isinstance(properties, PickleObject):
        state = properties.state
        if isinstance(state, tuple) and state:
            return dtype_from_global(state[0])
        if isinstance(state, dict):
            return dtype_from_global(state.get("dtype"))
    return None


@dataclass(frozen=True)
class _Chunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    offset: int
    length: int


class DcpCheckpoint:
    format = "torch-dcp"

    def __init__(self, folder: Path) -> None:
        self.source = str(folder)
        self.folder = folder
        self.findings: list[Finding] = []
        self._maps: dict[str, FileMap] = {}
        self._chunks_read: set[tuple[str, tuple[int, ...]]] = set()
        try:
            self._records = self._parse()
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            # The metadata is inert data of any shape; whatever it holds that this reading did not expect is bad input.
            self.close()
            raise InputError(f"{folder / '.metadata'}: malformed metadata ({type(exc).__name__}: {exc})") from None
        except BaseException:
            self.close()
            raise

    def _parse(self) -> list[TensorRecord]:
        meta_path = self.folder / ".metadata"
        where = str(meta_path)
        machine = SafeUnpickler(read_regular_file(meta_path, MAX_METADATA_BYTES), where=where, call=torch_call)
        root = machine.load()
        self._add_findings(global_findings(machine.globals_seen))
        fields = _fields(root)
        tensors, storage = fields.get("state_dict_metadata"), fields.get("storage_data")
        if _class_name(root) != "Metadata" or not isinstance(tensors, dict) or not isinstance(storage, dict):
            raise InputError(f"{where}: not a torch.distributed.checkpoint metadata file")
        locations: dict[tuple[str, tuple[int, ...]], dict[Any, Any]] = {}
        for index, info in storage.items():
            key, value = _fields(index), _fields(info)
            offset = _ints(key.get("offset") or ())  # a bytes item's index has no offset
            if isinstance(key.get("fqn"), str) and offset is not None:
                locations[(key["fqn"], offset)] = value
        records = []
        for name, entry in tensors.items():
            kind = _class_name(entry)
            if kind == "BytesStorageMetadata":
                continue
            if kind != "TensorStorageMetadata":
                raise InputError(f"{where}: entry {name!r} has unknown metadata {kind or type(entry).__name__}")
            records.append(self._tensor_record(str(name), _fields(entry), locations, where))
        # Every other stored item (a bytes item, or one no entry names) is a torch.save'd object that dcp.load
        # unpickles with weights_only=False: its pickle is read for the globals it references.
        for (fqn, offset), info in locations.items():
            if (fqn, offset) not in self._chunks_read:
                self._add_findings(self._archive(info, fqn).findings)
        from dtypecheck.loaders.formats.side_files import judge_below

        scanned = {self.folder / name for name in (".metadata", *self._maps)}
        self._add_findings(judge_below(self.folder, scanned, "", distributed_findings))
        self.findings[:] = worst_first(self.findings)
        return records

    def _tensor_record(
        self, name: str, entry: dict[Any, Any], locations: dict[tuple[str, tuple[int, ...]], dict[Any, Any]], where: str
    ) -> TensorRecord:
        dtype, shape = _properties_dtype(entry.get("properties")), _ints(entry.get("size"))
        chunks = entry.get("chunks")
        if dtype is None or shape is None or not isinstance(chunks, list):
            raise InputError(f"{where}: tensor {name!r} has malformed metadata")
        check_dims(shape, name, where)
        sources = []
        covered = 0
        described = [(_ints(_fields(c).get("offsets")), _ints(_fields(c).get("sizes"))) for c in chunks]
        for chunk_offsets, chunk_sizes in sorted(described, key=lambda c: c[0] or ()):
            info = locations.get((name, chunk_offsets)) if chunk_offsets is not None else None
            self._chunks_read.add((name, chunk_offsets or ()))
            if info is None or chunk_sizes is None:
                raise InputError(f"{where}: tensor {name!r} has a chunk with no storage entry")
            archive = self._archive(info, f"{name} chunk {chunk_offsets}")
            self._add_findings(archive.findings)
            if len(archive.tensors) != 1:
                raise InputError(f"{where}: tensor {name!r}: chunk does not hold exactly one tensor")
            record = next(archive.records())
            if record.dtype != dtype or record.shape != tuple(chunk_sizes):
                raise InputError(
                    f"{where}: tensor {name!r}: chunk holds {record.dtype} {record.shape}, "
                    f"metadata says {dtype} {tuple(chunk_sizes)}"
                )
            covered += record.numel
            if record.source is not None:
                sources.append(record.source)
        numel = 1
        for s in shape:
            numel *= s
        if covered != numel:
            self.findings.append(
                Finding("dcp-chunks", "fail", f"chunks hold {covered} of {numel} elements", tensor=name)
            )
        return TensorRecord(name, dtype, shape, numel * itemsize_of(dtype), ChainSource(tuple(sources)))

    def _archive(self, info: dict[Any, Any], what: str) -> TorchArchive:
        relative, offset, length = info.get("relative_path"), info.get("offset"), info.get("length")
        if info.get("transform_descriptors"):
            raise InputError(f"{self.source}: {what} is stored with transforms (compressed); not supported")
        if not isinstance(relative, str) or not isinstance(offset, int) or not isinstance(length, int):
            raise InputError(f"{self.source}: {what} has a malformed storage entry")
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            raise InputError(f"{self.source}: {what} points outside the folder ({relative})")
        mapped = self._maps.get(relative)
        if mapped is None:
            path = self.folder / relative
            if not path.is_file():
                raise InputError(f"{self.source}: data file {relative} is missing")
            mapped = self._maps[relative] = FileMap(path)
        if offset < 0 or length <= 0 or offset + length > mapped.size:
            raise InputError(f"{self.source}: {what} lies outside {relative} (truncated?)")
        where = f"{self.folder / relative} [{what}]"
        return TorchArchive(mapped.buffer, offset, length, where, mapped.size)

    def _add_findings(self, findings: list[Finding]) -> None:
        for finding in findings:
            if finding not in self.findings:
                self.findings.append(finding)

    def records(self) -> Iterator[TensorRecord]:
        return iter(self._records)

    def parts(self) -> list[Checkpoint]:
        return [self]

    def close(self) -> None:
        for mapped in self._maps.values():
            mapped.close()
        self._maps.clear()


def distributed_findings(path: Path, label: str, scanned: set[Path]) -> list[Finding]:
    """What ``dcp.load`` of a distributed checkpoint in a subfolder (an FSDP ``pytorch_model_fsdp_0/``) would
    run: its security findings, read as a scan of it reads them (its bytes items are ``torch.save`` archives inside
    its ``.distcp`` files, which no reading of a whole file finds), each naming the subfolder.

    A ``.metadata`` that is no distributed checkpoint's and references no global the unpickler could import (a
    plain text or JSON file some other tool wrote; text's ``c`` reads as a ``GLOBAL`` of no Python name) is no
    ``Metadata``: ``FileSystemReader.read_metadata`` ``pickle.load``s it and stops there (it fails, or sets
    ``storage_meta`` on a plain value, which fails), having run nothing. Such a
    subfolder is judged file by file like any other; any other unreadable one stays an ``unreadable-file`` fail."""
    from dtypecheck.findings import is_security
    from dtypecheck.loaders._io.pickle_files import file_globals, importable
    from dtypecheck.loaders.formats.side_files import judge_below

    try:
        checkpoint = DcpCheckpoint(path)
    except InputError as exc:
        try:
            report = file_globals(path / ".metadata")
        except (InputError, OSError, ValueError):
            report = None
        if report is not None and not any(importable(ref) for ref in report.globals) and not report.limited:
            return judge_below(path, scanned, label, distributed_findings)
        return [Finding("unreadable-file", "fail", f"{label}: a distributed checkpoint dcp.load would read ({exc})")]
    try:
        found = [f for f in checkpoint.findings if is_security(f) or f.kind == "unreadable-file"]
    finally:
        checkpoint.close()
    return [replace(f, detail=f"{f.detail} (in {label})") for f in found]
