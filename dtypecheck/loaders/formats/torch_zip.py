"""torch zip checkpoints (``torch.save``'s default since 1.6): ``<prefix>/data.pkl`` plus one stored (uncompressed)
entry ``<prefix>/data/<key>`` per storage.

``zipfile`` reads only the central directory; each storage's data offset is computed from its local file header
and checked against the archive's bounds, then the storage is read through the file's memory map. Every entry is
also checked against torch's own reader (``zip_records``): where they disagree, the scan fails.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dtypecheck.errors import InputError, NotACheckpointError
from dtypecheck.loaders._io.mapped import (
    EMPTY_SOURCE,
    FileCheckpoint,
    MappedSource,
    StridedSource,
    itemsize_of,
)
from dtypecheck.loaders._io.pickle_globals import global_findings, worst_first
from dtypecheck.loaders._io.pickle_vm import unpickle
from dtypecheck.loaders._io.torch_objects import (
    StorageRef,
    TensorRef,
    collect_tensors,
    require_tensors,
    storage_from_pid,
    torch_call,
    torch_dtype_available,
)
from dtypecheck.loaders._io.zip_records import (
    ZipEntry,
    differential_findings,
    last_copies,
    read_entry,
    read_zip_entries,
    record_key,
    torch_view,
)
from dtypecheck.loaders.base import Finding, TensorRecord, TensorSource

EXPANSION_LIMIT = 64
"""A view may show more elements than its storage holds (stride 0), but not this many times the file's bytes."""


def archive_prefix(entries: dict[str, list[ZipEntry]], where: str) -> str:
    """The archive's folder, as torch reads it: the first entry's top folder, which every entry must be under
    (torch refuses an archive with a second top-level folder). Names are folded (``record_key``), as torch's
    lookups of ``data.pkl`` and ``data/<key>`` fold them."""
    prefix = _top_folder(entries)
    if not prefix or prefix + "data.pkl" not in entries:
        if any(name.endswith("/.data/version") for name in entries):
            raise NotACheckpointError(
                f"{where}: a torch.package archive without .data/extern_modules, which PackageImporter refuses"
            )
        raise NotACheckpointError(f"{where}: zip archive is not a torch checkpoint (no data.pkl)")
    return check_one_folder(entries, where)


def _top_folder(entries: dict[str, list[ZipEntry]]) -> str:
    first = next(iter(entries), "")
    return first.split("/", 1)[0] + "/" if "/" in first else ""


def check_one_folder(entries: dict[str, list[ZipEntry]], where: str) -> str:
    """The archive's folder (``<name>/``), or an ``InputError`` when an entry lies outside it (torch's reader
    refuses such an archive)."""
    prefix = _top_folder(entries)
    stray = next((name for name in entries if not prefix or not name.startswith(prefix)), None)
    if stray is not None:
        outside = prefix or "a folder"
        raise InputError(f"{where}: zip archive has entries outside {outside} ({stray!r}); torch refuses it")
    return prefix


def check_byteorder(entries: dict[str, ZipEntry], prefix: str, buffer: mmap.mmap, where: str) -> None:
    """An ``InputError`` for an archive whose ``byteorder`` record says big-endian."""
    order = entries.get(prefix + "byteorder")
    if order is not None and read_entry(buffer, order, where, "byteorder") not in {b"little", b""}:
        raise InputError(f"{where}: big-endian checkpoints are not supported")


def open_archive(
    buffer: mmap.mmap, size: int, where: str, folder_of: Callable[[dict[str, list[ZipEntry]], str], str]
) -> tuple[dict[str, ZipEntry], str, list[Finding]]:
    """A whole-file archive's entries (the copy of each that torch reads), its folder (``folder_of``:
    ``archive_prefix`` or ``check_one_folder``), its byte order checked, and its ``duplicate-entry`` and
    ``zip-differential`` findings."""
    copies = read_zip_entries(buffer, 0, size, where)
    entries, duplicates = last_copies(copies)
    prefix = folder_of(copies, where)
    check_byteorder(entries, prefix, buffer, where)
    return entries, prefix, [*duplicates, *differential_findings(copies, torch_view(buffer, 0, size), where)]


PACKAGE_POLYGLOT = (
    "this torch.save zip is also a torch.package archive (.data/extern_modules): PackageImporter.load_pickle reads "
    "its other pickles and the code it holds, which the scan of data.pkl did not judge"
)


