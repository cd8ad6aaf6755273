"""Bad input of every kind: one clear InputError (exit 3) naming the file, never a crash or a hang."""

from __future__ import annotations

import json
import os
import struct
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.errors import ExitCode, InputError, describe
from dtypecheck.loaders import open_checkpoint


def _input_error(target: Path | str, match: str) -> str:
    with pytest.raises(InputError) as caught:
        open_checkpoint(str(target)).close()
    message = str(caught.value)
    assert describe(caught.value) == (ExitCode.INPUT_ERROR, message)
    assert "\n" not in message
    assert str(target) in message
    assert match in message, message
    return message


def _safetensors(path: Path, header: object, data: bytes = b"", raw_length: int | None = None) -> Path:
    encoded = json.dumps(header).encode() if not isinstance(header, bytes) else header
    length = len(encoded) if raw_length is None else raw_length
    path.write_bytes(struct.pack("<Q", length) + encoded + data)
    return path


def test_missing_empty_random(tmp_path: Path) -> None:
    _input_error(tmp_path / "nope.pt", "no such file or directory")
    (tmp_path / "empty.pt").write_bytes(b"")
    _input_error(tmp_path / "empty.pt", "empty file")
    (tmp_path / "noise.bin").write_bytes(os.urandom(4096))
    _input_error(tmp_path / "noise.bin", "not a checkpoint: expected one of")
    (tmp_path / "folder").mkdir()
    _input_error(tmp_path / "folder", "no checkpoint found in this folder")
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "notes.txt").write_text("hello")
    _input_error(tmp_path / "text", "no checkpoint found in this folder")


@pytest.mark.parametrize(
    ("header", "data", "match"),
    [
        (b"{not json", b"", "malformed safetensors header"),
        (b'{"a": 1, "a": 2}', b"", "duplicate key"),
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"", "malformed safetensors header"),
        ({"w": [1, 2]}, b"", "malformed header entry"),
        ([1, 2], b"", "not a checkpoint: expected one of"),  # a header must be a JSON object for safetensors
        ({"w": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "unknown safetensors dtype"),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "malformed shape"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "outside the file"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "needs 8 bytes"),
        ({"w": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 4]}}, b"\0" * 4, "needs"),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 12,
            "overlap",
        ),
    ],
)
def test_malformed_safetensors(tmp_path: Path, header: object, data: bytes, match: str) -> None:
    _input_error(_safetensors(tmp_path / "bad.safetensors", header, data), match)


def test_safetensors_header_length_beyond_file(tmp_path: Path) -> None:
    path = _safetensors(tmp_path / "big.safetensors", {"a": 1}, raw_length=10**9)
    # a header length larger than the file is not mistaken for safetensors at all
    _input_error(path, "not a checkpoint: expected one of")


def test_truncated_safetensors(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    save_file({"w": torch.arange(100.0)}, path)
    whole = path.read_bytes()
    path.write_bytes(whole[:-10])
    _input_error(path, "outside the file")
    path.write_bytes(whole[:40])  # cut inside the JSON header
    (header_length,) = struct.unpack("<Q", whole[:8])
    _input_error(path, f"truncated safetensors file (header of {header_length} bytes, file of 40)")


def test_malformed_index(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text("{oops")
    _input_error(tmp_path, "malformed index JSON")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": [1]}))
    _input_error(tmp_path, "no weight_map")


def test_dcp_with_missing_data_file(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import state_dict_saver

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state_dict_saver.save({"w": torch.ones(3)}, checkpoint_id=tmp_path)
    for data_file in tmp_path.glob("*.distcp"):
        data_file.unlink()
    _input_error(tmp_path, "is missing")


def test_dcp_with_garbage_metadata(tmp_path: Path) -> None:
    (tmp_path / ".metadata").write_bytes(b"\x80\x02}q\x00.")
    _input_error(tmp_path, "not a torch.distributed.checkpoint metadata file")
    (tmp_path / ".metadata").write_bytes(os.urandom(64))
    _input_error(tmp_path, "")


def test_garbage_gguf(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**40, 0) + os.urandom(32))
    _input_error(path, "malformed GGUF file")


def test_safetensors_dtype_that_is_not_a_string_is_an_input_error(tmp_path: Path) -> None:
    # A list is unhashable: looking it up in the code table used to raise TypeError (a traceback).
    path = _safetensors(
        tmp_path / "m.safetensors", {"w": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4
    )
    _input_error(path, "unknown safetensors dtype")


def _open_descriptors() -> int:
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to count open descriptors")
@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("bad.gguf", b"GGUF" + struct.pack("<IQQ", 9, 0, 0), "GGUF version 9"),
        ("bad-legacy.pt", b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little") + b"\xff", "malformed"),
        ("bad-zip.pt", b"PK\x03\x04" + b"\x00" * 60, "corrupt zip archive"),
    ],
)
def test_a_file_that_fails_to_parse_leaks_no_map(tmp_path: Path, name: str, content: bytes, match: str) -> None:
    """``FileMap.kept_if_parsed`` closes the map and its descriptor when the loader's parse raises."""
    path = tmp_path / name
    path.write_bytes(content)
    before = _open_descriptors()
    for _ in range(5):
        with pytest.raises(InputError, match=match):
            open_checkpoint(str(path))
    assert _open_descriptors() == before


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to count open descriptors")
def test_a_torchscript_archive_that_fails_to_parse_leaks_no_map(tmp_path: Path) -> None:
    module = torch.jit.script(torch.nn.Linear(2, 2))
    good = tmp_path / "good.pt"
    torch.jit.save(module, str(good))
    data = bytearray(good.read_bytes())
    start = data.index(b"constants.pkl")  # the local header's name: its data follows; spoil the pickle
    offset = data.index(b"\x80", start)
    data[offset : offset + 2] = b"\xff\xff"
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    before = _open_descriptors()
    for _ in range(5):
        with pytest.raises(InputError, match="malformed pickle"):
            open_checkpoint(str(bad))
    assert _open_descriptors() == before
