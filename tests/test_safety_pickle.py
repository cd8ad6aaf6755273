"""Hostile pickles: nothing in them is ever executed, every global is reported, and abuse ends in InputError."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import pytest
import torch

from dtypecheck.errors import ExitCode, InputError, describe
from dtypecheck.loaders import open_checkpoint
from dtypecheck.loaders._io.pickle_globals import classify
from dtypecheck.loaders._io.pickle_vm import GlobalRef, PickleObject, unpickle
from tests._ckpt_factory import load_all, opened, same, write_torch_zip


class RunsShell:
    """Pickles as ``os.system(command)``: what a malicious checkpoint does under pickle.load."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (self.command,)


class CallsEval:
    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return eval, (self.code,)


def _globals(target: Path) -> dict[str, str]:
    with opened(target) as checkpoint:
        return {f.detail: f.level for f in checkpoint.findings if f.kind == "pickle-global"}


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_os_system_in_checkpoint_is_reported_not_run(tmp_path: Path, zip_format: bool) -> None:
    marker = tmp_path / "pwned"
    weight = torch.tensor([1.0, -2.0])
    path = tmp_path / "evil.pt"
    payload = {"weight": weight, "hook": RunsShell(f"touch {marker}"), "more": CallsEval(f"open({str(marker)!r}, 'w')")}
    torch.save(payload, path, _use_new_zipfile_serialization=zip_format)
    loaded = load_all(path)
    assert not marker.exists()
    assert same(loaded["weight"], weight)
    levels = _globals(path)
    assert levels[f"{os.system.__module__}.system"] == "fail"  # posix.system on Linux
    assert levels["builtins.eval"] == "fail"
    with opened(path) as checkpoint:
        assert checkpoint.findings[0].level == "fail"  # worst first


@pytest.mark.parametrize(
    ("stream", "dangerous"),
    [
        (b"cos\nsystem\n(S'touch MARK'\ntR.", "os.system"),
        (b'cbuiltins\nexec\n(S\'open("MARK", "w")\'\ntR.', "builtins.exec"),
        (b"(S'touch MARK'\nios\nsystem\n.", "os.system"),  # INST
        (b"\x80\x04\x8c\x08builtins\x8c\x07getattr\x93\x8c\x02os\x8c\x06system\x86R.", "builtins.getattr"),
        (
            b"\x80\x02csubprocess\ncheck_call\n]X\x05\x00\x00\x00touchaX\x04\x00\x00\x00MARKa\x85R.",
            "subprocess.check_call",
        ),
        (b"\x80\x02crunpy\nrun_path\nX\x04\x00\x00\x00MARK\x85R.", "runpy.run_path"),
        (b"\x80\x02cbuiltins\n__import__\nX\x02\x00\x00\x00os\x85R.", "builtins.__import__"),
        (b"\x80\x02ctorch\nload\nX\x04\x00\x00\x00MARK\x85R.", "torch.load"),
        (b"\x80\x02\x82\x01)R.", "copyreg.extension.1"),  # EXT1: the extension registry can name any callable
    ],
)
def test_hand_written_opcode_streams_are_inert(tmp_path: Path, stream: bytes, dangerous: str) -> None:
    marker = tmp_path / "created"
    data = stream.replace(b"MARK", str(marker).encode())
    data = _fix_lengths(data, str(marker))
    path = write_torch_zip(tmp_path / "hand.pt", data)
    levels = _globals(path)
    assert levels[dangerous] == "fail"
    assert not marker.exists()


def _fix_lengths(data: bytes, marker: str) -> bytes:
    """The templates above spell 4-byte lengths for 'MARK'; correct them for the real marker path."""
    wrong = struct.pack("<I", 4) + marker.encode()
    return data.replace(wrong, struct.pack("<I", len(marker)) + marker.encode())


def test_unknown_class_is_inert_and_keeps_nested_tensors(tmp_path: Path) -> None:
    # NEWOBJ + BUILD of an unknown class holding a tensor in its state: found, class not imported.
    inner = torch.tensor([3.0, 4.0])
    path = tmp_path / "custom.pt"
    torch.save({"obj": _Holder(inner)}, path)
    loaded = load_all(path)
    assert same(loaded["obj.payload"], inner)
    assert _globals(path)[f"{__name__}._Holder"] == "fail"  # read inertly, but judged fail closed (issue 27)


