"""The hostile corpus, built from code (no binary blobs): every input that once crashed, hung, printed a traceback
or passed the gate while running code under ``torch.load(weights_only=False)``.

``build(folder)`` writes every input under ``folder`` and returns one ``Hostile`` per input: the command line to
run, the exit codes the contract allows for it, and, for inputs that carry a code-execution payload, the canary
file that payload creates when it runs (``torch_load`` says how to prove the payload live with real torch).
The tests (``tests/security/test_*.py``) and ``benchmarks/hostile_corpus.py`` share it.
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CLASSES = ("globals", "unread-pickles", "crashes", "tracebacks", "hangs", "other")


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


# --- a small pickle assembler (protocol 4 opcodes) -------------------------------------------------------------


def text(value: str) -> bytes:
    raw = value.encode()
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


BUILDERS: dict[str, Callable[[Path], list[Hostile]]] = {
    "globals": globals_inputs,
}


def build(folder: Path, classes: tuple[str, ...] = CLASSES) -> list[Hostile]:
    """Write every input of ``classes`` under ``folder`` (one subfolder per class)."""
    made: list[Hostile] = []
    for klass in classes:
        builder = BUILDERS.get(klass)
        if builder is None:
            continue
        where = folder / klass
        where.mkdir(parents=True, exist_ok=True)
        made.extend(builder(where))
    return made


def json_bytes(value: object) -> bytes:
    return json.dumps(value).encode()
