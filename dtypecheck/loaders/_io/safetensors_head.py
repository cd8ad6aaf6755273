"""What the first bytes of a file say about safetensors: shared by the safetensors reader, format detection and the
polyglot check of other formats' readers (which must not import the reader itself: it judges polyglots with them)."""

from __future__ import annotations

import struct

MAX_HEADER_BYTES = 100_000_000  # the reference reader's limit (``safetensors`` MAX_HEADER_SIZE)


def looks_like_safetensors(head: bytes, file_size: int) -> bool:
    if len(head) < 9:
        return False
    (length,) = struct.unpack("<Q", head[:8])
    return 0 < length <= min(MAX_HEADER_BYTES, file_size - 8) and head[8:9] == b"{"


def truncated_safetensors_header(head: bytes, file_size: int) -> int | None:
    """The declared header length when ``head`` starts like safetensors but the file ends inside the header."""
    if len(head) < 9 or head[8:9] != b"{":
        return None
    (length,) = struct.unpack("<Q", head[:8])
    return length if file_size - 8 < length <= MAX_HEADER_BYTES else None
