"""A tiny pickle that calls an allowed callable with a size: a memory or time bomb inside ``torch.load``.

``torch.nn.Linear(10**6, 10**6)``, ``torch.nn.BatchNorm1d(10**12)``, ``torch.FloatTensor(10**12)``,
``bytearray(10**12)``, ``list(range(10**12))``: each is a few dozen bytes of pickle, each global is allowed, and
``torch.load(weights_only=False)`` allocates terabytes (or loops for hours) before anything could look at the result.
Each payload is proven live in a throw-away process whose address space is capped at 2 GiB above what ``import
torch`` takes (``MemoryError``, a killed process, or a RuntimeError of the allocator), and the gate fails it.
Whole models, optimizers, schedulers, Lightning dicts and ``TrainingArguments`` as ``torch.save`` writes them
never call a module class or a sized callable with a size (``copyreg._reconstructor`` + ``BUILD``): they pass.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from dtypecheck.loaders._io.pickle_globals import judge
from dtypecheck.loaders._io.pickle_vm import unpickle
from tests.security.harness import run_cli, run_python

BIG = 10**12


class _Call:
    """Pickles as ``factory(*args)`` (a ``REDUCE``), the way a hand-made payload would."""

    def __init__(self, factory: object, *args: object) -> None:
        self.factory, self.args = factory, args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.factory, self.args


CALLS: dict[str, _Call] = {
    "linear": _Call(torch.nn.Linear, 10**6, 10**6),
    "batchnorm-one-value": _Call(torch.nn.BatchNorm1d, BIG),
    "float-tensor": _Call(torch.FloatTensor, BIG),
    "float-tensor-shape": _Call(torch.FloatTensor, 2**20, 2**20),
    "bytearray": _Call(bytearray, BIG),
    "list-of-range": _Call(list, range(BIG)),
}


def _checkpoint(payload: object) -> bytes:
    """A real checkpoint (``torch.save`` of a state dict) that also holds the payload."""
    buffer = io.BytesIO()
    torch.save({"weight": torch.ones(4, 4), "extra": payload}, buffer)
    return buffer.getvalue()


PROVE = r"""
import resource, sys, time, warnings
warnings.simplefilter("ignore")
import torch
with open("/proc/self/status") as status:
    vm = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), vm + (2 << 30)))
start = time.monotonic()
try:
    torch.load(sys.argv[1], weights_only=False)
except MemoryError:
    print("MemoryError")
except RuntimeError as exc:
    print("RuntimeError", "alloc" in str(exc).lower() or "memory" in str(exc).lower(), str(exc)[:200])
else:
    print("loaded", time.monotonic() - start)
"""


@pytest.fixture(scope="module")
def payload_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sized")
    files = {}
    for name, payload in CALLS.items():
        path = folder / f"{name}.pt"
        path.write_bytes(_checkpoint(payload))
        files[name] = path
    return files


@pytest.mark.parametrize("name", sorted(CALLS))
def test_payload_is_live_under_a_memory_cap(name: str, payload_files: dict[str, Path]) -> None:
    """torch.load of the checkpoint runs out of a 2 GiB cap."""
    try:
        proof = run_python(PROVE, str(payload_files[name]), timeout=20)
    except subprocess.TimeoutExpired:  # a hang past 20 s is proof too (a loop over range(10**12) takes hours)
        return
    out = proof.stdout.strip()
    killed = proof.returncode < 0  # the kernel's OOM killer
    assert killed or out.startswith(("MemoryError", "RuntimeError True")), out + proof.stderr[-400:]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_gate_fails_a_sized_call(name: str, payload_files: dict[str, Path]) -> None:
    result = run_cli(["scan-model", str(payload_files[name])])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "fail" in result.stdout
    _, refs = unpickle(_data_pkl(CALLS[name]), where=name, persistent_load=lambda pid: ("storage", pid))
    assert "fail" in {judge(ref)[0] for ref in refs}


def test_small_calls_of_the_same_callables_stay_allowed() -> None:
    for small in (_Call(bytearray, 16), _Call(torch.FloatStorage, 4), _Call(list, range(10))):
        _, refs = unpickle(_data_pkl(small), where="small", persistent_load=lambda pid: ("storage", pid))
        assert {judge(ref)[0] for ref in refs} == {"ok"}


def _data_pkl(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    archive = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    return archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))


def _benign() -> dict[str, object]:
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
        "range-and-bytes": {"steps": range(100), "blob": bytearray(b"abc"), "raw": b"\x00" * 64},
    }


@pytest.mark.parametrize("name", sorted(_benign()))
def test_whole_saves_never_call_with_a_size(name: str) -> None:
    _, refs = unpickle(_data_pkl(_benign()[name]), where=name, persistent_load=lambda pid: ("storage", pid))
    assert {judge(ref)[0] for ref in refs} == {"ok"}, [(r.qualname, sorted(r.uses)) for r in refs]


def test_training_arguments_stay_a_warning(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    _, refs = unpickle(_data_pkl(args), where="training_args.bin", persistent_load=lambda pid: ("storage", pid))
    assert {judge(ref)[0] for ref in refs} <= {"ok", "warn"}
