"""The hostile corpus, built from code (no binary blobs): every input that once crashed, hung, printed a traceback
or passed the gate while running code under ``torch.load(weights_only=False)``.

``build(folder)`` writes every input under ``folder`` and returns one ``Hostile`` per input: the command line to
run, the exit codes the contract allows for it, and, for inputs that carry a code-execution payload, the canary
file that payload creates when it runs (``torch_load`` says how to prove the payload live with real torch).
The tests (``tests/security/test_*.py``) and ``benchmarks/hostile_corpus.py`` share it.
"""

from __future__ import annotations

import json
import random
import struct
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

CLASSES = (
    "globals",
    "unread-pickles",
    "crashes",
    "tracebacks",
    "hangs",
    "other",
    "fuzz",
    "differentials",
    "loadable-files",
    "gadgets",
    "special-files",
    "robustness",
)
GATE_CLASSES = (
    "code-globals",
    "readings",
    "shipped-config",
    "roles",
    "bounded-time",
    "own-tracebacks",
    "benign-frameworks",
    "folder-loaders",
    "stored-callables",
    "library-loaders",
    "compressed-pickles",
    "sized-calls",
)
"""Issue 27's classes (the gate fails closed): built by ``tests/security/gate/`` (one module per area)."""


@dataclass(frozen=True)
class Hostile:
    """One hostile input and what the contract says must happen to it."""

    name: str
    klass: str
    """One of ``CLASSES``: the issue's class of problem."""
    args: tuple[str, ...]
    """The command line after ``dtypecheck``."""
    expect: frozenset[int]
    """Exit codes that follow the contract for this input."""
    canary: Path | None = None
    """The file the input's payload creates if any of it is executed (it must never exist after a scan)."""
    torch_load: Path | None = None
    """A file whose ``torch.load(weights_only=False)`` runs the payload: the proof that the canary is live."""
    needs_subprocess: bool = False
    """Only meaningful in its own process (signals, ``os._exit``, threads, truncation during the scan)."""
    driver: str = ""
    """For ``needs_subprocess`` inputs that need more than a command line: the name of a driver in ``DRIVERS``."""
    extra: dict[str, str] = field(default_factory=dict)
    benign: bool = False
    """A file as a framework really writes it (or a harmless look-alike): flagging it is a false alarm."""
    cwd: Path | None = None
    """The working folder of the scan and of the live proof (torch.load imports a shipped ``helpers.py`` from
    there); None: the code under test's folder."""
    loader: str = "torch.load"
    """How the live proof reads ``torch_load``: ``torch.load`` (``weights_only=False``), ``jit.load``,
    ``dcp.load`` (a folder), ``package.load`` (``PackageImporter.load_pickle`` of every pickle of a torch.package
    archive), ``np.load`` (``allow_pickle=True``; every array of an ``.npz``), ``joblib.load`` (compressed or not,
    as its first bytes say), ``torch.load.capped`` (a memory or time bomb: ``torch.load`` under an address-space
    cap, ``harness.exhausts_each``; the proof makes the canary), ``from_pretrained.CLASS``
    (``transformers.CLASS.from_pretrained(folder, trust_remote_code=True)``; diffusers' for
    ``DiffusionPipeline``), ``generate.custom_generate`` (a causal LM's ``generate(custom_generate=folder,
    trust_remote_code=True)``), ``torch.hub`` (``torch.hub.load(folder, "model", source="local")``),
    ``sentence_transformers`` (``CrossEncoder`` or ``SentenceTransformer(folder,
    trust_remote_code=True)``, as its ``config_sentence_transformers.json`` says, the folder first on the path) or
    ``none`` (nothing to prove: the input carries no code)."""


# --- a small pickle assembler (protocol 4 opcodes) -------------------------------------------------------------