@dataclass
class TorchArchive:
    """The tensors of one torch zip held in a buffer (a whole file, or a byte range of a ``.distcp`` file)."""

    buffer: mmap.mmap
    start: int
    length: int
    where: str
    file_size: int
    findings: list[Finding] = field(default_factory=list)
    tensors: list[tuple[str, TensorRef]] = field(default_factory=list)
    entries: dict[str, ZipEntry] = field(default_factory=dict)
    prefix: str = ""

    def __post_init__(self) -> None:
        copies = read_zip_entries(self.buffer, self.start, self.length, self.where)
        self.entries, duplicates = last_copies(copies)
        self.findings.extend(duplicates)
        view = torch_view(self.buffer, self.start, self.length)
        differential = differential_findings(copies, view, self.where)
        theirs = view.pickle() if differential and view is not None else None
        if theirs is not None:
            from dtypecheck.loaders._io.pickle_files import bytes_globals

            # The scan reads zipfile's bytes; the data.pkl torch would run instead is judged too.
            differential += global_findings(list(bytes_globals(theirs, self.where).globals))
        self.findings.extend(differential)
        self.prefix = archive_prefix(copies, self.where)
        check_byteorder(self.entries, self.prefix, self.buffer, self.where)
        if self.prefix + ".data/extern_modules" in self.entries:
            self.findings.append(Finding("pickle-polyglot", "fail", PACKAGE_POLYGLOT))
        # Every copy of a duplicated data.pkl is judged (see ``last_copies``); the last one is scanned.
        root = None
        self._storages = StorageLookup(self.entries, self.prefix + "data/", self.where)
        for pickle_entry in copies[self.prefix + "data.pkl"]:
            pickled = self._read(pickle_entry, "data.pkl")
            root, globals_seen = unpickle(pickled, where=self.where, call=torch_call, persistent_load=self._storages)
            self.findings.extend(f for f in global_findings(globals_seen) if f not in self.findings)
        self.tensors, unsupported = collect_tensors(root, self.where)
        require_tensors(self.tensors, sum(name.startswith(self.prefix + "data/") for name in self.entries), self.where)
        self.findings[:] = worst_first([*self.findings, *unsupported])
        self._records = [self._record(name, ref) for name, ref in self.tensors]  # bounds checked before any read
        check_total_work(self._records, self.file_size, self.where)

    def _read(self, entry: ZipEntry, what: str) -> bytes:
        return read_entry(self.buffer, entry, self.where, what)

    def _record(self, name: str, ref: TensorRef) -> TensorRecord:
        entry = self._storages.entry(ref.storage)
        return make_record(name, ref, self.buffer, entry.offset, entry.size, self.where, self.file_size)

    def records(self) -> Iterator[TensorRecord]:
        return iter(self._records)


class StorageLookup:
    """The persistent-id hook of one pickle whose storages are the archive's records ``<folder><key><suffix>``
    (torch.save: ``archive/data/0``; TorchScript constants: ``archive/constants/0``; torch.package:
    ``pkg/.data/0.storage``), each checked present and stored (mappable) as the pickle names it."""

    def __init__(self, entries: dict[str, ZipEntry], folder: str, where: str, suffix: str = "") -> None:
        self._entries = entries
        self._folder = folder
        self._suffix = suffix
        self._where = where

    def __call__(self, pid: object) -> Any:
        storage = storage_from_pid(pid)
        self.entry(storage)
        return storage

    def entry(self, storage: StorageRef) -> ZipEntry:
        name = self._folder + storage.key + self._suffix
        entry = self._entries.get(record_key(name))
        if entry is None:
            raise InputError(f"{self._where}: storage {name} is missing from the archive")
        if not entry.stored:
            raise InputError(f"{self._where}: storage {name} is compressed; it cannot be mapped")
        return entry


def make_record(
    name: str, ref: TensorRef, buffer: mmap.mmap, offset: int, storage_nbytes: int, where: str, file_size: int
) -> TensorRecord:
    """A record for ``ref`` whose storage lies at ``buffer[offset:offset+storage_nbytes]``, bounds checked."""
    if not torch_dtype_available(ref.dtype) or ref.dtype.startswith("q"):
        raise InputError(f"{where}: tensor {name!r} has dtype {ref.dtype}, which this torch cannot read")
    itemsize = itemsize_of(ref.dtype)
    nbytes = ref.numel * itemsize
    if nbytes == 0:  # whatever its sizes and strides, an empty view reads nothing (and as_strided may overflow)
        return TensorRecord(name, ref.dtype, ref.shape, 0, EMPTY_SOURCE, saved_device=ref.storage.location)
    storage_elements = storage_nbytes // itemsize
    if ref.last_element() >= storage_elements:
        raise InputError(
            f"{where}: tensor {name!r} of shape {ref.shape} reaches element {ref.last_element()} "
            f"of a storage holding {storage_elements}"
        )
    if nbytes > EXPANSION_LIMIT * file_size + (64 << 20):
        raise InputError(f"{where}: tensor {name!r} claims {nbytes} bytes, far beyond the file's {file_size}")
    source: TensorSource
    if ref.is_contiguous():
        source = MappedSource(buffer, offset + ref.offset * itemsize, nbytes, ref.dtype)
    else:
        source = StridedSource(buffer, offset, storage_nbytes, ref.dtype, ref.offset, ref.shape, ref.stride)
    device = ref.storage.location
    return TensorRecord(name, ref.dtype, ref.shape, nbytes, source, saved_device=device)


def check_total_work(records: list[TensorRecord], file_size: int, where: str) -> None:
    """Views may repeat data (stride 0, overlapping windows), but all the distinct views of a file together may not
    claim more than ``EXPANSION_LIMIT`` times its bytes: 5000 stride-0 views of one float would otherwise each
    pass ``make_record``'s check and the scan would read for hours. (Names for the same view count once: the scan
    reads a shared view once.)"""
    total = sum(record.nbytes for record in {record.source: record for record in records}.values())
    if total > EXPANSION_LIMIT * file_size + (64 << 20):
        raise InputError(f"{where}: its tensors claim {total} bytes in all, far beyond the file's {file_size}")


class TorchZipCheckpoint(FileCheckpoint):
    """A ``torch.save`` zip file (``.pt``, ``.pth``, ``.bin``, Lightning ``.ckpt``)."""

    format = "torch-zip"

    def _parse(self) -> None:
        self._archive = TorchArchive(self._map.buffer, 0, self._map.size, self.source, self._map.size)
        self.findings = self._archive.findings

    def records(self) -> Iterator[TensorRecord]:
        return self._archive.records()
