"""Globals that run code under torch.load, however they are reached (issue 27, class 1).

Every input here is a live payload: its ``canary`` appears when ``torch.load(weights_only=False)`` (or
``dcp.load``) reads ``torch_load`` from ``cwd``. Each sits beside a real tensor ``w``, so the payload is the only
thing wrong with the file. None names a global that the old denylist of known gadgets would list first: they go
through allowed rebuild helpers, numpy's RNG constructors, memo aliases, ``BUILD`` and shipped modules.
"""

from __future__ import annotations

import pickle
import struct
import warnings
from pathlib import Path

from tests.security.corpus import Hostile, call, code_payload, glob, program, rebuild, text, torch_zip

KLASS = "code-globals"
_STORAGE = {"0": struct.pack("<f", 1.0)}
_WEIGHT = text("w") + rebuild((1,), (1,), 0, 1)
_NONE, _EMPTY_TUPLE, _EMPTY_DICT = b"N", b")", b"}"


def _checkpoint(path: Path, payload: bytes) -> Path:
    """``{"w": tensor, "payload": <payload>}`` as a torch zip."""
    return torch_zip(path, program(b"}(" + _WEIGHT + text("payload") + payload + b"u"), _STORAGE)


def _tuple(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def _setitems(*pairs: tuple[str, bytes]) -> bytes:
    return b"}(" + b"".join(text(key) + value for key, value in pairs) + b"u"


def _mmap_cache_state(canary: Path) -> bytes:
    """The ``__dict__`` ``fsspec.caching.MMapCache.__setstate__`` takes: it then opens ``location`` for writing
    (creating the canary) and maps it."""
    return _setitems(
        ("blocksize", b"K\x01"),
        ("fetcher", _NONE),
        ("size", b"K\x01"),
        ("location", text(str(canary))),
        ("blocks", _NONE),
        ("multi_fetcher", _NONE),
    )


def _shell(canary: Path) -> bytes:
    return text(f"touch {canary}")


def build(folder: Path) -> list[Hostile]:
    out: list[Hostile] = []

    def add(name: str, path: Path, *extra: str, cwd: Path | None = None, loader: str = "torch.load") -> None:
        target = path.parent if loader == "dcp.load" else path
        args = ("scan-model", str(target), *extra)
        out.append(Hostile(name, KLASS, args, frozenset({1}), canary(name), target, cwd=cwd, loader=loader))

    def canary(name: str) -> Path:
        return folder / f"canary-{name}"

    def checkpoint(name: str, payload: bytes) -> Path:
        return _checkpoint(folder / f"{name}.pt", payload)

    from_type = glob("torch._tensor", "_rebuild_from_type_v2")
    tensor = glob("torch", "Tensor")
    # sympy (installed with torch) evals strings: reached through torch's own rebuild of a tensor subclass
    name = "from-type-sympy-lambda"
    code = text(code_payload(canary(name)))
    inner = _tuple(text("x"), code)
    add(name, checkpoint(name, call(from_type, glob("sympy", "Lambda"), tensor, inner, _EMPTY_DICT)))
    name = "from-type-sympy-matrix"
    rows = b"](" + b"](" + text(code_payload(canary(name))) + b"e" + b"e"
    add(name, checkpoint(name, call(from_type, glob("sympy", "Matrix"), tensor, _tuple(rows), _EMPTY_DICT)))
    name = "reconstructor-sympy-matrix"
    matrix = glob("sympy.matrices.dense", "MutableDenseMatrix")
    rows = b"](" + b"](" + text(code_payload(canary(name))) + b"e" + b"e"
    add(name, checkpoint(name, call(glob("copyreg", "_reconstructor"), matrix, matrix, rows)))
    # numpy's RNG unpickling helpers (allowed: Trainer and Lightning save RNG states) call what they are handed
    name = "numpy-generator-ctor"
    run = glob("torch.utils.collect_env", "run")  # a torch function: shell=True on a string
    add(name, checkpoint(name, call(glob("numpy.random._pickle", "__generator_ctor"), _shell(canary(name)), run)))
    name = "numpy-randomstate-ctor"
    ctor = glob("numpy.random._pickle", "__randomstate_ctor")
    add(name, checkpoint(name, call(ctor, _shell(canary(name)), run)))
    # a class whose __setstate__ runs on a plain dict (no arguments anywhere): NEWOBJ, INST (protocol 0), OBJ (1)
    mmap_cache = glob("fsspec.caching", "MMapCache")
    name = "mmapcache-newobj"
    add(name, checkpoint(name, mmap_cache + _EMPTY_TUPLE + b"\x81" + _mmap_cache_state(canary(name)) + b"b"))
    name = "mmapcache-inst"
    add(name, checkpoint(name, b"(ifsspec.caching\nMMapCache\n" + _mmap_cache_state(canary(name)) + b"b"))
    name = "mmapcache-obj"
    add(name, checkpoint(name, b"(" + mmap_cache + b"o" + _mmap_cache_state(canary(name)) + b"b"))
    name = "mmapcache-reconstructor"
    bare = call(glob("copyreg", "_reconstructor"), mmap_cache, glob("builtins", "object"), _NONE)
    add(name, checkpoint(name, bare + _mmap_cache_state(canary(name)) + b"b"))
    # memo aliases: the global first appears as a plain reference, then is fetched back and called
    name = "memo-alias-binget"
    plain = run + b"q\x07"  # BINPUT 7: stored in a dict as a mere reference
    again = b"h\x07" + _tuple(_shell(canary(name))) + b"R"  # BINGET 7, called
    add(name, checkpoint(name, _setitems(("activation", plain), ("hook", again))))
    name = "memo-alias-long-binget"
    plain = run + b"r\x00\x01\x00\x00"  # LONG_BINPUT 256
    again = b"j\x00\x01\x00\x00" + _tuple(_shell(canary(name))) + b"R"
    add(name, checkpoint(name, _setitems(("activation", plain), ("hook", again))))
    # BUILD onto a module: monkeypatch an allowed name, then call it through its (allowed) global
    name = "build-monkeypatches-module"
    serialization = glob("torch", "serialization")
    patch = b"N" + _setitems(("_get_layout", glob("torch.fx.graph_module", "_forward_from_src"))) + b"\x86"
    source = text(code_payload(canary(name)))
    payload = serialization + patch + b"b0" + call(glob("torch.serialization", "_get_layout"), source, _EMPTY_DICT)
    add(name, checkpoint(name, payload))
    # a rebuilt nn.Module whose state replaced forward, called by the pickle
    name = "module-instance-called"
    path = folder / f"{name}.pt"
    _save(path, _Called(canary(name)))
    add(name, path)
    # modules shipped beside the checkpoint, imported by torch.load run from that folder (one folder for all, so
    # that one process proves them all)
    shipped = folder / "shipped"
    for name, files, ref in (
        ("shipped-helpers", {"helpers.py": "{code}\nclass Config:\n    pass\n"}, ("helpers", "Config")),
        ("shipped-package", {"custom_pkg/__init__.py": "{code}\nclass Net:\n    pass\n"}, ("custom_pkg", "Net")),
        (
            "shipped-configuration",
            {"configuration_custom.py": "{code}\nclass CustomConfig:\n    pass\n"},
            ("configuration_custom", "CustomConfig"),
        ),
        ("shipped-stdlib-shadow", {"decimal.py": "{code}\nclass Decimal:\n    pass\n"}, ("decimal", "Decimal")),
        (
            "shipped-torch-optional-import",  # torch.utils.tensorboard imports tensorboard
            {"tensorboard.py": "{code}\n__version__ = '9.9'\n"},
            ("torch.utils.tensorboard", "SummaryWriter"),
        ),
    ):
        for relative, source_text in files.items():
            (shipped / relative).parent.mkdir(parents=True, exist_ok=True)
            (shipped / relative).write_text(source_text.format(code=code_payload(canary(name))))
        add(name, _checkpoint(shipped / f"{name}.pt", glob(*ref)), cwd=shipped)
    # DCP metadata: the .metadata pickle that dcp.load reads first
    name = "dcp-metadata-numpy-ctor"
    add(name, _dcp_with_metadata(folder / name, call(ctor, _shell(canary(name)), run)), loader="dcp.load")
    # a selection never hides a security finding
    name = "include-selection"
    add(name, checkpoint(name, mmap_cache + _EMPTY_TUPLE + b"\x81" + _mmap_cache_state(canary(name)) + b"b"),
        "--include", "w")  # fmt: skip
    name = "weights-only-selection"
    add(name, checkpoint(name, mmap_cache + _EMPTY_TUPLE + b"\x81" + _mmap_cache_state(canary(name)) + b"b"),
        "--weights-only")  # fmt: skip
    return out


class _Called:
    """Pickles as ``module(command)``, where ``module`` is an ``nn.Identity`` whose ``forward`` is
    ``torch.utils.collect_env.run``: ``Module.__call__`` runs the command."""

    def __init__(self, canary: Path) -> None:
        import torch
        import torch.utils.collect_env

        self.module = torch.nn.Identity()
        self.module.forward = torch.utils.collect_env.run  # type: ignore[method-assign]
        self.command = f"touch {canary}"

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return self.module, (self.command,)


def _save(path: Path, payload: object) -> None:
    import torch

    torch.save({"w": torch.ones(1), "payload": payload}, path)


def _dcp_with_metadata(where: Path, payload: bytes) -> Path:
    """A real ``dcp.save`` folder whose ``.metadata`` pickle runs ``payload`` (its result popped) first."""
    import torch
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_save({"w": torch.ones(2)}, checkpoint_id=where)
    metadata = where / ".metadata"
    original = pickle.loads(metadata.read_bytes())  # our own file, just written
    body = pickle.dumps(original, protocol=2)[2:]  # no frames: the payload goes before it
    metadata.write_bytes(b"\x80\x02" + payload + b"0" + body)
    return metadata
