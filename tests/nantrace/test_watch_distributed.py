"""``nan-trace --watch`` on 2 DDP ranks (gloo on CPU): the rank where the value was born replays its step, the
other finds its own replay finite (the NaN reached it through the all-reduce), and one merged report names the
birth; no rank hangs (each run is bounded far below gloo's 30-minute collective timeout)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.nantrace._scripts import NanTrace, line_of, subprocess_env
from tests.nantrace.test_distributed import TIMEOUT_S

DDP = """
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 1)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        h = self.encoder(x)
        if dist.get_rank() == 1 and int(self.calls) == 5 and sys.argv[1] == "late":
            h = h * 1e30 * 1e30  # rank 1 overflow
        return self.head(h)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(Net())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    batch = torch.randn(6, 4) + rank
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
print("finished", rank)
"""


def _nproc_watch(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dtypecheck", "nan-trace", "--watch", "--nproc", "2", "--format", "json"]
    return subprocess.run(
        [*command, str(script), "--", *args],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=TIMEOUT_S,
        check=False,
    )


def test_watch_on_two_ddp_ranks_replays_on_the_rank_of_birth(nantrace: NanTrace) -> None:
    script, text = nantrace.write("ddp.py", DDP)
    done = _nproc_watch(script, "late")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["status"], doc["world_size"]) == ("nonfinite", 2)
    first = doc["first"]
    assert (first["rank"], first["kind"], first["op"], first["phase"]) == (1, "inf", "aten.mul.Tensor", "forward")
    assert first["module"] == "module"  # DDP's own name for the model it wraps
    assert (first["step"], first["cause"], first["consequence"]) == (5, "range_overflow", "loss")
    assert first["location"]["line"] == line_of(text, "rank 1 overflow")
    assert [(r["rank"], r["status"]) for r in doc["ranks"]] == [(0, "clean"), (1, "nonfinite")]
    assert "finished" not in done.stderr
    # The merged watch summary is the birth rank's; rank 0 says the value arrived from elsewhere.
    summary = doc["watch"]
    assert (summary["detected"], summary["replayed_step"], summary["exact"]) == ("loss", 5, True)
    assert any(note.endswith("arrived non-finite through DDP's gradient all-reduce") for note in doc["notes"])


def test_watch_on_a_clean_ddp_run_exits_0(nantrace: NanTrace) -> None:
    script, _ = nantrace.write("ddp.py", DDP)
    done = _nproc_watch(script, "clean")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["status"], doc["first"], doc["world_size"], doc["steps"]) == ("clean", None, 2, 8)
    assert doc["watch"]["steps_checked"] == 8
    assert done.stderr.count("finished") == 2
