"""``nan-trace --watch`` on 2 DDP ranks (gloo on CPU): the rank where the value was born replays its step, the
other finds its own replay finite (the NaN reached it through the all-reduce), and one merged report names the
birth; no rank hangs (each run is bounded far below gloo's 30-minute collective timeout)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from dtypecheck.nantrace.watch.replay import SHARDED
from tests.nantrace._ranks import DDP, DDP_STEPS, FSDP, nproc
from tests.nantrace._scripts import NanTrace, line_of


def test_watch_on_two_ddp_ranks_replays_on_the_rank_of_birth(nantrace: NanTrace) -> None:
    # Rank 0 gets to its step-5 update after rank 1 has reported: it is stopped, but judges that step first.
    script, text = nantrace.write("ddp.py", DDP)
    done = nproc(nantrace, script, "--", "late-slow", watch=True)
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
    done = nproc(nantrace, script, watch=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["status"], doc["first"], doc["world_size"], doc["steps"]) == ("clean", None, 2, DDP_STEPS)
    assert doc["watch"]["steps_checked"] == DDP_STEPS
    assert done.stderr.count("finished") == 2


def test_watch_on_fsdp2_checks_each_ranks_shards_and_traces_on_from_a_failing_step(nantrace: NanTrace) -> None:
    """FSDP2's parameters, gradients and optimizer states are DTensors: each rank checks and snapshots its own
    shards (a whole-tensor reduction failed on a rank whose shard of a 1-element bias is empty, and a DTensor has
    no rule for ``_foreach_copy_``), and a rank does not re-run a sharded model's calls alone (their all-gathers
    would wait for the other rank): the next steps are traced fully and the reason says so."""
    script, text = nantrace.write("fsdp.py", FSDP)
    with ThreadPoolExecutor(2) as pool:
        failing = pool.submit(nproc, nantrace, script, "--", "data", watch=True)
        clean = pool.submit(nproc, nantrace, script, watch=True)
        done = clean.result()
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["status"], doc["first"], doc["world_size"], doc["watch"]["steps_checked"]) == ("clean", None, 2, 3)
    done = failing.result()
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    summary = doc["watch"]
    # Rank 1's NaN batch reaches both ranks' gradient shards through the reduce-scatter in step 2.
    assert (summary["detected_step"], summary["replayed_step"], summary["traced_from_step"]) == (2, None, 3)
    assert summary["reason"] == SHARDED
    # Traced fully from step 3: the first non-finite op it meets is the encoder's, reading the weights step 2's
    # update wrote.
    first = doc["first"]
    assert (first["kind"], first["op"], first["step"], first["phase"]) == ("nan", "aten.addmm.default", 3, "forward")
    assert text.splitlines()[first["location"]["line"] - 1].strip() == "h = torch.tanh(self.encoder(x))"
