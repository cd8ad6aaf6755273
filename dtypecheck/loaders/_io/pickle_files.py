"""Which globals would ``torch.load(weights_only=False)`` reach in a file, whatever else the file is?

A scan judges the globals of the pickles it reads for tensors; this module covers the pickles it would otherwise
never read: files beside a sharded index (``training_args.bin``, ``optimizer.pt``), a ``pytorch_model.bin`` next to
the ``model.safetensors`` that is scanned instead, raw pickles (``torch.load`` of a non-zip file runs its first
pickle before it checks the magic number), and the files of other formats that ``torch.load`` would read as a
zip, a legacy tar or a pickle (polyglots, ``polyglot_findings``). Globals are collected while the pickle is
interpreted, so a stream that breaks after its payload still reports it.
"""

from __future__ import annotations

import mmap
import zipfile
import zlib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from dtypecheck.errors import InputError
from dtypecheck.loaders._io.mapped import FileMap, LineTooLongError, Window, read_range
from dtypecheck.loaders._io.pickle_globals import judge, worst_first
from dtypecheck.loaders._io.pickle_report import PickleReport, lenient_persistent_id, merged
from dtypecheck.loaders._io.pickle_vm import BuildHook, GlobalRef, PickleLimitError, SafeUnpickler
from dtypecheck.loaders.base import Finding

if TYPE_CHECKING:
    from dtypecheck.loaders._io.zip_records import ZipEntry

MAX_STREAM_PICKLES = 5
"""A legacy torch file holds five pickles back to back; ``torch.load`` of a raw pickle runs the first."""
MAX_ZIP_PICKLE_BYTES = 1 << 30


def _stream_globals(stream: Window, where: str, count: int, after_build: BuildHook | None = None) -> PickleReport:
    seen: dict[GlobalRef, None] = {}
    problem = None
    limited = False
    for _ in range(count):
        if stream.tell() >= stream.length:
            break
        machine = SafeUnpickler(stream, where=where, persistent_load=lenient_persistent_id, after_build=after_build)
        try:
            machine.load()
        except InputError as exc:
            problem, limited = str(exc), isinstance(exc, PickleLimitError | LineTooLongError)
        seen.update(dict.fromkeys(machine.globals_seen))
        if problem is not None:
            break
    return PickleReport(tuple(seen), problem, limited)


def bytes_globals(data: bytes, where: str) -> PickleReport:
    """Globals of the one pickle ``data`` holds."""
    return _stream_globals(Window(data, 0, len(data)), where, 1)


def file_globals(path: Path) -> PickleReport:
    """Globals of every pickle ``torch.load`` would run in ``path``, found as ``torch.load`` finds them: each
    ``data.pkl`` of a zip (the one torch's reader returns and every copy ``zipfile`` lists, inflated if deflated),
    the pickles of a legacy tar's members, or up to five pickles from the start of any other file."""
    mapped = FileMap(path)
    try:
        return _globals_in(mapped.buffer, mapped.size, str(path))
    finally:
        mapped.close()


def _other_format(path: Path) -> str | None:
    """``safetensors`` or ``gguf`` when ``path``'s content is one (read as such, not as a pickle stream)."""
    from dtypecheck.loaders._io.safetensors_head import looks_like_safetensors

    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(16)
    except OSError:
        return None
    if looks_like_safetensors(head, size):
        return "safetensors"
    return "gguf" if head.startswith(b"GGUF") else None


def _globals_in(buffer: mmap.mmap, size: int, where: str) -> PickleReport:
    if bytes(read_range(buffer, 0, min(4, size))) == b"PK\x03\x04":
        return _zip_globals(buffer, size, where)
    npy = _npy_globals(buffer, 0, size, where)
    if npy is not None:  # torch.load fails on the magic's STACK_GLOBAL; np.load(allow_pickle=True) unpickles
        return npy
    from dtypecheck.loaders._io.legacy_tar import tar_globals

    in_tar = tar_globals(buffer, size, where)
    if in_tar is not None:
        return in_tar
    return _with_joblib_arrays(_stream_globals(Window(buffer, 0, size), where, MAX_STREAM_PICKLES), buffer, size, where)


