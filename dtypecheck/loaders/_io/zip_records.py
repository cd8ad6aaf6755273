"""The records of a zip archive as ``torch.load`` reads them, and where Python's ``zipfile`` reads others.

Two readers of one archive can disagree: given two central directories, the end record points torch's reader
(miniz) at one while Python's ``zipfile`` "corrects" its offset to the one just before the end record. A scan that
judged ``zipfile``'s bytes would judge bytes torch never runs. So the entries ``zipfile`` lists
(``read_zip_entries``, whose ranges the loaders map) are checked against what torch's own reader
(``torch._C.PyTorchFileReader``, the one ``torch.load`` uses) returns for every record (``torch_view``), and any
disagreement is a ``zip-differential`` ``fail`` (``differential_findings``). Entries torch would inflate are
inflated here too, within ``MAX_INFLATED_BYTES`` (``read_entry``).

Names are matched as miniz matches them: ``get_record("data.pkl")`` finds ``archive/DATA.PKL`` or ``Data.pkl``
(miniz compares names ASCII-case-insensitively), so both readers' names are folded (``record_key``) before any
lookup, and two names that differ only in case are one name listed twice (``last_copies``).
"""

from __future__ import annotations

import mmap
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import Any

from dtypecheck.errors import InputError
from dtypecheck.loaders._io.mapped import _FILES, Window, read_range
from dtypecheck.loaders.base import Finding

LOCAL_HEADER = struct.Struct("<4s22xHH")
MAX_PICKLE_BYTES = 1 << 30
"""A checkpoint's pickle describes tensors in ~40 bytes each; a gigabyte of it is not a real checkpoint."""
MAX_INFLATED_BYTES = 256 << 20
"""Most bytes a compressed entry may inflate to (torch writes every entry stored; a deflated ``data.pkl`` is
hand-made): a decompression bomb is an input error, not a gigabyte allocation."""
MAX_ZIP_ENTRIES = 2_000_000
"""One entry per storage; ``zipfile`` keeps ~0.5 KB per entry, so this bounds its memory near 1 GB."""
_INFLATE_STEP = 1 << 20


@dataclass(frozen=True)
class ZipEntry:
    offset: int
    """Absolute offset of the entry's data (compressed or not) in the mapped buffer."""
    size: int
    """Its size as read (inflated)."""
    compressed_size: int
    method: int = zipfile.ZIP_STORED

    @property
    def stored(self) -> bool:
        """Stored as is (what torch writes): its bytes can be mapped."""
        return self.method == zipfile.ZIP_STORED and self.compressed_size == self.size


def record_key(name: str) -> str:
    """A record name as torch's reader looks it up: miniz's ``mz_zip_reader_locate_file`` without
    ``MZ_ZIP_FLAG_CASE_SENSITIVE`` lower-cases ASCII letters (only those) on both sides."""
    return name.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def read_zip_entries(buffer: mmap.mmap, start: int, length: int, where: str) -> dict[str, list[ZipEntry]]:
    """Names (folded as torch's reader matches them, ``record_key``) -> data ranges of a zip held in
    ``buffer[start:start+length]`` as Python's ``zipfile`` lists them, each range checked to lie inside, in the
    central directory's order. A name listed twice (in any case) has two ranges (torch reads one of them, see
    ``last_copies``)."""
    try:
        _check_entry_count(Window(buffer, start, length), where)
        with zipfile.ZipFile(Window(buffer, start, length)) as archive:
            infos = archive.infolist()
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        NotImplementedError,  # "zip file version 22.1": a corrupt version field
        OSError,
        ValueError,
        OverflowError,
        IndexError,
        KeyError,
        struct.error,
        EOFError,
    ) as exc:
        raise InputError(f"{where}: corrupt zip archive ({exc})") from None
    entries: dict[str, list[ZipEntry]] = {}
    for info in infos:
        if info.flag_bits & 0x1:
            raise InputError(f"{where}: zip entry {info.filename!r} is encrypted")
        header_at = info.header_offset
        if not 0 <= header_at <= length - LOCAL_HEADER.size:
            raise InputError(f"{where}: zip entry {info.filename!r} points outside the archive")
        signature, name_length, extra_length = LOCAL_HEADER.unpack(
            read_range(buffer, start + header_at, LOCAL_HEADER.size)
        )
        if signature != b"PK\x03\x04":
            raise InputError(f"{where}: zip entry {info.filename!r} has no local header (corrupt zip)")
        data_at = header_at + LOCAL_HEADER.size + name_length + extra_length
        if data_at + info.compress_size > length:
            raise InputError(f"{where}: zip entry {info.filename!r} runs past the end of the file (truncated?)")
        entry = ZipEntry(start + data_at, info.file_size, info.compress_size, info.compress_type)
        entries.setdefault(record_key(info.filename), []).append(entry)
    return entries


def _check_entry_count(window: Window, where: str) -> None:
    """Refuse a central directory listing millions of entries before ``zipfile`` builds an object for each."""
    end_record = getattr(zipfile, "_EndRecData", None)  # private, but stable since Python 2; skip if it goes
    if end_record is None:
        return
    record = end_record(window)
    if record is None:
        raise zipfile.BadZipFile("File is not a zip file")
    entries = record[zipfile._ECD_ENTRIES_TOTAL]  # type: ignore[attr-defined]
    if entries > MAX_ZIP_ENTRIES:
        raise InputError(f"{where}: zip archive lists {entries} entries, over the {MAX_ZIP_ENTRIES} limit")