def text(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogatepass")  # pickle itself writes lone surrogates this way
    return b"\x8c" + bytes([len(raw)]) + raw if len(raw) < 256 else b"X" + struct.pack("<I", len(raw)) + raw


def glob(module: str, name: str) -> bytes:
    """STACK_GLOBAL: protocol 4 resolves a dotted ``name`` attribute by attribute."""
    return text(module) + text(name) + b"\x93"


def call(function: bytes, *args: bytes) -> bytes:
    return function + b"(" + b"".join(args) + b"tR"


def program(body: bytes) -> bytes:
    """A whole pickle: ``{"payload": body, "weight": <nothing>}`` is not needed; the payload is the root."""
    return b"\x80\x04" + body + b"."


def torch_zip(
    path: Path, pickle_bytes: bytes, storages: dict[str, bytes] | None = None, prefix: str = "archive"
) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(f"{prefix}/data.pkl", pickle_bytes)
        archive.writestr(f"{prefix}/byteorder", b"little")
        for key, data in (storages or {}).items():
            archive.writestr(f"{prefix}/data/{key}", data)
        archive.writestr(f"{prefix}/version", b"3\n")
    return path


def code_payload(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').close()"


def gadgets(marker: Path) -> dict[str, tuple[str, bytes]]:
    """name -> (the global that must fail, a pickle whose unpickling creates ``marker``)."""
    code, command = code_payload(marker), f"touch {marker}"
    resolve = glob("pkgutil", "resolve_name")
    return {
        "exec": ("builtins.exec", call(glob("builtins", "exec"), text(code))),
        "dotted-builtins": (
            "torch.nn.modules.module.__builtins__.get",
            call(call(glob("torch.nn.modules.module", "__builtins__.get"), text("exec")), text(code)),
        ),
        "numpy-dotted-builtins": (
            "numpy.random._pickle.__builtins__.get",
            call(call(glob("numpy.random._pickle", "__builtins__.get"), text("exec")), text(code)),
        ),
        "dotted-os-system": (
            "torch.nn.modules.module.torch.serialization.os.system",
            call(glob("torch.nn.modules.module", "torch.serialization.os.system"), text(command)),
        ),
        "pkgutil-resolve-name": ("pkgutil.resolve_name", call(call(resolve, text("os:system")), text(command))),
        "operator-methodcaller": (
            "_operator.methodcaller",
            call(call(glob("_operator", "methodcaller"), text("system"), text(command)), call(resolve, text("os"))),
        ),
        "functools-partial": (
            "_functools.partial",
            call(call(glob("_functools", "partial"), call(resolve, text("builtins:exec")), text(code))),
        ),
        "cprofile-run": ("cProfile.run", call(glob("cProfile", "run"), text(code))),
        "io-open": ("io.open", call(glob("io", "open"), text(str(marker)), text("w"))),
        "fx-forward-from-src": (
            "torch.fx.graph_module._forward_from_src",
            call(glob("torch.fx.graph_module", "_forward_from_src"), text(code + "\ndef forward(self): pass\n"), b"}"),
        ),
        "user-function": ("__main__.evil", call(glob("__main__", "evil"), text(code))),
    }


def globals_inputs(folder: Path) -> list[Hostile]:
    out = []
    for name in gadgets(folder / "canary"):
        marker = folder / f"canary-{name}"
        path = torch_zip(folder / f"global-{name}.pt", program(gadgets(marker)[name][1]))
        out.append(Hostile(f"global-{name}", "globals", ("scan-model", str(path)), frozenset({1}), marker, path))
    return out


class _Payload:
    """Pickles as ``exec(code)``: what a hostile object inside a real checkpoint turns into under torch.save."""

    def __init__(self, marker: Path) -> None:
        self.code = code_payload(marker)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (self.code,)


def _pickles(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each pickle in a stream of pickles written back to back."""
    import io
    import pickletools

    stream, spans = io.BytesIO(data), []
    while stream.tell() < len(data):
        start = stream.tell()
        try:
            for opcode, _arg, position in pickletools.genops(stream):
                if opcode.name == "STOP":
                    spans.append((start, (position or 0) + 1))
                    break
        except ValueError:
            break
        stream.seek(spans[-1][1])
    return spans


def legacy_with(path: Path, replace_index: int, replacement: Callable[[object], bytes]) -> Path:
    """A legacy torch file whose ``replace_index``-th pickle (2: sys_info, 4: storage keys) is replaced by
    ``replacement(original value)``."""
    import pickle

    import torch

    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    start, end = _pickles(data)[replace_index]
    original = pickle.loads(data[start:end])  # our own file, just written
    path.write_bytes(data[:start] + replacement(original) + data[end:])
    return path


def polyglot(path: Path, marker: Path) -> Path:
    """A valid safetensors file (the reference reader opens it) whose first 8 bytes and JSON header also form a
    pickle that runs ``touch marker`` under ``torch.load``: PROTO 4, then BINBYTES swallows the rest of the length
    field and ``{"``; the first tensor's name holds the program in characters JSON allows (the header is ~55 MB,
    what the length field's opcode bytes spell)."""
    command = f"touch {marker}"
    command += " " * max(0, 32 - len(command))  # SHORT_BINSTRING lengths must be printable characters
    if len(command) in {34, 92}:  # '"' and '\\' would need escaping in JSON
        command += " "
    if len(command) >= 128:
        raise ValueError(f"path too long for the polyglot: {marker}")

    def short(value: str) -> str:
        return "U" + chr(len(value)) + value

    name = (
        short("torch.distributed.checkpoint.metadata")
        + short("torch.serialization.os.path.os.system")
        + "q\u0093"  # BINPUT 0xC2, then STACK_GLOBAL: U+0093 in UTF-8
        + short(command)
        + "q\u0085R.polyglot"  # BINPUT, TUPLE1, REDUCE, STOP
    )
    length_field = b"\x80\x04B\x03\x00\x00\x00\x00"
    (header_length,) = struct.unpack("<Q", length_field)
    header = json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, ensure_ascii=False).encode()
    path.write_bytes(length_field + header.ljust(header_length) + struct.pack("<f", 1.0))
    return path


def unread_pickle_inputs(folder: Path) -> list[Hostile]:
    import pickle

    import torch
    from safetensors.torch import save_file

    out: list[Hostile] = []

    def add(name: str, target: Path, loads: Path) -> None:
        marker = folder / f"canary-{name}"
        out.append(Hostile(name, "unread-pickles", ("scan-model", str(target)), frozenset({1}), marker, loads))

    def payload(name: str) -> bytes:
        return gadgets(folder / f"canary-{name}")["exec"][1]

    def sys_info(_original: object) -> bytes:
        return b"\x80\x02}(" + text("little_endian") + b"\x88" + text("x") + payload("legacy-sys-info") + b"u."

    def keys(original: object) -> bytes:  # the same key list, after a payload whose result is popped
        assert isinstance(original, list)
        return b"\x80\x02](" + b"".join(text(k) for k in original) + b"e" + payload("legacy-storage-keys") + b"0."

    add("legacy-sys-info", legacy_with(folder / "sys_info.pt", 2, sys_info), folder / "sys_info.pt")
    add("legacy-storage-keys", legacy_with(folder / "keys.pt", 4, keys), folder / "keys.pt")

    import warnings

    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = {"w": torch.ones(2), "extra": _Payload(folder / "canary-dcp-bytes-item")}
        dcp_save(state, checkpoint_id=folder / "dcp")
    add("dcp-bytes-item", folder / "dcp", folder / "dcp")

    for which in (0, 1):
        name = f"zip-duplicate-data-pkl-{which}"
        copies = [program(b"}"), program(b"}" + b"(" + text("x") + payload(name) + b"u")]
        path = folder / f"{name}.pt"
        with zipfile.ZipFile(path, "w") as archive, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Duplicate name": the point of this file
            archive.writestr("archive/data.pkl", copies[which])
            archive.writestr("archive/byteorder", b"little")
            archive.writestr("archive/data.pkl", copies[1 - which])
            archive.writestr("archive/version", b"3\n")
        add(name, path, path)

    twin = folder / "twin"
    twin.mkdir()
    save_file({"w": torch.ones(2)}, twin / "model.safetensors")
    torch.save({"w": torch.ones(2), "hook": _Payload(folder / "canary-folder-bin-twin")}, twin / "pytorch_model.bin")
    add("folder-bin-twin", twin, twin / "pytorch_model.bin")

    sharded = folder / "sharded"
    sharded.mkdir()
    save_file({"w": torch.ones(2)}, sharded / "model-00001-of-00001.safetensors")
    index = {"metadata": {"total_size": 8}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    torch.save(_Payload(folder / "canary-folder-training-args"), sharded / "training_args.bin")
    add("folder-training-args", sharded, sharded / "training_args.bin")

    raw = folder / "raw"
    raw.mkdir()
    save_file({"w": torch.ones(2)}, raw / "model.safetensors")
    (raw / "optimizer.pt").write_bytes(pickle.dumps(_Payload(folder / "canary-folder-raw-pickle"), protocol=4))
    add("folder-raw-pickle", raw, raw / "optimizer.pt")

    target = polyglot(folder / "polyglot.bin", folder / "canary-safetensors-polyglot")
    add("safetensors-polyglot", target, target)
    return out


def integer(value: int) -> bytes:
    """LONG1/LONG4: any Python int, however large."""
    raw = value.to_bytes((value.bit_length() + 8) // 8 or 1, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw if len(raw) < 256 else b"\x8b" + struct.pack("<I", len(raw)) + raw


def ints(values: tuple[int, ...] | list[int]) -> bytes:
    return b"(" + b"".join(integer(v) for v in values) + b"t"


def rebuild(shape: tuple[int, ...], stride: tuple[int, ...], offset: int, numel: int, key: str = "0") -> bytes:
    """``torch._utils._rebuild_tensor_v2`` of a view of the float32 storage ``key``."""
    storage = b"(" + text("storage") + glob("torch", "FloatStorage") + text(key) + text("cpu") + integer(numel)
    storage += b"tQ"  # TUPLE, BINPERSID
    return call(
        glob("torch._utils", "_rebuild_tensor_v2"),
        storage,
        integer(offset),
        ints(shape),
        ints(stride),
        b"\x89",
        call(glob("collections", "OrderedDict")),
    )


View = tuple[tuple[int, ...], tuple[int, ...], int]
"""(shape, stride, storage offset) of a tensor view."""


def tensor_pickle(tensors: Mapping[str, View], numel: int, key: str = "0") -> bytes:
    """``{name: tensor}`` where every tensor is ``(shape, stride, offset)`` over one float32 storage ``key``."""
    items = b"".join(text(name) + rebuild(*view, numel, key) for name, view in tensors.items())
    return program(b"}(" + items + b"u")


def safetensors_raw(path: Path, header: object, data: bytes = b"", length: int | None = None) -> Path:
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def _ok_or_error(exits: set[int] | None = None) -> frozenset[int]:
    return frozenset(exits or {0, 1, 3})


def traceback_inputs(folder: Path) -> list[Hostile]:
    out: list[Hostile] = []

    def add(name: str, path: Path, expect: set[int], *extra: str) -> None:
        out.append(Hostile(name, "tracebacks", ("scan-model", str(path), *extra), frozenset(expect)))

    four = struct.pack("<f", 1.0) * 4
    huge = 10**5000  # more digits than Python will print
    cases: dict[str, tuple[dict[str, View], int]] = {
        "huge-shape-empty": ({"x": ((2**62, 2**62, 0), (1, 1, 1), 0)}, 4),
        "huge-stride": ({"x": ((2, 2), (2**62, 2**62), 0)}, 4),
        "int64-overflow-stride": ({"x": ((3,), (2**63 + 5,), 0)}, 4),
        "shape-4300-digits": ({"x": ((huge,), (1,), 0)}, 4),
        "offset-4300-digits": ({"x": ((1,), (1,), huge)}, 4),
        "dims-1500": ({"x": ((1,) * 1500, (1,) * 1500, 0)}, 4),
        "dims-1500-empty": ({"x": ((1,) * 1499 + (0,), (1,) * 1500, 0)}, 4),
    }
    for name, (tensors, numel) in cases.items():
        add(name, torch_zip(folder / f"{name}.pt", tensor_pickle(tensors, numel), {"0": four}), {0, 1, 3})
    add(
        "safetensors-list-dtype",
        safetensors_raw(
            folder / "list-dtype.safetensors", {"x": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, four[:4]
        ),
        {3},
    )
    add(
        "safetensors-huge-shape",
        safetensors_raw(
            folder / "huge-shape.safetensors", {"x": {"dtype": "F32", "shape": [2**64, 0], "data_offsets": [0, 0]}}
        ),
        {0, 1, 3},
    )
    add(
        "safetensors-4300-digit-shape",
        safetensors_raw(
            folder / "digits.safetensors",
            b'{"x": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}',
            four[:4],
        ),
        {3},
    )
    surrogate = "bad\udc80name"
    add(
        "surrogate-name-output",
        torch_zip(folder / "surrogate.pt", tensor_pickle({surrogate: ((1,), (1,), 0)}, 1), {"0": four}),
        {0, 1, 3},
        "--format",
        "json",
        "--output",
        str(folder / "surrogate.json"),
    )
    add(
        "surrogate-key-table",
        torch_zip(folder / "surrogate-key.pt", tensor_pickle({surrogate: ((1,), (1,), 0)}, 1), {"0": four}),
        {0, 1, 3},
        "--output",
        str(folder / "surrogate.txt"),
    )
    gguf = folder / "unsupported-quant.gguf"
    gguf_file(gguf, ggml_type=9)  # Q8_1: the gguf package knows it but cannot dequantize it
    add("gguf-unsupported-quant", gguf, {0, 1, 3})
    gguf_file(folder / "unknown-quant.gguf", ggml_type=250)
    add("gguf-unknown-quant", folder / "unknown-quant.gguf", {3})
    deep = folder / "deep-config"
    deep.mkdir()
    (deep / "pyproject.toml").write_text("[tool.dtypecheck]\nx = " + "[" * 5000 + "]" * 5000 + "\n")
    out.append(
        Hostile(
            "deep-pyproject-toml",
            "tracebacks",
            ("scan-model", str(gguf), "--config", str(deep / "pyproject.toml")),
            frozenset({2}),
        )
    )
    return out


def gguf_file(path: Path, ggml_type: int, rows: int = 1, values: int = 256) -> Path:
    """A GGUF v3 file with one tensor of ``ggml_type``: ``rows`` rows of ``values`` values, all zero bytes."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except ValueError:
        block, size = 256, 256
    name = b"t"
    header = b"GGUF" + struct.pack("<IQQ", 3, 1, 0)
    header += struct.pack("<Q", len(name)) + name + struct.pack("<I", 2) + struct.pack("<QQ", values, rows)
    header += struct.pack("<IQ", ggml_type, 0)
    header += b"\x00" * (-len(header) % 32)
    path.write_bytes(header + b"\x00" * max(rows * values // block * size, 4096))
    return path


def big_checkpoint(folder: Path, layout: str, megabytes: int) -> Path:
    """A checkpoint holding one float32 tensor of ``megabytes`` (all ones) in ``layout``."""
    import torch

    count = megabytes << 18
    if layout == "safetensors":
        from safetensors.torch import save_file

        save_file({"w": torch.ones(count)}, folder / "big.safetensors")
        return folder / "big.safetensors"
    if layout == "torch-zip":
        torch.save({"w": torch.ones(count)}, folder / "big.pt")
        return folder / "big.pt"
    if layout == "torch-zip-strided":  # a transposed view: gathered through strides
        torch.save({"w": torch.ones(count // 1024, 1024).t()}, folder / "big-strided.pt")
        return folder / "big-strided.pt"
    path = folder / "big.gguf"
    name = b"w"
    header = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", len(name)) + name
    header += struct.pack("<I", 1) + struct.pack("<Q", count) + struct.pack("<IQ", 0, 0)
    header += b"\x00" * (-len(header) % 32)
    path.write_bytes(header + struct.pack("<f", 1.0) * count)
    return path


def crash_inputs(folder: Path) -> list[Hostile]:
    path = big_checkpoint(folder, "safetensors", megabytes=256)
    return [
        Hostile(
            "truncated-during-scan",
            "crashes",
            ("scan-model", str(path), "--workers", "1"),
            frozenset({0, 1, 3}),  # 0/1 only if the scan won the race
            needs_subprocess=True,
            driver="truncate",
        )
    ]


def hang_inputs(
    folder: Path, *, aliases: int = 1_000_000, views: int = 100_000, empty: int = 1_400_000
) -> list[Hostile]:
    """The sizes are the attack's (what the benchmark scans); the unit tests pass smaller ones that keep the point
    (one read of the data, over the tensor-count limit) at a tenth of the seconds."""
    out: list[Hostile] = []

    def add(name: str, args: tuple[str, ...], expect: set[int], **extra: object) -> None:
        out.append(Hostile(name, "hangs", args, frozenset(expect), **extra))  # type: ignore[arg-type]

    four = struct.pack("<f", 1.0) * 4
    # one tensor, memoized, then a million keys naming it through the memo (LONG_BINGET): ~13 MB of pickle
    memo = b"r\x01\x00\x00\x00", b"j\x01\x00\x00\x00"  # LONG_BINPUT 1, LONG_BINGET 1
    keys = b"".join(text(f"k{i}") + memo[1] for i in range(aliases))
    million = program(b"}(" + text("t0") + rebuild((4,), (1,), 0, 4) + memo[0] + keys + b"u")
    add("million-aliases", ("scan-model", str(torch_zip(folder / "aliases.pt", million, {"0": four}))), {0, 1})
    # the same view rebuilt 100,000 times (no memo): equal views are scanned once all the same
    rebuilt_views = {f"v{i}": ((4,), (1,), 0) for i in range(views)}
    rebuilt = torch_zip(folder / "rebuilt.pt", tensor_pickle(rebuilt_views, 4), {"0": four})
    add("rebuilt-views", ("scan-model", str(rebuilt)), {0, 1})
    # 5,000 distinct stride-0 views of one float, each under the per-tensor limit, together far over the file
    zero = {f"z{i}": (((1 << 22) + i,), (0,), 0) for i in range(5_000)}
    add(
        "stride0-views", ("scan-model", str(torch_zip(folder / "stride0.pt", tensor_pickle(zero, 4), {"0": four}))), {3}
    )
    # 1.4 million empty tensors in a safetensors header (~80 MB of JSON), over the tensor-count limit
    listed = {f"e{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(empty)}
    add("empty-tensors", ("scan-model", str(safetensors_raw(folder / "empty.safetensors", listed))), {3})
    # one GGUF row of 2**26 Q8_0 values (64 Mi values, dequantized to 256 MiB of float32 if done at once)
    row = gguf_file(folder / "huge-row.gguf", ggml_type=8, rows=1, values=1 << 26)
    add("gguf-huge-row", ("scan-model", str(row)), {0, 1})
    add("baseline-dev-zero", ("scan-model", str(row), "--baseline", "/dev/zero"), {3})
    factory = folder / "threads.py"
    factory.write_text(
        "import threading, time, torch\n"
        "def make():\n"
        "    threading.Thread(target=time.sleep, args=(3600,)).start()  # not a daemon: blocks a normal exit\n"
        "    return torch.nn.Linear(2, 2)\n"
    )
    add("factory-leaves-thread", ("scan-model", f"{factory}:make"), {0, 1}, needs_subprocess=True)
    return out


def other_inputs(folder: Path) -> list[Hostile]:
    import torch
    from safetensors.torch import save_file

    out: list[Hostile] = []

    def add(name: str, args: tuple[str, ...], expect: set[int], **extra: object) -> None:
        out.append(Hostile(name, "other", args, frozenset(expect), **extra))  # type: ignore[arg-type]

    good = folder / "good.safetensors"
    save_file({"w": torch.tensor([1.0, float("nan")])}, good)
    link = folder / "out-link.json"
    link.symlink_to("/dev/null")
    add("output-symlink-to-device", ("scan-model", str(good), "-f", "json", "-o", str(link)), {1})
    # /proc/self/fd/1 is what /dev/stdout links to; named directly, a dtypecheck that still replaced the output
    # with a renamed temporary file fails to create it there instead of clobbering the machine's /dev/stdout
    add("output-dev-stdout", ("scan-model", str(good), "-f", "json", "-o", "/proc/self/fd/1"), {1})
    forged = folder / "a\nerror: all checks passed.pt"
    forged.write_bytes(b"not a checkpoint")
    add("newline-in-file-name", ("scan-model", str(forged)), {3})
    add("empty-target", ("scan-model", str(good), "--target", ""), {2})
    add("empty-target-commas", ("scan-model", str(good), "--target", ",,"), {2})
    exits = folder / "exits.py"
    exits.write_text("import os\ndef make():\n    os._exit(7)\n")
    add("os-exit-in-factory", ("scan-model", f"{exits}:make"), {3}, needs_subprocess=True)
    escape = "\x1b]0;owned\x07\x1b[2J\x1b[31mred"
    save_file({escape: torch.tensor([float("inf")])}, folder / "escape.safetensors")
    add("escape-in-tensor-name-table", ("scan-model", str(folder / "escape.safetensors")), {1})
    bad_name = {escape: {"dtype": "F32", "shape": [3], "data_offsets": [0, 4]}}
    add(
        "escape-in-error-message",
        ("scan-model", str(safetensors_raw(folder / "escape-error.safetensors", bad_name, b"\0" * 4))),
        {3},
    )
    slow = folder / "slow.py"
    started = folder / "slow-started"
    slow.write_text(
        f"import time, pathlib, torch\ndef make():\n    pathlib.Path({str(started)!r}).touch()\n    time.sleep(60)\n"
    )
    add(
        "ctrl-c",
        ("scan-model", f"{slow}:make"),
        {130},
        needs_subprocess=True,
        driver="interrupt",
        extra={"started": str(started)},
    )
    ones = struct.pack("<f", 1.0) * 2
    add(
        "safetensors-metadata-not-string",
        (
            "scan-model",
            str(
                safetensors_raw(
                    folder / "meta.safetensors",
                    {"__metadata__": {"n": 1}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                    ones,
                )
            ),
        ),
        {3},
    )
    add(
        "safetensors-gap",
        (
            "scan-model",
            str(
                safetensors_raw(
                    folder / "gap.safetensors",
                    {
                        "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
                    },
                    ones + ones[:4],
                )
            ),
        ),
        {3},
    )
    big = folder / "big-header.safetensors"
    with big.open("wb") as handle:  # a sparse file: 100,000,001 bytes of header, but nothing written
        handle.write(struct.pack("<Q", 100_000_001) + b"{")
        handle.truncate(8 + 100_000_001 + 16)
    add("safetensors-header-over-limit", ("scan-model", str(big)), {3})
    two = folder / "two-folders.pt"
    with zipfile.ZipFile(two, "w") as archive:
        archive.writestr("archive/data.pkl", program(b"}"))
        archive.writestr("other/data.pkl", program(b"}"))
        archive.writestr("archive/version", b"3\n")
    add("zip-two-top-level-folders", ("scan-model", str(two)), {3})
    return out


FUZZ_SEED = 20261201
FUZZ_PER_ORIGINAL = 12


def damage(data: bytes, rng: random.Random) -> bytes:
    """``data`` with one to three random bytes changed, runs deleted or bytes inserted (drawn from ``rng``)."""
    damaged = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        position = rng.randrange(len(damaged))
        choice = rng.random()
        if choice < 0.6:
            damaged[position] = rng.randrange(256)
        elif choice < 0.8:
            del damaged[position : position + rng.randint(1, 40)]
        else:
            damaged[position:position] = rng.randbytes(rng.randint(1, 16))
    return bytes(damaged)


def fuzz_inputs(folder: Path) -> list[Hostile]:
    """Randomly damaged copies (seeded: the same files every run) of valid checkpoints of each format and of a
    pickle carrying a payload: bytes flipped, cut out or inserted. Each must give a report or one error line, and
    the payload must never run."""
    import torch
    from safetensors.torch import save_file

    originals = folder / "originals"
    originals.mkdir()
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "view": torch.arange(6.0).reshape(2, 3).t()}
    torch.save({"model": tensors, "step": 3}, originals / "z.pt")
    torch.save(tensors, originals / "l.pt", _use_new_zipfile_serialization=False)
    save_file({"a": torch.arange(6.0), "i": torch.tensor([1, 2], dtype=torch.int8)}, originals / "s.safetensors")
    gguf_file(originals / "q.gguf", ggml_type=8, rows=2)
    marker = folder / "canary-fuzz"
    torch_zip(originals / "payload.pt", program(gadgets(marker)["exec"][1]))
    rng = random.Random(FUZZ_SEED)
    out: list[Hostile] = []
    for original in sorted(originals.iterdir()):
        data = original.read_bytes()
        for index in range(FUZZ_PER_ORIGINAL):
            path = folder / f"{original.stem}-{index}{original.suffix}"
            path.write_bytes(damage(data, rng))
            canary = marker if original.name == "payload.pt" else None
            out.append(Hostile(path.name, "fuzz", ("scan-model", str(path)), frozenset({0, 1, 3}), canary))
    return out


# --- round 3 (issue 20): what torch.load reads that the scan once did not ------------------------------------------


def _local(name: str, data: bytes, method: int = zipfile.ZIP_STORED) -> tuple[bytes, bytes, int]:
    """A zip local record for ``name`` (its header and data) and the data's size once read."""
    import zlib

    raw = name.encode()
    body = data
    if method == zipfile.ZIP_DEFLATED:
        packer = zlib.compressobj(9, zlib.DEFLATED, -15)
        body = packer.compress(data) + packer.flush()
    crc = zlib.crc32(data)
    header = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0x21, crc, len(body), len(data), len(raw), 0)
    return header + raw + body, body, len(data)


def _central(name: str, header_at: int, local: tuple[bytes, bytes, int], method: int = zipfile.ZIP_STORED) -> bytes:
    import zlib

    raw = name.encode()
    record, body, size = local
    crc = struct.unpack("<I", record[14:18])[0] if record else zlib.crc32(b"")
    fields = (b"PK\x01\x02", 20, 20, 0, method, 0, 0x21, crc, len(body), size, len(raw), 0, 0, 0, 0, 0, header_at)
    return struct.pack("<4sHHHHHHIIIHHHHHII", *fields) + raw


def two_central_directories(path: Path, benign: bytes, hostile: bytes, storages: dict[str, bytes]) -> Path:
    """A torch zip with two central directories of the same size: the end record's offset points torch's reader
    (miniz) at the one listing the hostile ``data.pkl``, while Python's ``zipfile`` finds the directory just before
    the end record and "corrects" every offset by the difference, reading the benign one."""
    others = [("archive/byteorder", b"little"), ("archive/version", b"3\n")]
    others += [(f"archive/data/{key}", data) for key, data in storages.items()]
    blob = b""
    at: dict[str, int] = {}
    records: dict[str, tuple[bytes, bytes, int]] = {}
    # The hostile record first (only miniz reads it, at its own offset), then padding no directory lists, so every
    # record the benign directory lists lies past the shift zipfile adds to its offsets.
    layout = [("hostile", "archive/data.pkl", hostile), ("padding", "archive/padding", b"\0" * 1024)]
    for label, name, data in [*layout, ("benign", "archive/data.pkl", benign), *((n, n, d) for n, d in others)]:
        records[label] = _local(name, data)
        at[label] = len(blob)
        blob += records[label][0]
    hostile_cd_at = len(blob)

    def directory(pickle_label: str, shift: int) -> bytes:
        out = _central("archive/data.pkl", at[pickle_label] - shift, records[pickle_label])
        return out + b"".join(_central(name, at[name] - shift, records[name]) for name, _ in others)

    hostile_cd = directory("hostile", 0)
    shift = len(hostile_cd)  # the benign directory lies this far past where the end record says a directory is
    benign_cd = directory("benign", shift)
    assert len(benign_cd) == len(hostile_cd)
    count = 1 + len(others)
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, len(benign_cd), hostile_cd_at, 0)
    path.write_bytes(blob + hostile_cd + benign_cd + end)
    return path


def deflated_torch_zip(path: Path, pickle_bytes: bytes, storages: dict[str, bytes] | None = None) -> Path:
    """A torch zip whose ``data.pkl`` is DEFLATED (torch writes it stored, and inflates it all the same)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle_bytes, compress_type=zipfile.ZIP_DEFLATED)
        archive.writestr("archive/byteorder", b"little")
        for key, data in (storages or {}).items():
            archive.writestr(f"archive/data/{key}", data)
        archive.writestr("archive/version", b"3\n")
    return path


def _one_float_checkpoint() -> tuple[bytes, dict[str, bytes]]:
    return tensor_pickle({"w": ((1,), (1,), 0)}, 1), {"0": struct.pack("<f", 1.0)}


def differential_inputs(folder: Path) -> list[Hostile]:
    out: list[Hostile] = []
    benign, storages = _one_float_checkpoint()

    def add(name: str, target: Path, loads: Path) -> None:
        marker = folder / f"canary-{name}"
        out.append(Hostile(name, "differentials", ("scan-model", str(target)), frozenset({1}), marker, loads))

    def payload(name: str) -> bytes:  # the same tensor, and beside it the payload
        weight = text("w") + rebuild((1,), (1,), 0, 1)
        return program(b"}(" + weight + text("x") + gadgets(folder / f"canary-{name}")["exec"][1] + b"u")

    name = "zip-two-central-directories"
    path = two_central_directories(folder / f"{name}.pt", benign, payload(name), storages)
    add(name, path, path)
    name = "deflated-data-pkl"
    add(name, deflated_torch_zip(folder / f"{name}.pt", payload(name), storages), folder / f"{name}.pt")
    twin = folder / "deflated-twin"
    twin.mkdir()
    _safetensors_weights(twin / "model.safetensors")
    name = "deflated-side-file"
    side = program(gadgets(folder / f"canary-{name}")["exec"][1])  # no tensor: as training_args.bin holds none
    add(name, twin, deflated_torch_zip(twin / "training_args.bin", side))
    return out


def _safetensors_weights(path: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, path)
    return path


def legacy_tar(path: Path, storages_pickle: bytes) -> Path:
    """torch's oldest format, a tar of ``storages``, ``tensors`` and ``pickle``, whose ``storages`` member opens
    with ``storages_pickle`` (where torch reads the storage count)."""
    import io
    import pickle
    import tarfile

    members = {"sys_info": pickle.dumps({"little_endian": True}, 2), "storages": storages_pickle}
    members |= {"tensors": pickle.dumps(0, 2), "pickle": pickle.dumps({}, 2)}
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def loadable_inputs(folder: Path) -> list[Hostile]:
    """Files torch.load accepts that the scan did not recognise: raw pickles of protocol 0 and 1 (no ``\\x80``
    header), a legacy tar, alone, as a side file or as the ``pytorch_model.bin`` twin."""
    import pickle

    out: list[Hostile] = []

    def add(name: str, target: Path, loads: Path) -> None:
        marker = folder / f"canary-{name}"
        out.append(Hostile(name, "loadable-files", ("scan-model", str(target)), frozenset({1}), marker, loads))

    for protocol in (0, 1):
        name = f"raw-protocol-{protocol}"
        path = folder / f"{name}.pt"
        path.write_bytes(pickle.dumps(_Payload(folder / f"canary-{name}"), protocol=protocol))
        add(name, path, path)
        name = f"side-file-protocol-{protocol}"
        sharded = folder / name
        sharded.mkdir()
        _safetensors_weights(sharded / "model-00001-of-00001.safetensors")
        index = {"metadata": {"total_size": 8}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}
        (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
        args = sharded / "training_args.bin"
        args.write_bytes(pickle.dumps(_Payload(folder / f"canary-{name}"), protocol=protocol))
        add(name, sharded, args)
    twin = folder / "twin-protocol-0"
    twin.mkdir()
    _safetensors_weights(twin / "model.safetensors")
    (twin / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(folder / "canary-twin-protocol-0"), protocol=0))
    add("twin-protocol-0", twin, twin / "pytorch_model.bin")
    name = "legacy-tar"
    tar = legacy_tar(folder / f"{name}.pt", pickle.dumps(_Payload(folder / f"canary-{name}"), protocol=2))
    add(name, tar, tar)
    side = folder / "legacy-tar-side-file"
    side.mkdir()
    _safetensors_weights(side / "model.safetensors")
    loads = legacy_tar(side / "optimizer.pt", pickle.dumps(_Payload(folder / "canary-legacy-tar-side-file"), 2))
    add("legacy-tar-side-file", side, loads)
    return out


def gadget_inputs(folder: Path) -> list[Hostile]:
    """Classes of packages that ship with torch, called with arguments by the pickle: ``sympy.Lambda`` evals its
    body (live); the others take a string the way a gadget would (the policy, not a proven payload). Each sits
    beside a real tensor, so the call is the only thing wrong with the file."""
    out: list[Hostile] = []
    storage = {"0": struct.pack("<f", 1.0)}
    weight = text("w") + rebuild((1,), (1,), 0, 1)
    classes = {
        "sympy-lambda": ("sympy.core.function", "Lambda", True),
        "sympy-lambda-top-level": ("sympy", "Lambda", True),
        "sympy-matrix": ("sympy.matrices.dense", "MutableDenseMatrix", False),
        "networkx-graph": ("networkx.classes.graph", "Graph", False),
        "jinja2-template": ("jinja2.environment", "Template", False),
        "mpmath-mpf": ("mpmath.ctx_mp_python", "mpf", False),
    }
    for name, (module, cls, live) in classes.items():
        marker = folder / f"canary-{name}"
        code = text(code_payload(marker))
        args = (text("x"), code) if cls == "Lambda" else (code,)
        body = b"}(" + weight + text("gadget") + call(glob(module, cls), *args) + b"u"
        path = torch_zip(folder / f"{name}.pt", program(body), storage)
        canary = marker if live else None
        out.append(Hostile(name, "gadgets", ("scan-model", str(path)), frozenset({1}), canary, path if live else None))
    return out


def special_file_inputs(folder: Path) -> list[Hostile]:
    """FIFOs, sockets and devices (or symlinks to them) where a scan reads a small file: refused before opening."""
    import os
    import socket

    out: list[Hostile] = []

    def add(name: str, target: Path | str, *extra: str) -> None:
        out.append(Hostile(name, "special-files", ("scan-model", str(target), *extra), frozenset({3})))

    def sharded(name: str) -> Path:
        where = folder / name
        where.mkdir()
        _safetensors_weights(where / "model-00001-of-00001.safetensors")
        return where

    index = sharded("index-fifo")
    os.mkfifo(index / "model.safetensors.index.json")
    add("index-fifo", index)
    index = sharded("index-dev-zero")
    (index / "model.safetensors.index.json").symlink_to("/dev/zero")
    add("index-dev-zero", index)
    dcp = folder / "dcp-metadata-fifo"
    dcp.mkdir()
    os.mkfifo(dcp / ".metadata")
    (dcp / "__0_0.distcp").write_bytes(b"")
    add("dcp-metadata-fifo", dcp)
    dcp = folder / "dcp-metadata-dev-zero"
    dcp.mkdir()
    (dcp / ".metadata").symlink_to("/dev/zero")
    (dcp / "__0_0.distcp").write_bytes(b"")
    add("dcp-metadata-dev-zero", dcp)
    side = folder / "side-fifo"
    side.mkdir()
    _safetensors_weights(side / "model.safetensors")
    os.mkfifo(side / "training_args.bin")
    add("side-file-fifo", side)
    side = folder / "side-dev-zero"
    side.mkdir()
    _safetensors_weights(side / "model.safetensors")
    (side / "optimizer.pt").symlink_to("/dev/zero")
    add("side-file-dev-zero", side)
    side = folder / "side-socket"
    side.mkdir()
    _safetensors_weights(side / "model.safetensors")
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(side / "scheduler.pt"))
    except OSError:  # a path too long for AF_UNIX: the socket case is left out
        pass
    else:
        add("side-file-socket", side)
    finally:
        server.close()
    add("checkpoint-dev-zero", "/dev/zero")
    return out


def robustness_inputs(folder: Path) -> list[Hostile]:
    """dtypecheck's own tracebacks: configs, baselines, names and shapes it once failed to handle."""
    out: list[Hostile] = []
    good = _safetensors_weights(folder / "good.safetensors")

    def add(name: str, args: tuple[str, ...], expect: int, cwd: Path | None = None) -> None:
        out.append(Hostile(name, "robustness", args, frozenset({expect}), cwd=cwd))

    for name, content in {
        "config-huge-integer": b"[tool.dtypecheck]\nx = " + b"9" * 5000 + b"\n",
        "config-invalid-utf8": b"[tool.dtypecheck]\n# \xff\xfe dtypecheck\n",
        "config-invalid-toml": b"[tool.dtypecheck\n",
    }.items():
        where = folder / name
        where.mkdir()
        (where / "pyproject.toml").write_bytes(content)
        add(name, ("scan-model", str(good), "--config", str(where / "pyproject.toml")), 2)
        found = folder / f"{name}-found"
        found.mkdir()
        (found / "pyproject.toml").write_bytes(content)
        copy = found / "model.safetensors"
        copy.write_bytes(good.read_bytes())
        # the working folder's own project (issue 27: a config beside a checkpoint elsewhere is never read)
        add(f"{name}-found", ("scan-model", str(copy)), 2, cwd=found)
    import os

    fifo = folder / "config-fifo.toml"
    os.mkfifo(fifo)
    add("config-fifo", ("scan-model", str(good), "--config", str(fifo)), 2)
    baseline = folder / "baseline-invalid-utf8.json"
    baseline.write_bytes(b'{"schema": "dtypecheck.scan/1", "source": "\xff\xfe"}')
    add("baseline-invalid-utf8", ("scan-model", str(good), "--baseline", str(baseline)), 3)
    baseline = folder / "baseline-huge-integer.json"
    baseline.write_bytes(b'{"schema": "dtypecheck.scan/1", "tensors": [' + b"9" * 5000 + b"]}")
    add("baseline-huge-integer", ("scan-model", str(good), "--baseline", str(baseline)), 3)
    four = struct.pack("<f", float("inf"))
    surrogate = torch_zip(folder / "surrogate.pt", tensor_pickle({"bad\udc80name": ((1,), (1,), 0)}, 1), {"0": four})
    for output in ("table", "json", "sarif", "github"):
        add(f"surrogate-name-{output}", ("scan-model", str(surrogate), "--format", output), 1)
    dims = {"x": ((1,) * 65, (1,) * 65, 0)}
    add("dims-65", ("scan-model", str(torch_zip(folder / "dims-65.pt", tensor_pickle(dims, 1), {"0": four}))), 3)
    header = {"x": {"dtype": "F32", "shape": [1] * 65, "data_offsets": [0, 4]}}
    add("safetensors-dims-65", ("scan-model", str(safetensors_raw(folder / "dims-65.safetensors", header, four))), 3)
    return out


BUILDERS: dict[str, Callable[[Path], list[Hostile]]] = {
    "fuzz": fuzz_inputs,
    "crashes": crash_inputs,
    "hangs": hang_inputs,
    "other": other_inputs,
    "globals": globals_inputs,
    "unread-pickles": unread_pickle_inputs,
    "tracebacks": traceback_inputs,
    "differentials": differential_inputs,
    "loadable-files": loadable_inputs,
    "gadgets": gadget_inputs,
    "special-files": special_file_inputs,
    "robustness": robustness_inputs,
}


def build(folder: Path, classes: tuple[str, ...] = CLASSES) -> list[Hostile]:
    """Write every input of ``classes`` under ``folder`` (one subfolder per class)."""
    from tests.security.gate import GATE_BUILDERS  # imports this module: resolved at call time

    made: list[Hostile] = []
    for klass in classes:
        builder = BUILDERS.get(klass) or GATE_BUILDERS.get(klass)
        if builder is None:
            continue
        where = folder / klass
        where.mkdir(parents=True, exist_ok=True)
        made.extend(builder(where))
    return made


def json_bytes(value: object) -> bytes:
    return json.dumps(value).encode()