def _with_joblib_arrays(plain: PickleReport, buffer: mmap.mmap | bytes, size: int, where: str) -> PickleReport:
    """``plain`` (the stream read as ``pickle.load`` and ``torch.load`` read it) and, where it holds a numpy array
    as ``joblib.dump`` writes one, what ``joblib.load`` reads past the array's bytes: two readings, both judged."""
    from dtypecheck.loaders._io.joblib_pickles import WRAPPER, array_bytes

    if WRAPPER not in plain.globals:
        return plain
    joblib = _stream_globals(Window(buffer, 0, size), where, 1, array_bytes)
    if joblib.problem is None and not plain.limited:  # the plain reading broke off in an array's bytes, as
        plain = replace(plain, problem=None)  # pickle.load does there: its globals until then still count
    return merged(plain, joblib)


def inflated_globals(path: Path) -> tuple[PickleReport | None, str | None]:
    """(globals, why it was not read) of the pickle a compressed ``path`` holds, read as ``joblib.load`` (by
    its first bytes) and ``pandas.read_pickle`` (by its name) inflate it; (None, None) when it is not compressed,
    or holds no pickle. A file named as a pickle (``extra.joblib``, ``x.pkl.gz``) is unpickled whatever it inflates
    to; any other only when it inflates to a pickle of protocol 2 or later (``joblib.load`` takes any name)."""
    from dtypecheck.loaders._io.joblib_pickles import compression, inflate, pickle_named

    with path.open("rb") as handle:
        kind = compression(handle.read(8))
    named = pickle_named(path)
    if kind is None or (kind == "zstd" and not named):  # only pandas reads zstd, and by the name
        return None, None
    inflated = inflate(path, kind, None if named else looks_like_pickle)
    if inflated is None:
        return None, None
    if inflated.refused is not None:
        return None, inflated.refused
    where, data = f"{path} ({inflated.kind}-compressed)", inflated.data
    report = _with_joblib_arrays(_stream_globals(Window(data, 0, len(data)), where, 1), data, len(data), where)
    if inflated.problem is not None and report.problem is None:
        report = replace(report, problem=inflated.problem)
    return report, None


def _zip_globals(buffer: mmap.mmap, size: int, where: str) -> PickleReport:
    from dtypecheck.loaders._io.zip_records import differential_findings, read_entry, read_zip_entries, torch_view

    seen: dict[GlobalRef, None] = {}
    problems: list[str] = []
    view = torch_view(buffer, 0, size)
    theirs = view.pickle() if view is not None else None
    if theirs is not None:
        report = bytes_globals(theirs, where)
        seen.update(dict.fromkeys(report.globals))
        problems += [report.problem] if report.problem else []
    elif view is not None and "data.pkl" in view.records:
        problems.append(f"{where}: torch would read a data.pkl of {view.records['data.pkl'][1]} bytes (not read)")
    try:
        entries = read_zip_entries(buffer, 0, size, where)
    except InputError as exc:
        if view is None:
            return PickleReport(tuple(seen), str(exc))
        detail = f"torch's zip reader reads this archive, Python's zipfile cannot ({exc}): a smuggling attempt"
        return PickleReport(tuple(seen), str(exc), differential=(Finding("zip-differential", "fail", detail),))
    differential = differential_findings(entries, view, where)
    for name, copies in entries.items():
        if not name.endswith("data.pkl"):
            continue
        for entry in copies:
            try:
                data = read_entry(buffer, entry, where, name, MAX_ZIP_PICKLE_BYTES)
            except InputError as exc:
                problems.append(str(exc))
                continue
            report = bytes_globals(data, where)
            seen.update(dict.fromkeys(report.globals))
            problems += [report.problem] if report.problem else []
    for name, copies in entries.items():  # an .npz: np.load(allow_pickle=True)[key] unpickles object arrays
        for entry in copies:
            try:
                npy = _npz_member_globals(buffer, entry, where, name)
            except InputError as exc:
                problems.append(str(exc))
                continue
            if npy is not None:
                seen.update(dict.fromkeys(npy.globals))
                problems += [npy.problem] if npy.problem else []
    return PickleReport(tuple(seen), problems[0] if problems else None, differential=tuple(differential))


