"""Reading small files (an index, metadata, a config) safely: refused before any read when they are not regular.

``Path.read_bytes`` of a FIFO blocks forever, and of ``/dev/zero`` (or a symlink to it) never ends while its
``stat`` size says 0. Here the file is opened without blocking, checked with ``fstat`` on the open descriptor (so a
file swapped after the check is still the one judged) and read only up to its cap.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dtypecheck.errors import InputError

_NO_BLOCK = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a directory" if stat.S_ISDIR(mode) else "not a regular file"


def require_regular(path: Path) -> os.stat_result:
    """``path``'s status (through symlinks), or an ``InputError`` when it is a FIFO, socket or device, checked
    without opening it."""
    try:
        status = path.stat()
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(status.st_mode):
        raise InputError(f"{path}: {_kind(status.st_mode)}, not a regular file: refused before reading")
    return status


def open_regular(path: Path) -> int:
    """A read-only descriptor of ``path``, opened without blocking (a FIFO would block the open itself) and
    closed again with an ``InputError`` unless it is a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | _NO_BLOCK)
    except OSError as exc:  # a socket cannot be opened at all (ENXIO)
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(f"{path}: {_kind(mode)}, not a regular file: refused before reading")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_file(path: Path, limit: int, what: str = "") -> bytes:
    """All of regular file ``path``, at most ``limit`` bytes (its size is checked before any read, and the read
    stops past the cap should it grow), or an ``InputError`` naming it (as ``what`` when given)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        label = f"{path}: {what + ' ' if what else ''}"
        if size > limit:
            raise InputError(f"{label}larger than {limit} bytes")
        chunks = []
        total = 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise InputError(f"{label}larger than {limit} bytes (it grew while read)")
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
