"""Whole-process time of a clean CPU training loop under ``dtypecheck nan-trace`` against the plain run.

The workload (issue 4): a 4-layer transformer encoder, d_model 256, batch 16 x 128, AdamW. Plain and traced runs
alternate back to back (the machine's cores are shared), and the medians are compared; the target (issue 11) is
<= 1.5x. Both wall time and the child's CPU time (user + system) are reported: on shared cores the CPU-time ratio
is the steadier of the two.

``--ddp`` runs the same loop as 2 DDP ranks (gloo, CPU, one thread each): the plain run through
``torch.distributed.run``, the traced one through ``dtypecheck nan-trace --nproc 2``.

    .venv/bin/python benchmarks/bench_nantrace.py --steps 4 --repeats 3
    .venv/bin/python benchmarks/bench_nantrace.py --ddp --steps 4 --repeats 3

``--compare SRC`` also times the traced run with another checkout of dtypecheck first on ``PYTHONPATH`` (say the
commit before a change, ``git archive BASE | tar -x -C SRC``), alternating with this one, so that before and after
are measured side by side on the same loaded cores:

    .venv/bin/python benchmarks/bench_nantrace.py --steps 2 --repeats 5 --compare /tmp/base
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOAD = """
import sys
import time
import torch

torch.manual_seed(0)
steps = int(sys.argv[1])
layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(16, 128, 256)
start = time.process_time()
for _ in range(steps):
    optimizer.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
print(f"loop {time.process_time() - start:.4f}", file=sys.stderr)
print(f"loss {loss.item():.6f}")
"""

DDP_WORKLOAD = """
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
steps = int(sys.argv[1])
layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1, batch_first=True)
model = DistributedDataParallel(torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(8, 128, 256) + dist.get_rank()
for _ in range(steps):
    optimizer.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.6f}")
dist.destroy_process_group()
"""


def _commands(folder: Path, steps: int, ddp: bool) -> tuple[list[str], list[str]]:
    """(plain, traced) command lines."""
    from dtypecheck.nantrace.launch import free_port, launch_command

    script = folder / ("train_ddp.py" if ddp else "train_encoder.py")
    script.write_text(DDP_WORKLOAD if ddp else WORKLOAD, encoding="utf-8")
    if not ddp:
        plain = [sys.executable, str(script), str(steps)]
        return plain, [sys.executable, "-m", "dtypecheck", "nan-trace", "-q", str(script), "--", str(steps)]
    plain = [*launch_command(2, free_port(), [])[:-3], str(script), str(steps)]
    traced = [sys.executable, "-m", "dtypecheck", "nan-trace", "-q", "--nproc", "2", str(script), "--", str(steps)]
    return plain, traced


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], threads: int | None, source: str | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one whole process; ``source``: a dtypecheck checkout put first on its path."""
    wall, cpu, _ = _timed_with_loop(command, threads, source)
    return wall, cpu


def _timed_with_loop(command: list[str], threads: int | None, source: str | None) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, the training loop's own CPU seconds as the workload printed them; nan when it
    printed none) of one whole process."""
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    cpu_before = _cpu_of_children()
    start = time.perf_counter()
    # ``python -m`` puts the working folder first on the path: run the other checkout from its own folder.
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=source)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    loops = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("loop ")]
    return elapsed, _cpu_of_children() - cpu_before, float(loops[-1]) if loops else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="training steps per run (about 10 s plain)")
    parser.add_argument("--repeats", type=int, default=3, help="plain/traced pairs, alternating")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for both runs (default: torch's)")
    parser.add_argument("--ddp", action="store_true", help="2 DDP ranks (gloo) instead of one process")
    parser.add_argument("--compare", metavar="SRC", default=None, help="also trace with the dtypecheck checkout SRC")
    args = parser.parse_args()
    threads = 1 if args.ddp and args.threads is None else args.threads
    with tempfile.TemporaryDirectory() as folder:
        plain_cmd, traced_cmd = _commands(Path(folder), args.steps, args.ddp)
        plain, traced, plain_cpu, traced_cpu, other_cpu = [], [], [], [], []
        plain_loop, traced_loop, other_loop = [], [], []
        for repeat in range(args.repeats):
            if args.ddp:  # a fresh port for each launch
                plain_cmd, traced_cmd = _commands(Path(folder), args.steps, args.ddp)
            wall, cpu, loop = _timed_with_loop(plain_cmd, threads, None)
            plain.append(wall)
            plain_cpu.append(cpu)
            plain_loop.append(loop)
            wall, cpu, loop = _timed_with_loop(traced_cmd, threads, None)
            traced.append(wall)
            traced_cpu.append(cpu)
            traced_loop.append(loop)
            if args.compare is not None:
                _, cpu, loop = _timed_with_loop(traced_cmd, threads, args.compare)
                other_cpu.append(cpu)
                other_loop.append(loop)
            print(
                f"run {repeat + 1}: plain {plain[-1]:.2f} s ({plain_cpu[-1]:.2f} s CPU, loop {plain_loop[-1]:.2f}), "
                f"traced {traced[-1]:.2f} s ({traced_cpu[-1]:.2f} s CPU, loop {traced_loop[-1]:.2f})"
                + (
                    f", traced with {args.compare} {other_cpu[-1]:.2f} s CPU (loop {other_loop[-1]:.2f})"
                    if other_cpu
                    else ""
                ),
                flush=True,
            )
    cpu_ratio = statistics.median(traced_cpu) / statistics.median(plain_cpu)
    print(
        f"median CPU time plain {statistics.median(plain_cpu):.2f} s, traced {statistics.median(traced_cpu):.2f} s: "
        f"{cpu_ratio:.2f}x"
    )
    if other_cpu:
        other_ratio = statistics.median(other_cpu) / statistics.median(plain_cpu)
        print(f"median CPU time traced with {args.compare} {statistics.median(other_cpu):.2f} s: {other_ratio:.2f}x")
    if not args.ddp:  # the training loop alone (the script's own CPU clock), start-up and the report left out
        loop_ratio = statistics.median(traced_loop) / statistics.median(plain_loop)
        print(
            f"median loop CPU time plain {statistics.median(plain_loop):.2f} s, traced "
            f"{statistics.median(traced_loop):.2f} s: {loop_ratio:.2f}x"
            + (
                f"; traced with {args.compare} {statistics.median(other_loop):.2f} s: "
                f"{statistics.median(other_loop) / statistics.median(plain_loop):.2f}x"
                if other_loop
                else ""
            )
        )
    ratio = statistics.median(traced) / statistics.median(plain)
    print(
        f"median plain {statistics.median(plain):.2f} s, traced {statistics.median(traced):.2f} s: {ratio:.2f}x "
        f"wall (target <= 1.5x), {args.steps} steps{' on 2 DDP ranks' if args.ddp else ''}"
    )


if __name__ == "__main__":
    main()