def last_copies(copies: dict[str, list[ZipEntry]]) -> tuple[dict[str, ZipEntry], list[Finding]]:
    """One entry per name (the last copy) and a ``duplicate-entry`` ``fail`` finding per name listed twice: torch's
    reader finds a name by a binary search over an unstably sorted directory, so which copy it reads depends on the
    archive's layout, and the copy scanned may not be the one loaded."""
    duplicates = [
        Finding("duplicate-entry", "fail", f"{name} appears {len(ranges)} times: torch reads one of them")
        for name, ranges in copies.items()
        if len(ranges) > 1
    ]
    return {name: ranges[-1] for name, ranges in copies.items()}, duplicates


def read_entry(buffer: mmap.mmap, entry: ZipEntry, where: str, what: str, limit: int = MAX_PICKLE_BYTES) -> bytes:
    """An entry's bytes as torch reads them: stored bytes as they are, deflated ones inflated (as miniz does),
    either way at most ``limit`` bytes, or an ``InputError``."""
    if entry.size > limit:
        raise InputError(f"{where}: {what} is {entry.size} bytes, over the {limit} limit")
    if entry.stored:
        return bytes(read_range(buffer, entry.offset, entry.size))
    if entry.method != zipfile.ZIP_DEFLATED:
        raise InputError(f"{where}: {what} is compressed with zip method {entry.method}, which torch cannot read")
    bound = min(limit, MAX_INFLATED_BYTES)
    if entry.size > bound:
        raise InputError(f"{where}: {what} inflates to {entry.size} bytes, over the {bound} limit")
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    out = bytearray()
    done = 0
    try:
        while done < entry.compressed_size and not inflater.eof:
            piece = bytes(read_range(buffer, entry.offset + done, min(_INFLATE_STEP, entry.compressed_size - done)))
            done += len(piece)
            while piece and not inflater.eof:
                out += inflater.decompress(piece, bound + 1 - len(out))
                if len(out) > bound:
                    raise InputError(f"{where}: {what} inflates past the {bound} limit (a decompression bomb)")
                piece = inflater.unconsumed_tail
    except zlib.error as exc:
        raise InputError(f"{where}: {what} is corrupt deflated data ({exc})") from None
    if len(out) != entry.size:
        raise InputError(f"{where}: {what} inflates to {len(out)} bytes, not the {entry.size} its entry declares")
    return bytes(out)


@dataclass(frozen=True)
class TorchView:
    """The archive as ``torch.load``'s reader sees it."""

    records: dict[str, tuple[int, int]]
    """Record name (under the archive's folder, which torch strips; folded by ``record_key``) -> (absolute data
    offset, size as read) of the record torch's lookup of that name returns."""
    reader: Any = field(repr=False, compare=False)

    def pickle(self) -> bytes | None:
        """The ``data.pkl`` torch would unpickle (inflated if it is deflated), read now; None when the archive has
        none, it is over ``MAX_INFLATED_BYTES``, or torch's reader fails on it (``torch.load`` would fail too)."""
        found = self.records.get("data.pkl")
        if found is None or found[1] > MAX_INFLATED_BYTES:
            return None
        try:
            data = self.reader.get_record("data.pkl")
        except (RuntimeError, ValueError, OSError, MemoryError):
            return None
        return bytes(data) if isinstance(data, bytes | bytearray) else None


def torch_view(buffer: mmap.mmap, start: int, length: int) -> TorchView | None:
    """What torch's own reader (``torch._C.PyTorchFileReader``, miniz) reads in ``buffer[start:start+length]``, or
    None when it refuses the archive (``torch.load`` then fails before it runs any pickle)."""
    import torch

    reader_class = getattr(torch._C, "PyTorchFileReader", None)
    if reader_class is None:
        return None
    owner = _FILES.get(id(buffer))
    whole_file = owner is not None and start == 0 and length == owner.size
    try:  # a whole file by its path (torch reads it in C++), a byte range of one through a Window
        # a path as bytes: a name that is not UTF-8 (a str with surrogates) would send pybind11 to the file-like
        # overload, which calls .tell() on it
        reader = reader_class(
            os.fsencode(owner.path) if whole_file and owner is not None else Window(buffer, start, length)
        )
        names = reader.get_all_records()
        if len(names) > MAX_ZIP_ENTRIES:
            return None
        records = {
            record_key(name): (start + reader.get_record_offset(name), reader.get_record_size(name)) for name in names
        }
    except (RuntimeError, ValueError, OSError, OverflowError, MemoryError):
        return None
    return TorchView(records, reader)


def differential_findings(copies: dict[str, list[ZipEntry]], view: TorchView | None, where: str) -> list[Finding]:
    """A ``zip-differential`` ``fail`` when torch's reader and Python's ``zipfile`` disagree on any entry: its
    name, where its bytes lie or how many there are. (None from ``torch_view``: torch refuses the archive, so
    ``torch.load`` reads nothing of it.)"""
    if view is None:
        return []
    first = next(iter(copies), "")
    prefix = first.split("/", 1)[0] + "/" if "/" in first else ""
    ours = {name.removeprefix(prefix): {(e.offset, e.size) for e in entries} for name, entries in copies.items()}
    problems = []
    for name in sorted(set(ours) | set(view.records)):
        if name not in view.records:
            problems.append(f"{name} is listed by Python's zipfile only")
        elif name not in ours:
            problems.append(f"{name} is read by torch only")
        elif view.records[name] not in ours[name]:
            problems.append(f"torch reads {name} from other bytes")
    if not problems:
        return []
    shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    detail = (
        f"torch's zip reader and Python's zipfile disagree on {len(problems)} entries ({shown}): torch.load would "
        "read bytes other than the ones scanned (a smuggling attempt)"
    )
    return [Finding("zip-differential", "fail", detail)]
