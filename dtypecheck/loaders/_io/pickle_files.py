"""Which globals would ``torch.load(weights_only=False)`` reach in a file, whatever else the file is?

A scan judges the globals of the pickles it reads for tensors; this module covers the pickles it would otherwise
never read: files beside a sharded index (``training_args.bin``, ``optimizer.pt``), a ``pytorch_model.bin`` next to
the ``model.safetensors`` that is scanned instead, raw pickles (``torch.load`` of a non-zip file runs its first
pickle before it checks the magic number), and safetensors files whose first bytes also parse as a pickle (a
polyglot: ``torch.load`` of it runs that pickle). Globals are collected while the pickle is interpreted, so a
stream that breaks after its payload still reports it.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtypecheck.errors import InputError
from dtypecheck.loaders._io.mapped import FileMap, Window, read_range
from dtypecheck.loaders._io.pickle_globals import judge, worst_first
from dtypecheck.loaders._io.pickle_vm import GlobalRef, SafeUnpickler
from dtypecheck.loaders.base import Finding

MAX_STREAM_PICKLES = 5
"""A legacy torch file holds five pickles back to back; ``torch.load`` of a raw pickle runs the first."""
MAX_ZIP_PICKLE_BYTES = 1 << 30


@dataclass(frozen=True)
class PickleReport:
    """What the pickles of one file reference."""

    globals: tuple[GlobalRef, ...]
    problem: str | None
    """Why reading stopped early (a malformed pickle), or None."""


def _lenient_pid(pid: Any) -> Any:
    return pid


def _stream_globals(stream: Window, where: str, count: int) -> PickleReport:
    seen: dict[GlobalRef, None] = {}
    problem = None
    for _ in range(count):
        if stream.tell() >= stream.length:
            break
        machine = SafeUnpickler(stream, where=where, persistent_load=_lenient_pid)
        try:
            machine.load()
        except InputError as exc:
            problem = str(exc)
        seen.update(dict.fromkeys(machine.globals_seen))
        if problem is not None:
            break
    return PickleReport(tuple(seen), problem)


def file_globals(path: Path) -> PickleReport:
    """Globals of every pickle ``torch.load`` would run in ``path``: each ``data.pkl`` of a zip (every copy of a
    duplicated one), or up to five pickles from the start of any other file."""
    mapped = FileMap(path)
    try:
        return _globals_in(mapped.buffer, mapped.size, str(path))
    finally:
        mapped.close()


def _globals_in(buffer: mmap.mmap, size: int, where: str) -> PickleReport:
    if bytes(read_range(buffer, 0, min(4, size))) == b"PK\x03\x04":
        from dtypecheck.loaders.formats.torch_zip import read_zip_entries

        seen: dict[GlobalRef, None] = {}
        problem = None
        try:
            entries = read_zip_entries(buffer, 0, size, where)
        except InputError as exc:
            return PickleReport((), str(exc))
        for name, copies in entries.items():
            if not name.endswith("data.pkl"):
                continue
            for entry in copies:
                if entry.offset < 0 or entry.size > MAX_ZIP_PICKLE_BYTES:
                    problem = f"{where}: {name} cannot be read (compressed or oversized)"
                    continue
                report = _stream_globals(Window(buffer, entry.offset, entry.size), where, 1)
                seen.update(dict.fromkeys(report.globals))
                problem = problem or report.problem
        return PickleReport(tuple(seen), problem)
    return _stream_globals(Window(buffer, 0, size), where, MAX_STREAM_PICKLES)


def looks_like_pickle(head: bytes) -> bool:
    """A pickle of protocol 2 or later (what ``torch.save``, ``pickle.dump`` and ``joblib`` write)."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def importable(ref: GlobalRef) -> bool:
    """Whether the real unpickler could import ``ref`` at all (a name made of Python identifiers)."""
    return all(part.isidentifier() for part in (*ref.module.split("."), *ref.name.split(".")))


def side_file_findings(path: Path, label: str) -> list[Finding]:
    """``pickle-global`` findings for a file that is not scanned for tensors (detail ``module.name (in LABEL)``);
    an ``unreadable-file`` warning when its pickle breaks off (after reporting what it referenced until then)."""
    try:
        report = file_globals(path)
    except (InputError, OSError, ValueError) as exc:
        return [Finding("unreadable-file", "warn", f"{label}: cannot be read for pickle globals ({exc})")]
    findings = [Finding("pickle-global", judge(ref)[0], f"{ref.qualname} (in {label})") for ref in report.globals]
    if report.problem is not None and report.globals:
        findings.append(Finding("unreadable-file", "warn", f"{label}: pickle breaks off ({report.problem})"))
    return worst_first(findings)


def polyglot_findings(buffer: mmap.mmap, size: int, where: str) -> list[Finding]:
    """A ``fail`` finding when the start of a (safetensors) file also runs as a pickle referencing importable
    globals: ``torch.load`` of the file would run it."""
    report = _stream_globals(Window(buffer, 0, size), where, 1)
    refs = [ref for ref in report.globals if importable(ref)]
    if not refs:
        return []
    names = ", ".join(ref.qualname for ref in refs[:5])
    detail = f"the file's first bytes also parse as a pickle that torch.load would run, referencing {names}"
    return worst_first(
        [
            Finding("pickle-polyglot", "fail", detail),
            *(Finding("pickle-global", judge(ref)[0], ref.qualname) for ref in refs),
        ]
    )
