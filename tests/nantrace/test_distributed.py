"""nan-trace on 2-process runs (gloo on CPU): torchrun and --nproc, DDP and FSDP2, one merged report, no hang.

Each run is bounded by a subprocess timeout far below gloo's 30-minute collective timeout: a rank left waiting
for a stopped peer would fail the test instead of passing late.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dtypecheck.launcher import RankInfo, rank_info
from dtypecheck.nantrace.distributed import merge
from dtypecheck.nantrace.report import Event, NanTraceReport, ValueCounts
from tests.nantrace._ranks import DDP, DDP_STEPS, FSDP, nproc, torchrun
from tests.nantrace._scripts import NanTrace, line_of


def _torchrun(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return torchrun("nan-trace", "--format", "json", str(script), "--", *args)


def test_torchrun_ddp_nan_born_on_rank_1_is_named_once_and_every_rank_stops(nantrace: NanTrace) -> None:
    script, text = nantrace.write("ddp.py", DDP)
    done = _torchrun(script, "data")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)  # rank 0's stdout holds the merged document only
    assert (doc["status"], doc["world_size"]) == ("nonfinite", 2)
    first = doc["first"]
    assert (first["rank"], first["kind"], first["op"], first["module"]) == (1, "nan", "aten.log.default", None)
    assert first["location"]["line"] == line_of(text, "rank 1 data")
    assert (first["step"], first["cause"], first["consequence"]) == (3, "invalid_math", "loss")
    assert [(r["rank"], r["status"]) for r in doc["ranks"]] == [(0, "clean"), (1, "nonfinite")]
    assert "finished" not in done.stderr  # neither rank ran on to the end of the script


@pytest.mark.parametrize("mode", ["grad", "grad-slow"])
def test_a_gradient_nan_averaged_into_rank_0_is_blamed_on_rank_1(nantrace: NanTrace, mode: str) -> None:
    # grad-slow: rank 1's report stops rank 0 before its update has read the gradients DDP averaged; the op that
    # the stop comes at is judged first, so rank 0 still says they arrived through the collective.
    script, text = nantrace.write("ddp.py", DDP)
    done = nproc(nantrace, script, "--", mode)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    first = doc["first"]
    # sqrt's gradient at 0 is born infinite in rank 1's backward; DDP's all-reduce hands it to rank 0.
    assert (first["rank"], first["kind"], first["op"], first["phase"]) == (1, "inf", "aten.div.Tensor", "backward")
    assert first["location"]["line"] == line_of(text, "rank 1 grad")
    assert (first["cause"], first["consequence"], first["step"]) == ("invalid_math", "parameter", 3)
    arrived = [e for e in doc["events"] if e["rank"] == 0]
    assert arrived
    assert {e["cause"] for e in arrived} == {"collective"}


def test_a_clean_ddp_run_through_nproc_exits_0(nantrace: NanTrace) -> None:
    script, _ = nantrace.write("ddp.py", DDP)
    done = nproc(nantrace, script)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["status"], doc["first"], doc["world_size"], doc["steps"]) == ("clean", None, 2, DDP_STEPS)
    assert [(r["rank"], r["status"], r["steps"]) for r in doc["ranks"]] == [
        (0, "clean", DDP_STEPS),
        (1, "clean", DDP_STEPS),
    ]
    assert done.stderr.count("finished") == 2  # both ranks ran to the end (their prints may interleave)


def test_fsdp2_nan_on_rank_1_and_a_clean_fsdp2_run(nantrace: NanTrace) -> None:
    script, text = nantrace.write("fsdp.py", FSDP)
    # The two launches are independent (each its own store port and ranks): run side by side, they overlap the
    # waits of their 3 processes each.
    with ThreadPoolExecutor(2) as pool:
        failing = pool.submit(nproc, nantrace, script, "--", "data")
        clean = pool.submit(nproc, nantrace, script)
        done = failing.result()
    assert done.returncode == 1, done.stderr
    first = json.loads(done.stdout)["first"]
    assert (first["rank"], first["op"], first["step"]) == (1, "aten.log.default", 2)
    assert first["location"]["line"] == line_of(text, "rank 1 data")
    done = clean.result()
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["status"], doc["handled"], doc["warnings"]) == ("clean", [], [])


def _event(rank: int, step: int, cause: str, op_index: int) -> Event:
    return Event(
        kind="nan",
        phase="backward",
        op=f"op{rank}",
        grad_fn=None,
        module=None,
        dtype="float32",
        location=None,
        counts=ValueCounts(1, 0, 0, 0, 0),
        absmax=0.0,
        limit=1.0,
        cause=cause,  # type: ignore[arg-type]
        step=step,
        op_index=op_index,
        rank=rank,
    )


def test_merge_prefers_a_birth_over_an_arrival_then_the_earliest_step() -> None:
    arrival = _event(0, 2, "collective", 5)
    birth = _event(1, 2, "invalid_math", 90)
    later = _event(0, 3, "input", 1)
    reports: dict[int, NanTraceReport | None] = {
        0: NanTraceReport("nonfinite", arrival, (), ops=10, steps=2, events=(arrival, later)),
        1: NanTraceReport("nonfinite", birth, (), ops=20, steps=2, events=(birth,)),
        2: None,
    }
    merged = merge(reports, 3)
    assert merged.first == birth
    assert merged.events == (birth, later, arrival)
    assert (merged.ops, merged.steps, merged.world_size) == (30, 2, 3)
    assert [(r.rank, r.status) for r in merged.ranks] == [(0, "nonfinite"), (1, "nonfinite"), (2, "missing")]
    assert merged.notes == ("no report arrived from rank(s) 2",)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "29500"}, None),
        (
            {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
            RankInfo(1, 2, "10.0.0.1", 29500, "none/0"),
        ),
        ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}, None),
    ],
)
def test_rank_info_reads_the_launchers_environment(environ: dict[str, str], expected: RankInfo | None) -> None:
    assert rank_info(environ) == expected


def test_nproc_runs_scripts_only(nantrace: NanTrace, cli: Any, tmp_path: Path) -> None:
    factory = "import torch\ndef make():\n    return torch.nn.Linear(2, 2), torch.ones(2)\n"
    script, _ = nantrace.write("f.py", factory)
    result = cli("nan-trace", f"{script}:make", "--nproc", "2")
    assert result.exit_code == 2
    assert "--nproc runs a script" in result.stderr
    result = cli("nan-trace", str(tmp_path / "absent.py"), "--nproc", "2")
    assert (result.exit_code, result.stdout) == (3, "")
    assert result.stderr == f"error: no such file: {tmp_path / 'absent.py'}\n"
    assert cli("nan-trace", str(script), "--nproc", "0").exit_code == 2


RAISES_ON_A_RANK = """
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise RuntimeError("rank 1 gave up")  # raises
dist.barrier()
"""


def test_a_script_that_raises_on_a_rank_gives_that_ranks_line_and_exit_3(nantrace: NanTrace) -> None:
    """Not torchrun's failure report (its agent's log lines, a ChildFailedError traceback and a table of exit
    codes: ~40 lines) nor its exit 1: the contract's exit 3 and the failing rank's own ``error:`` line. Rank 0, left
    waiting in the barrier, either is ended by the launcher or says on a line of its own that its peer went away."""
    script, text = nantrace.write("raises.py", RAISES_ON_A_RANK)
    done = nproc(nantrace, script)
    assert (done.returncode, done.stdout) == (3, "")
    line = line_of(text, "raises")
    lines = done.stderr.splitlines()
    assert (
        f"error: rank 1: raises.py raised RuntimeError: rank 1 gave up (at line {line} in <module>; --traceback "
        "shows the traceback)"
    ) in lines
    assert len(lines) <= 2
    assert all(one.startswith("error: rank ") for one in lines), lines


def test_the_launcher_failing_itself_is_one_line_and_exit_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch.distributed.run

    from dtypecheck.nantrace import torchrun as launcher

    def failing(args: Any) -> None:
        raise RuntimeError("rendezvous timed out\nafter 900 s")

    monkeypatch.setattr(torch.distributed.run, "run", failing)
    assert launcher.main(["--nproc-per-node", "2", "-m", "dtypecheck", "nan-trace", "x.py"]) == 3
    assert capsys.readouterr().err == "error: the launcher of the ranks failed: RuntimeError: rendezvous timed out\n"
