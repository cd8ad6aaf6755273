"""Where ``np.load(allow_pickle=True)`` runs a pickle: an ``.npy`` array of object dtype (alone, or as a member
of an ``.npz``) is a header followed by a pickle of the whole array, which ``pickle.load`` runs.

``np.load`` reads the magic ``\\x93NUMPY``, a format version (1.0, 2.0 or 3.0), a header length and a header (a
Python dict literal with ``descr``); when ``descr``'s dtype holds objects it unpickles what follows. An ``.npz``
is a zip whose members are such arrays: ``NpzFile[key]`` reads any member that starts with the magic as one,
whatever its name. Failing closed, a header whose dtype cannot be told is read as if it held objects: a pickle
read from numeric data finds no importable global and reports nothing.
"""

from __future__ import annotations

import ast
import struct

MAGIC = b"\x93NUMPY"
PREFIX_BYTES = 12
"""Magic, version and the longest header-length field: what ``pickle_start`` needs first."""
MAX_HEADER_BYTES = 64 << 20
"""Longest header read to decide whether an array holds objects (``np.load(allow_pickle=True)`` has no limit: a
longer one is read as if it held objects)."""


def header_span(prefix: bytes) -> tuple[int, int, str] | None:
    """(header offset, header length, encoding) from an ``.npy``'s first ``PREFIX_BYTES`` bytes, or None when
    ``np.load`` would refuse them before reading any pickle (no magic, an unknown version, cut short)."""
    if not prefix.startswith(MAGIC) or len(prefix) < 10:
        return None
    version = (prefix[6], prefix[7])
    if version == (1, 0):
        return 10, struct.unpack("<H", prefix[8:10])[0], "latin1"
    if version in ((2, 0), (3, 0)) and len(prefix) >= PREFIX_BYTES:
        return 12, struct.unpack("<I", prefix[8:12])[0], "latin1" if version == (2, 0) else "utf8"
    return None


def holds_objects(header: bytes | None, encoding: str) -> bool:
    """Whether ``np.load`` would unpickle what follows this header: its ``descr`` is a dtype with objects, or
    cannot be told (``None``: a header too long to read, one this reading cannot parse)."""
    if header is None:
        return True
    try:
        fields = ast.literal_eval(header.decode(encoding))
        import numpy as np

        dtype = np.lib.format.descr_to_dtype(fields["descr"])
    except Exception:  # noqa: BLE001  (any header numpy might still take is read as if it held objects)
        return True
    return bool(dtype.hasobject)
