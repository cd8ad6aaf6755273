"""What the 2-rank nan-trace tests share (gloo on CPU): one model, a DDP script whose rank 1 goes non-finite in
the mode its argv names, and ``nproc`` to run ``nan-trace --nproc 2`` (plain or ``--watch``) on it.

Each run is bounded by ``TIMEOUT_S``, far below gloo's 30-minute collective timeout: a rank left waiting for a
stopped peer fails the test instead of passing late."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dtypecheck.nantrace.launch import free_port
from tests.nantrace._scripts import NanTrace, subprocess_env

TIMEOUT_S = 240

NET = """
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

mode = sys.argv[1] if len(sys.argv) > 1 else "clean"


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 1)
        # A buffer, so that watch mode's replay (which puts the buffers back) sees the same call again.
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        h = torch.tanh(self.encoder(x))
        if dist.get_rank() == 1 and int(self.calls) == 5 and mode.startswith("late"):
            h = h * 1e30 * 1e30  # rank 1 overflow
        return self.head(h)

"""
"""The model of every 2-rank script; ``mode`` is the script's first argument."""

DDP_STEPS = 6

DDP = (
    NET
    + f"""
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(Net())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range({DDP_STEPS}):
    batch = torch.randn(6, 4) + rank
    extra = 0.0
    if rank == 1 and step == 2 and mode == "data":
        batch = batch - 10.0
        batch = batch.log()  # rank 1 data
    if rank == 1 and step == 2 and mode.startswith("grad"):
        weight = model.module.encoder.weight
        extra = torch.sqrt(weight - weight.detach()).sum()  # rank 1 grad
    loss = model(batch).pow(2).mean() + extra
    loss.backward()
    if rank == 0 and step == 2 and mode == "grad-slow":
        time.sleep(1.0)  # rank 0 begins its update only after rank 1 has reported
    if rank == 0 and step == 4 and mode == "late-slow":
        time.sleep(1.0)  # rank 0 reaches its update only after rank 1 has reported
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
print("finished", rank)
"""
)
"""``DDP_STEPS`` steps; rank 1 goes non-finite in step 3 (``data``: its batch, ``grad``: its backward;
``grad-slow``: and rank 0 is a second late to that step's update) or in its
5th forward (``late``; ``late-slow``: and rank 0 is a second late to that step's update); ``clean`` runs to the
end and prints ``finished <rank>``."""


FSDP = (
    NET
    + """
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = Net()
fully_shard(model.encoder)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
for step in range(3):
    batch = torch.randn(6, 4)
    if rank == 1 and step == 1 and mode == "data":
        batch = (batch - 10.0).log()  # rank 1 data
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
"""
)
"""FSDP2 (``fully_shard``) of the same model, 3 steps; ``data`` plants a NaN in rank 1's step-2 batch."""


def nproc(nantrace: NanTrace, script: Path, *args: str, watch: bool = False) -> subprocess.CompletedProcess[str]:
    """``nan-trace [--watch] --nproc 2 --format json script args...`` as a child process."""
    flags = ("--watch",) if watch else ()
    return nantrace.process(*flags, "--nproc", "2", "--format", "json", str(script), *args, timeout=TIMEOUT_S)


def torchrun(*arguments: str) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node 2 -m dtypecheck ARGUMENTS`` on a free port of this machine."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "1"]
    command += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "dtypecheck", *arguments]
    return subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=TIMEOUT_S, check=False)
