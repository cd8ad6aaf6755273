"""Inputs that must take bounded time: one-line pickles, zero-filled safetensors, sparse files (issue 27, class 5).

A pickle's text arguments (``STRING``, ``GLOBAL``, ``PERSID``) run to a newline; a reader that copies the line so
far for every block it reads takes hours on a 160 MB line, and a safetensors file whose header length's low byte
is ``P`` (0x50) or ``p`` (0x70) reads, as a pickle, as one such line as long as the file. A sparse file declares
hundreds of GiB that are holes on disk.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from tests.security.corpus import Hostile, code_payload, glob, text

KLASS = "bounded-time"
LINE_BYTES = 160 << 20
"""The issue's line length; tests build smaller inputs (``build(folder, line_bytes=...)``)."""
SPARSE_BYTES = 512 << 30


def long_string_payload(path: Path, marker: Path, line_bytes: int) -> Path:
    """``exec("<code> #aaaa...")``: the payload's argument is one protocol-0 ``STRING`` line of ``line_bytes``."""
    code = code_payload(marker) + " #"
    line = b"S'" + code.encode() + b"a" * (line_bytes - len(code)) + b"'\n"
    path.write_bytes(b"cbuiltins\nexec\n(" + line + b"tR.")
    return path


def long_global_after_payload(path: Path, marker: Path, line_bytes: int) -> Path:
    """A payload, then a ``GLOBAL`` whose module name is one line of ``line_bytes``."""
    payload = glob("builtins", "exec") + b"(" + text(code_payload(marker)) + b"tR0"
    path.write_bytes(b"\x80\x02" + payload + b"c" + b"a" * line_bytes + b"\nb\n.")
    return path


def long_persid_after_payload(path: Path, marker: Path, line_bytes: int) -> Path:
    """A payload, then a ``PERSID`` whose argument is one line of ``line_bytes``."""
    payload = glob("builtins", "exec") + b"(" + text(code_payload(marker)) + b"tR0"
    path.write_bytes(b"\x80\x02" + payload + b"P" + b"7" * line_bytes + b"\n.")
    return path


def zero_filled_safetensors(path: Path, header_length: int, data_bytes: int) -> Path:
    """One float32 tensor of zeros whose JSON header (space-padded) is ``header_length`` bytes."""
    count = data_bytes // 4
    header = json.dumps({"w": {"dtype": "F32", "shape": [count], "data_offsets": [0, 4 * count]}}).encode()
    if len(header) > header_length:
        raise ValueError(f"header of {len(header)} bytes does not fit in {header_length}")
    with path.open("wb") as out:
        out.write(struct.pack("<Q", header_length) + header.ljust(header_length))
        out.truncate(8 + header_length + 4 * count)  # zeros (a hole where the file system makes one)
    with path.open("r+b") as out:  # written out in full: a benign file has no holes
        out.seek(8 + header_length)
        block = b"\0" * (1 << 20)
        left = 4 * count
        while left:
            left -= out.write(block[: min(left, len(block))])
    return path


def sparse_safetensors(path: Path, data_bytes: int) -> Path:
    """A uint8 tensor of ``data_bytes`` that is one hole: seconds to make, zero blocks on disk."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [data_bytes], "data_offsets": [0, data_bytes]}}).encode()
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        out.truncate(8 + len(header) + data_bytes)
    return path


def consolidated_beside_shards(folder: Path, data_bytes: int) -> Path:
    """A Mistral-style repository: HF shards with their index, and ``consolidated.safetensors`` (the same weights
    in one file, not named by the index) whose header length is 0x50: read as a pickle side file, one line."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir()
    save_file({"w": torch.ones(2)}, folder / "model-00001-of-00001.safetensors")
    index = {"metadata": {"total_size": 8}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    zero_filled_safetensors(folder / "consolidated.safetensors", 0x50, data_bytes)
    return folder


def build(folder: Path, line_bytes: int = LINE_BYTES) -> list[Hostile]:
    out: list[Hostile] = []
    for name, writer in (
        ("long-line-string-payload", long_string_payload),
        ("long-line-global", long_global_after_payload),
        ("long-line-persid", long_persid_after_payload),
    ):
        marker = folder / f"canary-{name}"
        path = writer(folder / f"{name}.pkl", marker, line_bytes)
        out.append(Hostile(name, KLASS, ("scan-model", str(path)), frozenset({1}), marker, path))
    for length in (0x50, 0x58, 0x70):
        name = f"zero-filled-header-{length:#x}"
        path = zero_filled_safetensors(folder / f"{name}.safetensors", length, line_bytes)
        out.append(Hostile(name, KLASS, ("scan-model", str(path)), frozenset({0}), benign=True, loader="none"))
    repo = consolidated_beside_shards(folder / "consolidated-side-file", line_bytes)
    out.append(
        Hostile("consolidated-side-file", KLASS, ("scan-model", str(repo)), frozenset({0}), benign=True, loader="none")
    )
    sparse = sparse_safetensors(folder / "sparse-512GiB.safetensors", SPARSE_BYTES)
    out.append(Hostile("sparse-512GiB", KLASS, ("scan-model", str(sparse)), frozenset({3}), loader="none"))
    return out
