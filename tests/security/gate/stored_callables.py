"""Torch and numpy names the pickle never calls, but stores where torch's own code calls them (red team, round 5).

The issue-27 rule let any torch or numpy name through as a *plain reference* (stored, never called by the
pickle). But allowed classes run code of their own on the state a pickle gives them, and a rebuilt object's
``__dict__`` may hold any attribute: ``Optimizer.__setstate__`` (an allowed ``torch.optim`` class) calls
``self.state.get(param, [])`` for every parameter of every group, so an ``Adam`` whose ``state`` is a rebuilt
``nn.Identity`` (allowed) whose ``get`` attribute is ``numpy.savetxt`` writes the file the "parameter" names, during
``torch.load``; ``ModuleDict.__setitem__`` (run by ``SETITEMS``) calls ``self.add_module(key, value)`` likewise.
Every payload here is live under ``torch.load(weights_only=False)`` and every global of it was ``ok`` before.
Beside them, whole optimizers, schedulers and transformer layers as ``torch.save`` writes them (exit 0).
"""

from __future__ import annotations

import struct
from pathlib import Path

from tests.security.corpus import Hostile, call, glob, program, rebuild, text, torch_zip

KLASS = "stored-callables"
_STORAGE = {"0": struct.pack("<f", 1.0)}
_WEIGHT = text("w") + rebuild((1,), (1,), 0, 1)


def _bare(module: str, cls: str) -> bytes:
    """``copyreg._reconstructor(cls, object, None)``: a bare instance (what protocol 2 pickles a class as)."""
    return call(glob("copyreg", "_reconstructor"), glob(module, cls), glob("builtins", "object"), b"N")


def _dict(*pairs: tuple[str, bytes]) -> bytes:
    return b"}(" + b"".join(text(key) + value for key, value in pairs) + b"u"


def _adam(state: bytes, parameter: str) -> bytes:
    """An ``Adam`` rebuilt with ``state`` as its ``state`` and one group whose one "parameter" is a path."""
    groups = b"](" + _dict(("params", b"](" + text(parameter) + b"e")) + b"e"
    return _built("torch.optim.adam", "Adam", _dict(("defaults", b"}"), ("param_groups", groups), ("state", state)))


def _built(module: str, cls: str, state: bytes) -> bytes:
    """A bare instance of ``module.cls`` then ``BUILD`` with ``state``."""
    return _bare(module, cls) + state + b"b"


def build(folder: Path) -> list[Hostile]:
    out: list[Hostile] = []

    def add(name: str, payload: bytes) -> None:
        path = torch_zip(folder / f"{name}.pt", program(b"}(" + _WEIGHT + text("payload") + payload + b"u"), _STORAGE)
        out.append(Hostile(name, KLASS, ("scan-model", str(path)), frozenset({1}), folder / f"canary-{name}", path))

    def canary(name: str) -> str:
        return str(folder / f"canary-{name}")

    savetxt = glob("numpy", "savetxt")
    name = "optimizer-state-get"
    identity = _built("torch.nn.modules.linear", "Identity", _dict(("get", savetxt)))
    add(name, _adam(identity, canary(name)))
    name = "optimizer-state-module-getattr"  # Module.__getattr__ finds get in _modules
    identity = _built("torch.nn.modules.linear", "Identity", _dict(("_modules", _dict(("get", savetxt)))))
    add(name, _adam(identity, canary(name)))
    name = "optimizer-state-torch-class"  # a class makes as good a gadget: PackageExporter(path, []) opens path
    exporter = glob("torch.package.package_exporter", "PackageExporter")
    add(name, _adam(_built("torch.nn.modules.linear", "Identity", _dict(("get", exporter))), canary(name)))
    name = "moduledict-setitems-add-module"  # SETITEMS: ModuleDict.__setitem__ calls self.add_module(key, value)
    modules = _built("torch.nn.modules.container", "ModuleDict", _dict(("add_module", savetxt), ("_modules", b"}")))
    add(name, modules + b"(" + text(canary(name)) + b"](G?\xf0\x00\x00\x00\x00\x00\x00e" + b"u")
    out.extend(_benign(folder))
    return out


def _benign(folder: Path) -> list[Hostile]:
    """Whole objects as ``torch.save`` writes them: an optimizer and its scheduler (with their state), a
    transformer layer with ``gelu`` (``torch._C._nn.gelu``), and hyperparameters holding a numpy scalar type and an
    activation function."""
    import numpy as np
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, activation="gelu")
    hparams = {"dtype": np.float32, "activation": torch.nn.functional.silu, "weights": model.state_dict()}
    out = []
    for name, value in (
        ("whole-optimizer", {"model": model, "optimizer": optimizer}),
        ("whole-scheduler", {"model": model, "scheduler": scheduler}),
        ("transformer-layer-gelu", layer),
        ("hparams-scalar-type-and-activation", hparams),
    ):
        path = folder / f"{name}.pt"
        torch.save(value, path)
        out.append(Hostile(name, KLASS, ("scan-model", str(path)), frozenset({0}), benign=True, loader="none"))
    return out