def _npy_globals(buffer: mmap.mmap | bytes, start: int, length: int, where: str) -> PickleReport | None:
    """The globals of the pickle ``np.load(allow_pickle=True)`` runs in the ``.npy`` array held in
    ``buffer[start:start+length]``; None when it runs none (not an array, or one without objects)."""
    from dtypecheck.loaders._io.numpy_arrays import MAX_HEADER_BYTES, PREFIX_BYTES, header_span, holds_objects

    span = header_span(bytes(read_range(buffer, start, min(PREFIX_BYTES, length))))
    if span is None:
        return None
    offset, header_length, encoding = span
    if offset + header_length > length:
        return None  # np.load stops at the cut header
    header = None if header_length > MAX_HEADER_BYTES else bytes(read_range(buffer, start + offset, header_length))
    if not holds_objects(header, encoding):
        return None
    body = offset + header_length
    return _stream_globals(Window(buffer, start + body, length - body), where, 1)


def _npz_member_globals(buffer: mmap.mmap, entry: ZipEntry, where: str, name: str) -> PickleReport | None:
    """``_npy_globals`` of one zip member (inflated first when deflated, as ``np.savez_compressed`` writes)."""
    from dtypecheck.loaders._io.numpy_arrays import MAGIC
    from dtypecheck.loaders._io.zip_records import read_entry

    if entry.stored:
        if bytes(read_range(buffer, entry.offset, min(len(MAGIC), entry.size))) != MAGIC:
            return None
        return _npy_globals(buffer, entry.offset, entry.size, f"{where}: {name}")
    if entry.method != zipfile.ZIP_DEFLATED:
        return None  # numpy's zipfile reads stored and deflated members; torch writes only stored ones
    try:
        head = zlib.decompressobj(-zlib.MAX_WBITS).decompress(
            bytes(read_range(buffer, entry.offset, min(entry.compressed_size, 1 << 16))), len(MAGIC)
        )
    except zlib.error:
        return None  # numpy's zipfile fails on it too
    if head != MAGIC:
        return None
    data = read_entry(buffer, entry, where, name, MAX_ZIP_PICKLE_BYTES)
    return _npy_globals(data, 0, len(data), f"{where}: {name}")


