"""Whole-process time of a clean CPU training loop under ``dtypecheck nan-trace`` against the plain run.

The workload (issue 4): a 4-layer transformer encoder, d_model 256, batch 16 x 128, AdamW. Plain and traced runs
alternate back to back (the machine's cores are shared), and the medians are compared; the target is <= 2.5x.
Both wall time and the child's CPU time (user + system) are reported: on shared cores the CPU-time ratio is the
steadier of the two.

    .venv/bin/python benchmarks/bench_nantrace.py --steps 4 --repeats 3
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
import torch

torch.manual_seed(0)
steps = int(sys.argv[1])
layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(16, 128, 256)
for _ in range(steps):
    optimizer.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.6f}")
"""


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], threads: int | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one whole process."""
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    cpu_before = _cpu_of_children()
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed, _cpu_of_children() - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="training steps per run (about 10 s plain)")
    parser.add_argument("--repeats", type=int, default=3, help="plain/traced pairs, alternating")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for both runs (default: torch's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "train_encoder.py"
        script.write_text(WORKLOAD, encoding="utf-8")
        plain_cmd = [sys.executable, str(script), str(args.steps)]
        traced_cmd = [sys.executable, "-m", "dtypecheck", "nan-trace", "-q", str(script), "--", str(args.steps)]
        plain, traced, plain_cpu, traced_cpu = [], [], [], []
        for repeat in range(args.repeats):
            wall, cpu = _timed(plain_cmd, args.threads)
            plain.append(wall)
            plain_cpu.append(cpu)
            wall, cpu = _timed(traced_cmd, args.threads)
            traced.append(wall)
            traced_cpu.append(cpu)
            print(
                f"run {repeat + 1}: plain {plain[-1]:.2f} s ({plain_cpu[-1]:.2f} s CPU), "
                f"traced {traced[-1]:.2f} s ({traced_cpu[-1]:.2f} s CPU)",
                flush=True,
            )
    cpu_ratio = statistics.median(traced_cpu) / statistics.median(plain_cpu)
    print(
        f"median CPU time plain {statistics.median(plain_cpu):.2f} s, traced {statistics.median(traced_cpu):.2f} s: "
        f"{cpu_ratio:.2f}x"
    )
    ratio = statistics.median(traced) / statistics.median(plain)
    print(
        f"median plain {statistics.median(plain):.2f} s, traced {statistics.median(traced):.2f} s: {ratio:.2f}x "
        f"wall (target <= 2.5x), {args.steps} steps"
    )


if __name__ == "__main__":
    main()
