"""Compressed pickles in a model folder, and joblib's numpy arrays written between a pickle's opcodes.

``joblib.dump(obj, f, compress=3)`` writes ``zlib(pickle)``; gzip, bz2, lzma, xz (and lz4) on request, and
``joblib.load`` picks the decompressor by the file's first bytes, whatever its name (``opt.bin`` too);
``pandas.read_pickle("x.pkl.gz")`` decompresses by the name. ``torch.load`` of such a file fails at its first byte,
so the gate, reading side files as ``torch.load`` does, passed them all (exit 0). Joblib also writes each numpy
array's bytes right after the ``NumpyArrayWrapper`` describing it, and an array of objects as a nested pickle:
read as a plain pickle the stream ended at the first array, so a payload after it (or inside it) went unjudged.

Every payload sits beside clean weights (``model.safetensors``) and is proven live by ``joblib.load``. Inputs with
no canary must still fail: a decompression bomb (over ``MAX_DECOMPRESSED_BYTES``, refused rather than read) and,
where the ``lz4`` module is missing, an lz4 file (what it holds cannot be shown inert). Beside them, the files
``joblib.dump`` writes for numpy arrays of every layout, with each compressor, and compressed files that are not
pickles (exit 0).
"""

from __future__ import annotations

import gzip
import importlib.util
import pickle
import zlib
from pathlib import Path
from typing import Any

from tests.security.corpus import Hostile
from tests.security.gate.model_folders import _Payload, _weights

KLASS = "compressed-pickles"
COMPRESSIONS: dict[str, Any] = {
    "zlib": 3,  # what compress=3 (or True) writes
    "gzip": ("gzip", 3),
    "bz2": ("bz2", 3),
    "xz": ("xz", 3),
    "lzma": ("lzma", 3),
}


def zfile(data: bytes) -> bytes:
    """joblib < 0.10's compressed format (``ZF``, the length in hex padded to 19, zlib), which joblib.load reads."""
    return b"ZF" + hex(len(data)).encode().ljust(19) + zlib.compress(data)


def zlib_bomb(inflated_bytes: int) -> bytes:
    """A pickle's first bytes, then zeros: ``inflated_bytes`` in all, a few hundred KiB compressed."""
    squeeze = zlib.compressobj(9)
    out = [squeeze.compress(b"\x80\x04\x95")]
    block = bytes(1 << 20)
    for _ in range(inflated_bytes >> 20):
        out.append(squeeze.compress(block))
    return b"".join(out) + squeeze.flush()


def benign_arrays() -> dict[str, Any]:
    """A fitted scaler's and label encoder's state as sklearn keeps it: arrays of every layout joblib writes."""
    import numpy as np

    return {
        "mean_": np.linspace(0, 1, 12).reshape(3, 4),
        "components_": np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
        "n_samples_seen_": np.int64(1000),
        "classes_": np.array(["cat", "dog", "eel"], dtype=object),
        "labels": np.array(["a", "bb"]),
        "mask": np.array([True, False]),
        "stamps": np.array(["2024-01-01"], dtype="datetime64[s]"),
        "records": np.zeros(2, dtype=[("x", "<f4"), ("n", "<i8")]),
        "scalar": np.array(3.5),
        "empty": np.empty((0, 3)),
        "counts": np.arange(70_000, dtype=np.int16),  # several of joblib's read chunks
    }


