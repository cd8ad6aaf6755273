"""The oldest ``torch.save`` format, a tar of ``storages``, ``tensors`` and ``pickle`` members, as ``torch.load``
reads it: every pickle it would run is found, to be judged (dtypecheck reads no tensor from it).

``torch.load`` of a file that is not a zip first tries ``tarfile.open``; if that works it extracts those members and
unpickles, in order: the storage count, then per storage its ``(key, location, storage_type)`` followed by the raw
storage (an int64 element count, then the elements), then the storage views; the tensor count, then per tensor its
``(key, storage_id, type)`` followed by its sizes and strides; then the ``pickle`` member's object.
"""

from __future__ import annotations

import mmap
import struct
import tarfile
from typing import Any

from dtypecheck.errors import InputError
from dtypecheck.loaders._io.mapped import Window
from dtypecheck.loaders._io.pickle_report import PickleReport, lenient_persistent_id
from dtypecheck.loaders._io.pickle_vm import GlobalRef, PickleLimitError, SafeUnpickler

MAX_TAR_MEMBERS = 10_000
"""torch writes three members; a tar listing more is read this far (and reported)."""
MAX_RECORDS = 1_000_000
"""Most storages or tensors one member may list."""
_ELEMENT_SIZES = {
    "Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexDouble": 16, "ComplexFloat": 8, "QInt8": 1, "QUInt8": 1, "QInt32": 4, "QUInt4x2": 1,
}  # fmt: skip


class _LayoutEndError(Exception):
    """The member's layout ends here (as ``torch.load`` would stop, after the pickles already judged)."""


def tar_globals(buffer: mmap.mmap, size: int, where: str) -> PickleReport | None:
    """The globals of every pickle ``torch.load`` would run in a legacy tar file, or None when ``tarfile`` (as
    torch opens it) does not read the file as a tar with a ``storages`` member (torch then goes on as for a raw
    pickle)."""
    members = _members(buffer, size)
    if members is None or "storages" not in members:
        return None
    seen: dict[GlobalRef, None] = {}
    problem: str | None = None
    limited = len(members) > MAX_TAR_MEMBERS
    for name, walk in (("storages", _walk_storages), ("tensors", _walk_tensors), ("pickle", _walk_object)):
        member = members.get(name)
        if member is None:
            break  # torch.load fails to extract it: nothing after runs
        if not member.isreg():
            problem, limited = f"{where}: tar member {name!r} is not a regular file (torch would follow it)", True
            break
        if member.offset_data + member.size > size:
            problem = f"{where}: tar member {name!r} runs past the end of the file"
            break
        stream = Window(buffer, member.offset_data, member.size)
        machines: list[SafeUnpickler] = []

        def load(stream: Window = stream, machines: list[SafeUnpickler] = machines, label: str = name) -> Any:
            machines.append(SafeUnpickler(stream, where=f"{where} ({label})", persistent_load=lenient_persistent_id))
            return machines[-1].load()

        try:
            walk(stream, load)
        except PickleLimitError as exc:
            problem, limited = str(exc), True
        except (InputError, _LayoutEndError, struct.error) as exc:
            problem = str(exc) or f"{where}: tar member {name!r} ends early"
        for machine in machines:
            seen.update(dict.fromkeys(machine.globals_seen))
        if problem is not None:
            break
    return PickleReport(tuple(seen), problem, limited=limited)


def _members(buffer: mmap.mmap, size: int) -> dict[str, tarfile.TarInfo] | None:
    """Members by name (the last of a name wins, as ``getmember`` finds it), or None when not a tar."""
    try:
        with tarfile.open(fileobj=Window(buffer, 0, size), mode="r:", format=tarfile.PAX_FORMAT) as tar:
            members: dict[str, tarfile.TarInfo] = {}
            count = 0
            while (member := tar.next()) is not None:
                members[member.name] = member
                count += 1
                if count > MAX_TAR_MEMBERS:
                    break
            return members
    except (tarfile.TarError, OSError, ValueError, EOFError, UnicodeError, OverflowError):
        return None


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_RECORDS:
        raise _LayoutEndError(f"the {what} count is not a small integer")
    return value


def _walk_storages(stream: Window, load: Any) -> None:
    for _ in range(_count(load(), "storage")):
        args = load()
        storage_type = args[2] if isinstance(args, tuple) and len(args) == 3 else None
        element = _ELEMENT_SIZES.get(
            storage_type.name.removesuffix("Storage") if isinstance(storage_type, GlobalRef) else ""
        )
        if element is None:
            raise _LayoutEndError("a storage of no known type")
        (elements,) = struct.unpack("<q", stream.read(8))
        if elements < 0 or elements * element > stream.length - stream.tell():
            raise _LayoutEndError("a storage runs past its member")
        stream.seek(elements * element, 1)
    load()  # the storage views


def _walk_tensors(stream: Window, load: Any) -> None:
    for _ in range(_count(load(), "tensor")):
        load()
        (ndim,) = struct.unpack("<i", stream.read(4))
        if not 0 <= ndim <= 64:
            raise _LayoutEndError("a tensor with an impossible number of dimensions")
        stream.seek(4 + 16 * ndim + 8, 1)


def _walk_object(stream: Window, load: Any) -> None:
    load()