class _Holder:
    def __init__(self, payload: torch.Tensor) -> None:
        self.payload = payload


def test_classification_table() -> None:
    assert classify(GlobalRef("collections", "OrderedDict")) == "ok"
    assert classify(GlobalRef("torch._utils", "_rebuild_parameter")) == "ok"
    assert classify(GlobalRef("torch", "BFloat16Storage")) == "ok"
    assert classify(GlobalRef("torch", "float8_e4m3fn")) == "ok"
    assert classify(GlobalRef("builtins", "set")) == "ok"
    assert classify(GlobalRef("numpy.core.multiarray", "scalar")) == "ok"
    assert classify(GlobalRef("omegaconf.dictconfig", "DictConfig")) == "fail"  # unvetted, and has a __setstate__
    for module, name in [
        ("posix", "system"),
        ("nt", "system"),
        ("subprocess", "Popen"),
        ("builtins", "open"),
        ("builtins", "compile"),
        ("importlib", "import_module"),
        ("pickle", "loads"),
        ("shutil", "rmtree"),
        ("socket", "socket"),
        ("webbrowser", "open"),
        ("sys", "modules"),
        ("torch.serialization", "load"),
        ("os.path", "join"),
    ]:
        assert classify(GlobalRef(module, name, frozenset({"call"}))) == "fail", (module, name)
        if module.split(".")[0] != "torch":  # torch's names are ok only as plain references
            assert classify(GlobalRef(module, name)) == "fail", (module, name)


def _bad(data: bytes) -> InputError:
    with pytest.raises(InputError) as caught:
        unpickle(data, where="f.pt")
    assert describe(caught.value) == (ExitCode.INPUT_ERROR, str(caught.value))
    assert str(caught.value).startswith("f.pt: malformed pickle")
    return caught.value


def test_resource_abuse_is_an_input_error() -> None:
    _bad(b"(" * 200_001 + b".")  # MARK nesting
    _bad(b"\x80\x02h\x07.")  # memo key never stored
    _bad(b"\x80\x02]q\x00(K\x01K\x02")  # truncated: no STOP
    _bad(b"\x80\x04\x8d" + struct.pack("<Q", 1 << 60) + b"abc.")  # BINUNICODE8 claiming 2**60 bytes
    _bad(b"\x80\x02t.")  # TUPLE without MARK
    _bad(b"\x80\x02K\x01K\x02.")  # STOP with two items on the stack
    _bad(b"\x80\x05\x97.")  # NEXT_BUFFER: out-of-band data


def test_deep_nesting_without_marks_is_refused(tmp_path: Path) -> None:
    # 5000 nested 1-tuples cost 1 byte each: the walk that names tensors stops it instead of recursing.
    data = b"\x80\x02N" + b"\x85" * 5000 + b"."
    path = write_torch_zip(tmp_path / "deep.pt", data)
    with pytest.raises(InputError, match="nests deeper than"):
        open_checkpoint(str(path))


def test_shared_references_do_not_blow_up() -> None:
    # "billion laughs": 40 levels of lists each holding the previous one twice (2**40 paths, 120 bytes).
    body = b"\x80\x02]q\x000"
    for level in range(1, 41):
        body += b"(h" + bytes([level - 1]) + b"h" + bytes([level - 1]) + b"lq" + bytes([level]) + b"0"
    value, globals_seen = unpickle(body + b"h\x28.", where="laughs")
    assert isinstance(value, list)
    assert globals_seen == []
    from dtypecheck.loaders._io.torch_objects import collect_tensors

    tensors, findings = collect_tensors(value, "laughs")
    assert tensors == []
    assert findings == []


def test_cycles_and_deep_tuple_keys_are_safe() -> None:
    cyclic = b"\x80\x02]q\x00h\x00a."  # a list appended to itself
    value, _ = unpickle(cyclic, where="c")
    assert value[0] is value
    deep_key = b"\x80\x02}N" + b"\x85" * 100_000 + b"K\x01s."  # {((((None,),),)...): 1}
    value, _ = unpickle(deep_key, where="k")
    assert list(value.values()) == [1]


