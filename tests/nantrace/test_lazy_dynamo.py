"""nan-trace runs the user's script without importing torch._dynamo until the script compiles something, and the
script computes what it computes without nan-trace (``dtypecheck/lazy_dynamo.py``).

Whether ``torch._dynamo`` is imported is a property of the process: each run is a process of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.nantrace._scripts import NanTrace

TRAIN = """
import json, sys
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
scaler = torch.amp.GradScaler("cpu")
for step in range(4):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(4, 8)).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    schedule.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
with open(sys.argv[1], "w") as out:
    json.dump({
        "loss": loss.item().hex(),
        "weights": [p.detach().double().sum().item().hex() for p in model.parameters()],
        "dynamo": type(sys.modules["torch._dynamo"]).__name__,
        "config": torch._dynamo.config is sys.modules["torch._dynamo.config"],
    }, out)
"""

CHECKPOINTED = """
import sys
import torch
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
optimizer.step()  # under the stand-in: its graph_break
torch._dynamo.config.cache_size_limit = 16  # the real config module, set before the package loads
for step in range(2):
    # Non-reentrant checkpointing decorates a function of its own with torch._dynamo.disable: the real package.
    loss = checkpoint(model, torch.randn(2, 4), use_reentrant=False).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print(loss.item().hex(), type(sys.modules["torch._dynamo"]).__name__, torch._dynamo.config.cache_size_limit,
      file=sys.stderr)
"""


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """``TRAIN`` run by plain Python: torch imports its real dynamo package when the optimizer is built."""
    folder = tmp_path_factory.mktemp("plain")
    script, out = folder / "train.py", folder / "plain.json"
    script.write_text(textwrap.dedent(TRAIN), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(out.read_text(encoding="utf-8"))
    return result


@pytest.mark.parametrize("mode", [(), ("--watch",)], ids=["traced", "watched"])
def test_a_traced_script_runs_under_the_stand_in_and_computes_what_plain_torch_computes(
    nantrace: NanTrace, tmp_path: Path, mode: tuple[str, ...], plain_run: dict[str, object]
) -> None:
    script, _ = nantrace.write("train.py", TRAIN)
    done = nantrace.process("-q", *mode, str(script), "--", str(tmp_path / "traced.json"))
    assert done.returncode == 0, done.stderr
    traced = json.loads((tmp_path / "traced.json").read_text(encoding="utf-8"))
    # nan-trace's stand-in served the whole run where plain torch imported the real package.
    assert plain_run["dynamo"] == "module"
    assert traced["dynamo"] == "_StandIn"
    assert plain_run["config"] is traced["config"] is True
    # The same bits: the stand-in changes no number.
    assert traced["loss"] == plain_run["loss"]
    assert traced["weights"] == plain_run["weights"]
    assert len(traced["weights"]) == 6


def test_a_traced_script_that_needs_the_real_dynamo_gets_it(nantrace: NanTrace) -> None:
    script, _ = nantrace.write("checkpointed.py", CHECKPOINTED)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    done = nantrace.process("-q", str(script))
    assert plain.returncode == 0, plain.stderr
    assert done.returncode == 0, done.stderr
    loss, dynamo, limit = plain.stderr.split()
    assert (dynamo, limit) == ("module", "16")
    assert done.stderr.split() == [loss, "module", "16"]
