"""What ``nan-trace --watch`` costs and whether it finds what a full trace finds (issue 19).

Three measurements, each a whole process (plain, watched, and where asked fully traced runs alternate back to
back, and medians are compared, since the machine's cores are shared):

- ``overhead``: a clean run, watched against plain: the transformer of ``bench_nantrace.py`` (4 steps) and a
  small model with many small ops (``--small-steps`` steps, 300 by default), where a full trace costs ~1.5x
  (~9x with ``DTYPECHECK_NATIVE_DISPATCH=0``). The target is <= 1.05x.
- ``late``: a NaN planted at step 200 of a 300-step run of the small model: watched and fully traced reports must
  name the same op, phase, module, step and line.
- ``memory``: the snapshot watch mode held (``watch.snapshot_bytes``) as a share of the model's parameters and
  the optimizer's states.

    .venv/bin/python benchmarks/bench_watch.py overhead --repeats 3
    .venv/bin/python benchmarks/bench_watch.py late
    .venv/bin/python benchmarks/bench_watch.py memory

``blocks`` times the same small model's steps in one process instead, in blocks of ``--small-steps`` steps,
plain and watched (``dtypecheck.trace(model, watch=True)``) alternating ``--repeats`` times, and prints the median
of the blocks' ratios: a process per run varies by up to 1.7x on a shared machine, more than the 5% measured. Each
watched block's first step (the one a run pays once: every module hooked until the outermost are known, the
snapshot allocated; ~1 ms) is timed apart and printed as its own figure.

    .venv/bin/python benchmarks/bench_watch.py blocks --repeats 60 --small-steps 50

``blocks --full`` times the full trace the same way; with ``DTYPECHECK_NATIVE=0`` it checks each op's outputs
with torch's ops instead of the C++ check (the pure-Python path):

    DTYPECHECK_NATIVE=0 .venv/bin/python benchmarks/bench_watch.py blocks --full --repeats 5 --small-steps 20
    .venv/bin/python benchmarks/bench_watch.py blocks --full --repeats 5 --small-steps 20

With ``DTYPECHECK_NATIVE_DISPATCH=0`` every op of the full trace goes through its Python dispatch mode, where by
default the C++ per-op path (``native/dispatch.cpp``) takes the ops it can; issue 30.5's figure is the loop alone,
on one thread (a second OpenMP thread spins while the tracer works, and its CPU seconds count):

    .venv/bin/python benchmarks/bench_watch.py overhead --loop-only --full --repeats 7 --threads 1
    DTYPECHECK_NATIVE_DISPATCH=0 .venv/bin/python benchmarks/bench_watch.py overhead --loop-only --full --threads 1

Each ``--loop-only`` line also gives the median of the runs' own ratios (each run against the plain run just before
it), steadier than a ratio of medians when the machine's speed drifts.

``overhead --compare SRC`` also times watch mode (and with ``--full`` the full trace) with another dtypecheck
checkout first on the path (the commit before a change), alternating with this one: before and after side by side
on the same cores. ``--loop-only`` times only the small model's loop (issue 30.5's figures):

    .venv/bin/python benchmarks/bench_watch.py overhead --loop-only --full --compare /tmp/base --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository root too
from benchmarks.bench_nantrace import WORKLOAD, _timed

SMALL = """
import sys
import time
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.norm(self.fc(x)))


