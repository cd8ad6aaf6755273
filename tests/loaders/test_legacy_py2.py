"""Python-2-era legacy torch files (lpips' weights and their kin) and files that hold no tensors.

Modern torch cannot write a Python 2 file, so ``py2_legacy_file`` writes the five pickles byte by byte the way
torch 0.4 under Python 2 did: protocol 2, ``str`` keys as SHORT_BINSTRING, the OrderedDict state dict reduced to
``OrderedDict([[key, value], ...])`` (lists, not tuples) with its ``_metadata`` set by BUILD, 6-element storage
persistent ids, then each storage as an int64 element count and its raw bytes.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from dtypecheck.errors import InputError
from dtypecheck.loaders import open_checkpoint
from tests._ckpt_factory import load_all, opened, same

MAGIC = 0x1950A86A20F9469CFC6C


class Pickle2:
    """A protocol-2 pickle stream written opcode by opcode (memo puts left out: they are optional)."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")

    def string(self, text: str) -> Pickle2:  # Python 2 str: SHORT_BINSTRING
        data = text.encode()
        self.out += b"U" + bytes([len(data)]) + data
        return self

    def int(self, value: int) -> Pickle2:
        self.out += b"K" + bytes([value]) if 0 <= value < 256 else b"J" + struct.pack("<i", value)
        return self

    def global_(self, module: str, name: str) -> Pickle2:
        self.out += f"c{module}\n{name}\n".encode()
        return self

    def op(self, codes: bytes) -> Pickle2:
        self.out += codes
        return self

    def stop(self) -> bytes:
        return bytes(self.out + b".")


MARK, TUPLE, TUPLE2, TUPLE1, REDUCE, EMPTY_LIST, APPENDS, BINPERSID = (
    b"(",
    b"t",
    b"\x86",
    b"\x85",
    b"R",
    b"]",
    b"e",
    b"Q",
)
EMPTY_DICT, SETITEMS, BUILD, NONE, FALSE, TRUE, EMPTY_TUPLE = b"}", b"u", b"b", b"N", b"\x89", b"\x88", b")"


def _tensor(p: Pickle2, key: str, shape: tuple[int, ...], numel: int) -> None:
    """``_rebuild_tensor_v2(storage, 0, shape, contiguous stride, False, OrderedDict())`` as torch 0.4 wrote it."""
    stride = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        stride[i] = stride[i + 1] * shape[i + 1]
    p.global_("torch._utils", "_rebuild_tensor_v2").op(MARK)
    p.op(MARK).string("storage").global_("torch", "FloatStorage").string(key).string("cpu").int(numel)
    p.op(NONE + TUPLE + BINPERSID).int(0)
    for dims in (shape, tuple(stride)):
        p.op(MARK)
        for d in dims:
            p.int(d)
        p.op(TUPLE)
    p.op(FALSE).global_("collections", "OrderedDict").op(EMPTY_TUPLE + REDUCE + TUPLE + REDUCE)