def build(folder: Path) -> list[Hostile]:
    import joblib
    import numpy as np

    out: list[Hostile] = []

    def canary(name: str) -> Path:
        return folder / f"canary-{name}"

    def add(name: str, model: Path, loads: Path | None) -> None:
        marker = canary(name) if loads is not None else None
        args = ("scan-model", str(model))
        out.append(Hostile(name, KLASS, args, frozenset({1}), marker, loads, loader="joblib.load"))

    for kind, compress in COMPRESSIONS.items():  # an array first: the payload comes after its bytes
        name = f"joblib-{kind}"
        model = _weights(folder / name)
        joblib.dump({"coef": np.arange(8.0), "x": _Payload(canary(name))}, model / "extra.joblib", compress=compress)
        add(name, model, model / "extra.joblib")

    name = "joblib-after-array"  # uncompressed: read as a plain pickle, the stream ends in the array's bytes
    model = _weights(folder / name)
    joblib.dump({"coef": np.arange(8.0), "x": _Payload(canary(name))}, model / "scaler.joblib")
    add(name, model, model / "scaler.joblib")

    name = "joblib-object-array"  # the payload is an element of an object array: joblib's nested pickle
    model = _weights(folder / name)
    labels = np.empty(2, dtype=object)
    labels[0], labels[1] = "label", _Payload(canary(name))
    joblib.dump({"coef": np.arange(3.0), "labels": labels}, model / "encoder.joblib", compress=3)
    add(name, model, model / "encoder.joblib")

    name = "zlib-pickle-joblib"  # what compress=3 writes for an object without arrays
    model = _weights(folder / name)
    (model / "extra.joblib").write_bytes(zlib.compress(pickle.dumps(_Payload(canary(name)))))
    add(name, model, model / "extra.joblib")

    name = "gzip-pickle-pkl-gz"  # pandas.read_pickle("x.pkl.gz"): by the name
    model = _weights(folder / name)
    (model / "x.pkl.gz").write_bytes(gzip.compress(pickle.dumps(_Payload(canary(name)))))
    add(name, model, model / "x.pkl.gz")

    name = "gzip-pickle-opt-bin"  # joblib.load takes any name
    model = _weights(folder / name)
    (model / "opt.bin").write_bytes(gzip.compress(pickle.dumps(_Payload(canary(name)))))
    add(name, model, model / "opt.bin")

    name = "joblib-zfile"  # joblib < 0.10's format: ZF header, then zlib
    model = _weights(folder / name)
    (model / "old.pkl").write_bytes(zfile(pickle.dumps(_Payload(canary(name)))))
    add(name, model, model / "old.pkl")

    name = "gzip-truncated"  # the payload runs before joblib.load reaches the cut
    model = _weights(folder / name)
    joblib.dump({"x": _Payload(canary(name)), "coef": np.random.default_rng(0).random(50_000)}, model / "cut.joblib",
                compress=("gzip", 3))  # fmt: skip
    whole = (model / "cut.joblib").read_bytes()
    (model / "cut.joblib").write_bytes(whole[: len(whole) // 2])
    add(name, model, model / "cut.joblib")

    from dtypecheck.loaders._io.joblib_pickles import MAX_DECOMPRESSED_BYTES

    name = "decompression-bomb"  # inflates past the cap: refused, not read (no canary: joblib.load only allocates)
    model = _weights(folder / name)
    (model / "big.joblib").write_bytes(zlib_bomb(MAX_DECOMPRESSED_BYTES + (1 << 20)))
    add(name, model, None)

    if importlib.util.find_spec("lz4") is None:
        name = "lz4-unreadable"  # joblib reads lz4 by its magic where the module is installed: cannot show inert
        model = _weights(folder / name)
        (model / "extra.joblib").write_bytes(b"\x04\x22\x4d\x18" + b"\x60\x70" + bytes(32))
        add(name, model, None)

    out.extend(_benign(folder))
    return out


def _benign(folder: Path) -> list[Hostile]:
    import joblib

    out = []

    def benign(name: str, model: Path) -> None:
        out.append(Hostile(name, KLASS, ("scan-model", str(model)), frozenset({0}), benign=True, loader="none"))

    model = _weights(folder / "joblib-arrays")
    joblib.dump(benign_arrays(), model / "scaler.joblib")
    for kind, compress in COMPRESSIONS.items():
        joblib.dump(benign_arrays(), model / f"scaler-{kind}.joblib", compress=compress)
    joblib.dump(benign_arrays(), model / "scaler.pkl.gz")  # joblib picks gzip from the name
    benign("joblib-arrays", model)

    model = _weights(folder / "compressed-not-pickles")
    (model / "vocab.txt.gz").write_bytes(gzip.compress(b"the\nof\nand\n" * 100))
    (model / "merges.z").write_bytes(zlib.compress(b"t h\nth e\n" * 100))
    (model / "xnli_labels.txt").write_text("xnli: entailment, neutral, contradiction\n")  # starts like zlib
    (model / "notes.pkl.gz").write_bytes(gzip.compress(b"not a pickle at all"))
    benign("compressed-not-pickles", model)
    return out
