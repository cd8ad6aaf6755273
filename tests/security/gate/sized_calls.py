"""A tiny pickle that calls an allowed callable with a size: a memory or time bomb inside ``torch.load``.

``torch.nn.Linear(10**6, 10**6)``, ``torch.nn.BatchNorm1d(10**12)``, ``torch.FloatTensor(10**12)``,
``bytearray(10**12)``, ``list(range(10**12))``: each is a few dozen bytes of pickle beside a real state dict, each
global is allowed, and ``torch.load(weights_only=False)`` allocates terabytes (or loops for hours) before anything
could look at the result. Each payload is proven live (``loader="torch.load.capped"``, ``harness.prove_exhausted``)
in a throw-away process whose address space is capped at 2 GiB above what ``import torch`` takes: a
``MemoryError``, a killed process, an allocator's RuntimeError or a load past 20 s is the proof, and the prover
then makes the canary (nothing the payload runs could). Beside them, whole models, optimizers, schedulers,
Lightning dicts and small calls of the same callables as ``torch.save`` writes them, which never call a module
class or a sized callable with a size (exit 0).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.security.corpus import Hostile

KLASS = "sized-calls"
CAPPED = "torch.load.capped"
BIG = 10**12


class Call:
    """Pickles as ``factory(*args)`` (a ``REDUCE``), the way a hand-made payload would."""

    def __init__(self, factory: object, *args: object) -> None:
        self.factory, self.args = factory, args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.factory, self.args


def calls() -> dict[str, Call]:
    """name -> a call that allocates or loops past any bound under ``torch.load``."""
    import torch

    return {
        "linear": Call(torch.nn.Linear, 10**6, 10**6),
        "batchnorm-one-value": Call(torch.nn.BatchNorm1d, BIG),
        "float-tensor": Call(torch.FloatTensor, BIG),
        "float-tensor-shape": Call(torch.FloatTensor, 2**20, 2**20),
        "bytearray": Call(bytearray, BIG),
        "list-of-range": Call(list, range(BIG)),
    }


def small_calls() -> list[Call]:
    """The same callables with sizes the gate allows."""
    import torch

    return [Call(bytearray, 16), Call(torch.FloatStorage, 4), Call(list, range(10))]


def whole_saves() -> dict[str, object]:
    """Whole objects as ``torch.save`` pickles them: ``copyreg._reconstructor`` and a ``BUILD``, never a call with
    a size."""
    import torch

    torch.manual_seed(0)
    transformer = torch.nn.Transformer(8, 2, 1, 1, 16)
    optimizer = torch.optim.AdamW(transformer.parameters())
    transformer(torch.zeros(2, 1, 8), torch.zeros(2, 1, 8)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2)
    seq = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm1d(4), torch.nn.Embedding(5, 3))
    return {
        "linear": torch.nn.Linear(3, 4),
        "transformer": transformer,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "sequential": seq,
        "lightning": {
            "state_dict": transformer.state_dict(),
            "optimizer_states": [optimizer.state_dict()],
            "lr_schedulers": [scheduler.state_dict()],
            "hyper_parameters": argparse.Namespace(lr=1e-3),
            "epoch": 1,
        },
        "range-and-bytes": {"steps": range(100), "blob": bytearray(b"abc"), "raw": b"\x00" * 64, "w": torch.ones(2)},
    }


def build(folder: Path) -> list[Hostile]:
    import torch

    out: list[Hostile] = []
    for name, payload in calls().items():
        path = folder / f"{name}.pt"
        torch.save({"weight": torch.ones(4, 4), "extra": payload}, path)
        canary = folder / f"exhausted-{name}"
        out.append(Hostile(name, KLASS, ("scan-model", str(path)), frozenset({1}), canary, path, loader=CAPPED))
    benign = {f"whole-{name}": value for name, value in whole_saves().items()}
    benign["small-calls"] = {"weight": torch.ones(2), "extra": small_calls()}
    for name, value in benign.items():
        path = folder / f"{name}.pt"
        torch.save(value, path)
        out.append(Hostile(name, KLASS, ("scan-model", str(path)), frozenset({0}), benign=True, loader="none"))
    return out