def test_reduce_result_is_an_inert_object() -> None:
    data = pickle.dumps(RunsShell("echo hi"), protocol=2)
    value, globals_seen = unpickle(data, where="x")
    assert isinstance(value, PickleObject)
    assert value.args == ("echo hi",)
    assert [str(g) for g in globals_seen] == [f"{os.system.__module__}.system"]


def test_storage_reference_problems(tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    torch.save({"x": torch.arange(4.0)}, good)
    import zipfile

    with zipfile.ZipFile(good) as archive:
        pickled = archive.read("good/data.pkl")
    missing = write_torch_zip(tmp_path / "missing.pt", pickled, {})
    with pytest.raises(InputError, match=r"missing\.pt: storage archive/data/0 is missing from the archive"):
        open_checkpoint(str(missing))
    short = write_torch_zip(tmp_path / "short.pt", pickled, {"0": b"\x00" * 8})  # 2 floats, 4 claimed
    with pytest.raises(InputError, match=r"short\.pt: tensor 'x' of shape \(4,\) reaches element 3"):
        open_checkpoint(str(short))


def test_shape_bomb_with_zero_strides_is_refused(tmp_path: Path) -> None:
    # one float of storage viewed as 2**40 elements through stride 0
    stream = (
        b"\x80\x02}X\x01\x00\x00\x00xctorch._utils\n_rebuild_tensor_v2\n("
        b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x01tQ"
        b"K\x00\x8a\x06\x00\x00\x00\x00\x00\x01\x85K\x00\x85\x89}tRs."
    )
    path = write_torch_zip(tmp_path / "bomb.pt", stream, {"0": b"\x00\x00\x80\x3f"})
    with pytest.raises(InputError, match="claims"):
        open_checkpoint(str(path))


def test_gguf_with_a_huge_array_count_fails_fast(tmp_path: Path) -> None:
    # gguf.GGUFReader would loop over 2**40 array items here; the header parser checks counts against the size.
    key = b"general.tags"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    path = tmp_path / "hostile.gguf"
    path.write_bytes(header + struct.pack("<IIQ", 9, 8, 2**40) + b"\x00" * 64)
    with pytest.raises(InputError, match=r"hostile\.gguf: malformed GGUF file \(array of 1099511627776 items\)"):
        open_checkpoint(str(path))


@pytest.mark.parametrize("protocol", range(6))
def test_plain_data_matches_the_real_unpickler_in_every_protocol(protocol: int) -> None:
    shared = [1, 2]
    data = {
        "text": "héllo\n",
        "bytes": b"\x00\xff",
        "ints": [0, -1, 255, 65535, -(2**31), 2**63, -(2**100)],
        "floats": (0.5, -1e300, float("inf")),
        "flags": [True, False, None],
        "nested": {"a": shared, "b": shared, ("t", 1): {}},
        "empty": ((), [], {}),
    }
    from dtypecheck.loaders._io.torch_objects import torch_call

    value, globals_seen = unpickle(pickle.dumps(data, protocol=protocol), where="p", call=torch_call)
    assert value == pickle.loads(pickle.dumps(data, protocol=protocol))  # our own trusted data
    assert value["nested"]["a"] is value["nested"]["b"]  # the memo keeps shared references shared
    # protocols 0-2 spell bytes as _codecs.encode(text, "latin1"), which the VM evaluates itself
    assert {str(g) for g in globals_seen} <= {"_codecs.encode"}


def test_zip_listing_too_many_entries_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real limit is 2 million entries; lowered here so the test file stays tiny.
    monkeypatch.setattr("dtypecheck.loaders._io.zip_records.MAX_ZIP_ENTRIES", 3)
    path = write_torch_zip(tmp_path / "many.pt", b"\x80\x02}.", {"0": b"", "1": b""})  # 5 entries
    with pytest.raises(InputError, match=r"many\.pt: zip archive lists 5 entries, over the 3 limit"):
        open_checkpoint(str(path))