torch.manual_seed(0)
steps, bad = int(sys.argv[1]), int(sys.argv[2])
model = torch.nn.Sequential(*(Block() for _ in range(12)), torch.nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
start = time.process_time()
for step in range(1, steps + 1):
    x = torch.randn(8, 32)
    if step == bad:
        x = x * 1e38
    loss = model(x).pow(2).mean()  # loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print(f"loss {loss.item():.6f}")
print(f"loop {time.process_time() - start:.4f}", file=sys.stderr)
"""


def _loop_seconds(command: list[str], threads: int | None, source: str | None = None) -> float:
    """The training loop's own CPU seconds (printed by the workload): the per-step cost, without start-up;
    ``source``: a dtypecheck checkout put first on the path."""
    import os

    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    # ``python -m`` puts the working folder first on the path: run the other checkout from its own folder.
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=source)
    lines = [line for line in done.stderr.splitlines() if line.startswith("loop ")]
    if done.returncode not in (0, 1) or not lines:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return float(lines[-1].split()[1])


def _nantrace(*args: str) -> list[str]:
    return [sys.executable, "-m", "dtypecheck", "nan-trace", "-q", *args]


def _ratio(name: str, plain: list[float], other: list[float], label: str) -> float:
    ratio = statistics.median(other) / statistics.median(plain)
    print(
        f"{name}: median plain {statistics.median(plain):.2f} s, {label} {statistics.median(other):.2f} s: {ratio:.3f}x"
    )
    return ratio


def overhead(
    folder: Path,
    repeats: int,
    small_steps: int,
    threads: int | None,
    full: bool,
    compare: str | None = None,
    *,
    loop: bool = True,
    whole: bool = True,
) -> None:
    encoder = folder / "train_encoder.py"
    encoder.write_text(WORKLOAD, encoding="utf-8")
    small = folder / "train_small.py"
    small.write_text(SMALL, encoding="utf-8")
    workloads = {
        "transformer, 4 steps": ([str(encoder)], ["4"]),
        f"small model, {small_steps} steps": ([str(small)], [str(small_steps), "0"]),
    }
    for name, (script, argv) in workloads.items() if whole else ():
        plain, watched, traced, other = [], [], [], []
        for _ in range(repeats):
            plain.append(_timed([sys.executable, *script, *argv], threads)[1])
            watched.append(_timed(_nantrace("--watch", *script, "--", *argv), threads)[1])
            if full:
                traced.append(_timed(_nantrace(*script, "--", *argv), threads)[1])
            if full and compare is not None:
                other.append(_timed(_nantrace(*script, "--", *argv), threads, compare)[1])
        print(
            f"{name}: CPU seconds plain {plain}, watched {watched}"
            + (f", traced {traced}" if full else "")
            + (f", traced with {compare} {other}" if other else "")
        )
        _ratio(f"{name} (whole process)", plain, watched, "watched (target <= 1.05x)")
        if full:
            _ratio(f"{name} (whole process)", plain, traced, "fully traced")
        if other:
            _ratio(f"{name} (whole process)", plain, other, f"fully traced with {compare}")
    if not loop:
        return
    # The loop alone: what a run of 40,000 steps pays per step, start-up (importing dtypecheck) left out.
    plain_loop, watched_loop, traced_loop, other_loop, other_watched = [], [], [], [], []
    traced_argv = _nantrace(str(small), "--", str(small_steps), "0")
    watched_argv = _nantrace("--watch", str(small), "--", str(small_steps), "0")
    for _ in range(repeats):
        plain_loop.append(_loop_seconds([sys.executable, str(small), str(small_steps), "0"], threads))
        watched_loop.append(_loop_seconds(watched_argv, threads))
        if compare is not None:
            other_watched.append(_loop_seconds(watched_argv, threads, compare))
        if full:
            traced_loop.append(_loop_seconds(traced_argv, threads))
        if full and compare is not None:
            other_loop.append(_loop_seconds(traced_argv, threads, compare))
    print(
        f"small model loop CPU seconds: plain {plain_loop}, watched {watched_loop}"
        + (f", traced {traced_loop}" if traced_loop else "")
        + (f", watched with {compare} {other_watched}" if other_watched else "")
        + (f", traced with {compare} {other_loop}" if other_loop else "")
    )
    _ratio(f"small model, {small_steps} steps (loop only)", plain_loop, watched_loop, "watched")
    _paired(plain_loop, watched_loop, "watched")
    if other_watched:
        _ratio(f"small model, {small_steps} steps (loop only)", plain_loop, other_watched, f"watched with {compare}")
    if traced_loop:
        _ratio(f"small model, {small_steps} steps (loop only)", plain_loop, traced_loop, "fully traced")
        _paired(plain_loop, traced_loop, "fully traced")
    if other_loop:
        _ratio(f"small model, {small_steps} steps (loop only)", plain_loop, other_loop, f"fully traced with {compare}")


def _paired(plain: list[float], other: list[float], label: str) -> None:
    ratios = [o / p for p, o in zip(plain, other, strict=True)]
    spread = f"{min(ratios):.2f}x-{max(ratios):.2f}x"
    print(f"  {label}: median of {len(ratios)} paired runs {statistics.median(ratios):.3f}x ({spread})")


def _report(command: list[str]) -> dict[str, object]:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return dict(json.loads(done.stdout))


def late(folder: Path) -> None:
    small = folder / "train_small.py"
    small.write_text(SMALL, encoding="utf-8")
    argv = ["--format", "json", str(small), "--", "300", "200"]
    full = _report(_nantrace(*argv))
    watched = _report(_nantrace("--watch", *argv))
    keys = ("kind", "op", "phase", "module", "step", "cause", "consequence")
    for name, doc in (("full trace", full), ("watch", watched)):
        first = doc["first"]
        assert isinstance(first, dict)
        location = first["location"]
        assert isinstance(location, dict)
        print(f"{name}: {', '.join(f'{k} {first[k]}' for k in keys)}, line {location['line']}; ops traced {doc['ops']}")
    same = all(full["first"][k] == watched["first"][k] for k in (*keys, "location"))  # type: ignore[index]
    print(f"watch summary: {watched['watch']}")
    print(f"same op, phase, module, step, cause, consequence and line: {same}")


def memory(folder: Path) -> None:
    import torch

    small = folder / "train_small.py"
    small.write_text(SMALL, encoding="utf-8")
    summary = _report(_nantrace("--watch", "--format", "json", str(small), "--", "20", "0"))["watch"]
    assert isinstance(summary, dict)
    # The same model, built here to count its bytes: AdamW keeps exp_avg and exp_avg_sq (each a parameter's size)
    # and a float32 step tensor per parameter.
    namespace: dict[str, object] = {}
    exec(SMALL.split("torch.manual_seed(0)", maxsplit=1)[0], namespace)  # our own workload text
    block = namespace["Block"]
    assert isinstance(block, type)
    model = torch.nn.Sequential(*(block() for _ in range(12)), torch.nn.Linear(32, 1))
    parameters = sum(p.nbytes for p in model.parameters())
    states = 2 * parameters + 4 * len(list(model.parameters()))
    # The snapshot puts each tensor on 64-byte lines of its own: a parameter's three copies and its step's one line.
    lines = sum(3 * -(-p.nbytes // 64) * 64 + 64 for p in model.parameters())
    padding = lines - (parameters + states)
    held = int(summary["snapshot_bytes"])
    rest = held - lines
    print(f"model parameters {parameters} B, AdamW states {states} B, watch snapshot {held} B")
    print(f"snapshot / (model + optimizer state) = {held / (parameters + states):.3f}")
    print(f"of which the lines' padding: {padding} B = {padding / (parameters + states):.4f}")
    print(f"and RNG state, changed buffers and the output's gradient: {rest} B = {rest / (parameters + states):.4f}")


def blocks(repeats: int, steps: int, threads: int | None, *, full: bool = False) -> None:
    """Watched (``full``: fully traced) against plain blocks of ``steps`` steps of ``SMALL``'s model, alternating
    in this process."""
    import time

    import torch

    import dtypecheck

    torch.set_num_threads(threads or 1)
    namespace: dict[str, object] = {}
    argv, sys.argv = sys.argv, [sys.argv[0], "0", "0"]
    try:
        exec(SMALL[: SMALL.index("start = time.process_time()")], namespace)  # the model and its optimizer
    finally:
        sys.argv = argv
    model: torch.nn.Module = namespace["model"]  # type: ignore[assignment]
    optimizer: torch.optim.Optimizer = namespace["optimizer"]  # type: ignore[assignment]

    def block(count: int = steps) -> float:
        start = time.process_time()
        for _ in range(count):
            model(torch.randn(8, 32)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        return time.process_time() - start

    block()  # warm-up
    ratios, firsts = [], []
    for _ in range(repeats):
        plain = block()
        with dtypecheck.trace(model, watch=not full):
            # A run's first step under watch is its dearer one (every module hooked until the outermost are known,
            # the snapshot allocated): timed apart, as a run of thousands of steps pays it once.
            firsts.append(block(1) - plain / steps)
            watched = block()
        ratios.append(watched / plain)
    what = "traced" if full else "watched"
    print(f"{repeats} blocks of {steps} steps, {what} / plain: median {statistics.median(ratios):.3f}x")
    first = statistics.median(firsts) * 1e3
    print(f"the first {what} step of each block, timed apart: {first:+.2f} ms over a plain step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("overhead", "late", "memory", "blocks"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small-steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for every run")
    parser.add_argument(
        "--full", action="store_true", help="overhead: also time a full trace; blocks: instead of watch"
    )
    parser.add_argument("--compare", metavar="SRC", default=None, help="overhead --full: also trace with checkout SRC")
    parser.add_argument("--no-loop", action="store_true", help="overhead: skip the loop-only measurement")
    parser.add_argument("--loop-only", action="store_true", help="overhead: only the small model's loop (issue 30.5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        if args.what == "overhead":
            overhead(
                folder,
                args.repeats,
                args.small_steps,
                args.threads,
                args.full,
                args.compare,
                loop=not args.no_loop,
                whole=not args.loop_only,
            )
        elif args.what == "blocks":
            blocks(args.repeats, args.small_steps, args.threads, full=args.full)
        elif args.what == "late":
            late(folder)
        else:
            memory(folder)


if __name__ == "__main__":
    main()