def looks_like_pickle(head: bytes) -> bool:
    """A pickle of protocol 2 or later (what ``torch.save``, ``pickle.dump`` and ``joblib`` write)."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def importable(ref: GlobalRef) -> bool:
    """Whether the real unpickler could import ``ref`` at all (a name made of Python identifiers)."""
    return all(part.isidentifier() for part in (*ref.module.split("."), *ref.name.split(".")))


def side_file_findings(path: Path, label: str) -> list[Finding]:
    """What ``torch.load`` of a file that is not scanned for tensors would run: a ``pickle-global`` finding per
    global (detail ``module.name (in LABEL)``), any ``zip-differential``, an ``unreadable-file`` ``fail`` when a
    pickle torch would go on running stopped at one of dtypecheck's limits, and an ``unreadable-file`` warning when
    a pickle breaks off after referencing globals (what it referenced until then is reported)."""
    other = _other_format(path)
    if other is not None:  # a safetensors or GGUF side file (Mistral's consolidated.safetensors): both readings
        try:
            mapped = FileMap(path)
        except (InputError, OSError) as exc:
            return [Finding("unreadable-file", "warn", f"{label}: cannot be read ({exc})")]
        try:
            found = polyglot_findings(mapped.buffer, mapped.size, label, other)
        finally:
            mapped.close()
        return [replace(f, detail=f"{f.detail} (in {label})") if f.kind == "pickle-global" else f for f in found]
    try:
        report = file_globals(path)
        inflated, refused = inflated_globals(path)
    except (InputError, OSError, ValueError) as exc:
        return [Finding("unreadable-file", "warn", f"{label}: cannot be read for pickle globals ({exc})")]
    if inflated is not None:  # compressed: torch.load of the compressed bytes stops at once, and runs nothing
        report = merged(inflated, report) if report.globals else inflated
    unread = [] if refused is None else [Finding("unreadable-file", "fail", f"{label}: {refused}")]
    # A name that is not made of identifiers cannot be imported: pickle.load fails there and runs nothing (random
    # bytes read as a pickle often hold such a GLOBAL opcode).
    refs = [ref for ref in report.globals if importable(ref)]
    findings = [Finding("pickle-global", judge(ref)[0], f"{shown(ref)} (in {label})") for ref in refs]
    findings += [replace(f, detail=f"{label}: {f.detail}") for f in report.differential]
    if report.limited:
        detail = f"{label}: torch.load would run a pickle that dtypecheck stopped reading ({report.problem})"
        findings.append(Finding("unreadable-file", "fail", detail))
    elif report.problem is not None and refs:
        findings.append(Finding("unreadable-file", "warn", f"{label}: pickle breaks off ({report.problem})"))
    return worst_first(findings + unread)


def polyglot_findings(buffer: mmap.mmap, size: int, where: str, own: str) -> list[Finding]:
    """What ``torch.load`` of a file the scan read as ``own`` (``safetensors``, ``gguf``, ``torch-legacy``) would
    run, read as ``torch.load`` dispatches it whatever the file's name (only a path ending ``.safetensors`` goes
    to safetensors): a zip when it starts with the zip magic, else a legacy tar when ``tarfile`` opens it with a
    ``storages`` member, else a stream of pickles from the first byte.

    A file that torch reads as a zip or a tar is two formats at once: a ``pickle-polyglot`` ``fail`` whatever its
    pickles hold (the scan judged the other reading's tensors). A pickle read from the first byte fails when it
    references an importable global (random bytes seldom do; a benign file's never do). A legacy stream is the
    scan's own reading, so only the zip and tar readings are added for it."""
    from dtypecheck.loaders._io.legacy_tar import tar_globals

    report: PickleReport | None
    if bytes(read_range(buffer, 0, min(4, size))) == b"PK\x03\x04":
        reading = "a torch.save zip"
        report = _torch_zip_reading(buffer, size, where)
    elif (report := tar_globals(buffer, size, where)) is not None:
        reading = "a legacy torch.save tar"
    elif own == "torch-legacy":
        return []
    else:
        reading = "a pickle"
        report = _stream_globals(Window(buffer, 0, size), where, 1)
        if not any(importable(ref) for ref in report.globals):
            return []
    if report is None:
        return []
    refs = [ref for ref in report.globals if importable(ref)]
    names = ", ".join(shown(ref) for ref in refs[:5])
    detail = (
        f"this {own} file is also {reading}: torch.load (of any name but *.safetensors) would read it that way"
        + (f" and run a pickle referencing {names}" if names else "")
        + f"; the scan judged the {own} reading only"
    )
    return worst_first(
        [
            Finding("pickle-polyglot", "fail", detail),
            *(Finding("pickle-global", judge(ref)[0], f"{shown(ref)} (in {reading})") for ref in refs),
            *report.differential,
        ]
    )


def _torch_zip_reading(buffer: mmap.mmap, size: int, where: str) -> PickleReport | None:
    """The globals of a zip torch's reader opens (None when it refuses it: ``torch.load`` then fails)."""
    from dtypecheck.loaders._io.zip_records import torch_view

    if torch_view(buffer, 0, size) is None:
        return None
    return _zip_globals(buffer, size, where)


MAX_SHOWN_NAME = 200
"""Characters of a global's name a finding shows: a hostile pickle's GLOBAL may name 160 MB."""


def shown(ref: GlobalRef) -> str:
    """``ref``'s dotted name for a finding, cut to ``MAX_SHOWN_NAME`` characters (saying how long it was)."""
    name = ref.qualname
    if len(name) <= MAX_SHOWN_NAME:
        return name
    return f"{name[:MAX_SHOWN_NAME]}... ({len(name)} characters)"