def py2_legacy_file(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """A legacy torch file of float32 ``tensors`` as Python 2's torch.save wrote it."""
    keys = [str(94_000_000_000_000 + 16 * i) for i in range(len(tensors))]
    magic = b"\x80\x02\x8a\x0a" + MAGIC.to_bytes(10, "little") + b"."
    protocol = Pickle2().op(b"M" + struct.pack("<H", 1001)).stop()
    info = Pickle2().op(EMPTY_DICT + MARK).string("protocol_version").op(b"M" + struct.pack("<H", 1001))
    info.string("little_endian").op(TRUE).string("type_sizes").op(EMPTY_DICT + MARK)
    info.string("short").int(2).string("int").int(4).string("long").int(8).op(SETITEMS + SETITEMS)
    main = Pickle2().global_("collections", "OrderedDict").op(EMPTY_LIST + MARK)
    for key, (name, tensor) in zip(keys, tensors.items(), strict=True):
        main.op(EMPTY_LIST + MARK).string(name)
        _tensor(main, key, tuple(tensor.shape), tensor.numel())
        main.op(APPENDS)
    main.op(APPENDS + TUPLE1 + REDUCE)
    # state_dict()'s _metadata attribute, which Python 2's OrderedDict.__reduce__ returned as the BUILD state
    main.op(EMPTY_DICT).string("_metadata").global_("collections", "OrderedDict").op(EMPTY_LIST + MARK)
    main.op(EMPTY_LIST + MARK).string("").op(EMPTY_DICT).string("version").int(1).op(b"s" + APPENDS)
    main.op(APPENDS + TUPLE1 + REDUCE + b"s" + BUILD)
    storage_keys = Pickle2().op(EMPTY_LIST + MARK)
    for key in keys:
        storage_keys.string(key)
    blobs = b"".join(
        struct.pack("<q", t.numel()) + struct.pack(f"<{t.numel()}f", *t.reshape(-1).tolist()) for t in tensors.values()
    )
    path.write_bytes(magic + protocol + info.stop() + main.stop() + storage_keys.op(APPENDS).stop() + blobs)
    return path


LPIPS_LIKE = {
    "lin0.model.1.weight": torch.tensor([0.5, -0.25, 3.0e-8, 65536.0]).reshape(1, 4, 1, 1),
    "lin1.model.1.weight": torch.tensor([[1.0, 2.0, 3.0], [-4.0, -5.0, -6.0]]),
}


def test_python2_legacy_state_dict_is_read(tmp_path: Path) -> None:
    path = py2_legacy_file(tmp_path / "alex.pth", LPIPS_LIKE)
    # torch itself reads the hand-written file as the state dict it stands for (the builder is right) ...
    reference = torch.load(path, weights_only=True)
    assert list(reference) == list(LPIPS_LIKE)
    assert all(same(reference[name], expected) for name, expected in LPIPS_LIKE.items())
    # ... and so does dtypecheck, which read 0 tensors ("ok", exit 0) when the pairs arrived as lists.
    tensors = load_all(path)
    assert list(tensors) == list(LPIPS_LIKE)
    for name, expected in LPIPS_LIKE.items():
        assert same(tensors[name], expected), name
    with opened(path) as checkpoint:
        assert checkpoint.format == "torch-legacy"
        assert [f for f in checkpoint.findings if f.level != "ok"] == []


def test_python2_file_fails_fp16_on_its_own_values(cli, tmp_path: Path) -> None:
    path = py2_legacy_file(tmp_path / "alex.pth", LPIPS_LIKE)
    doc = cli("scan-model", str(path), "--format", "json").json()
    assert doc["summary"]["tensors"] == 2
    first = next(t for t in doc["tensors"] if t["name"] == "lin0.model.1.weight")
    # 65536 > 65504 (fp16 max) overflows; 3e-8 lies above half fp16's smallest subnormal (2^-25 = 2.98e-8), so
    # it rounds to 2^-24 and is kept as a subnormal.
    assert first["casts"]["float16"]["overflow"] == 1
    assert first["casts"]["float16"]["underflow"] == 0
    assert first["casts"]["float16"]["subnormal"] == 1
    assert doc["summary"]["level"] == "fail"


def test_storages_without_a_tensor_are_an_input_error(tmp_path: Path) -> None:
    """Tensor data the pickle does not lead to (a layout not understood) must not pass as an empty file."""
    path = py2_legacy_file(tmp_path / "odd.pth", {"w": torch.ones(2)})
    data = path.read_bytes().replace(b"_rebuild_tensor_v2", b"_rebuild_tensor_zz")  # an unknown rebuild
    path.write_bytes(data)
    with pytest.raises(InputError) as caught:
        open_checkpoint(str(path)).close()
    assert str(caught.value).startswith(f"{path}: holds 1 tensor storage(s) but no tensor was found in its pickle")


def test_a_file_without_tensors_fails_plainly(cli, tmp_path: Path) -> None:
    path = tmp_path / "training_args.bin"
    torch.save({"learning_rate": 1e-4, "epochs": 3}, path)
    result = cli("scan-model", str(path), "--format", "json")
    assert result.exit_code == 1
    doc = result.json()
    assert doc["summary"]["tensors"] == 0
    assert doc["summary"]["level"] == "fail"
    assert doc["findings"][0]["kind"] == "no-tensors"
    assert doc["findings"][0]["level"] == "fail"
    assert doc["findings"][0]["detail"].startswith("holds no tensors")
    table = cli("scan-model", str(path))
    assert table.exit_code == 1
    assert "no-tensors" in table.stdout
