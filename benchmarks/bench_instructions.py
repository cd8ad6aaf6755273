"""Instructions a step of ``bench_watch.py``'s small-ops loop executes, plain, fully traced and watched, counted by
valgrind's callgrind: a figure this machine's noise does not move (timed runs of the same build vary by up to 2x
here), for comparing one build of the full trace's per-op path with another.

Each run counts only the loop: the script waits at the loop's start until callgrind's instrumentation is switched
on (``callgrind_control``), and again at its end until the count is dumped, so start-up (importing torch) is left
out. A step's cost is (count of 2N steps - count of N steps) / N, which also leaves out the first steps' one-off
work (the optimizer's state, the tracer learning each op). Instructions are not time (the traced path's branches
and cache misses cost more per instruction), so the timed ratio (``bench_watch.py overhead --loop-only``) stays
the issue's measure; this one says where a change moved the work.

    .venv/bin/python benchmarks/bench_instructions.py [--steps 20] [--cache]

Every run hashes strings with the same seed (``PYTHONHASHSEED=0``): with a random one, a step's dict probes (and
so its count) vary by ~40k instructions from run to run. ``--cache`` also simulates this machine's caches (32 KiB
L1i, 48 KiB L1d, and its 1 MiB L2 as valgrind's last level) and prints their misses a step and an estimate of its
cycles: instructions + 10 per L1 miss + 40 per L2 miss (a rough weight; the misses are what it adds to
instructions: a step's cache traffic, the optimizer snapshot's copy among it).

Needs valgrind (``callgrind_control`` on the path); each run takes ~1-3 minutes under it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository root too
from benchmarks.bench_watch import SMALL

WAIT = """
import os
import time


def _wait(name):
    folder = os.environ["INSTRUCTIONS_DIR"]
    open(os.path.join(folder, name), "w").close()
    while not os.path.exists(os.path.join(folder, name + ".go")):
        time.sleep(0.05)
"""


def _script() -> str:
    """``SMALL`` with a pause before its loop and after it (before the loss is printed)."""
    source = SMALL.replace("start = time.process_time()\n", WAIT + '_wait("ready")\nstart = time.process_time()\n', 1)
    return source.replace('print(f"loss', '_wait("end")\nprint(f"loss', 1)


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


def _wait_for(path: Path, process: subprocess.Popen[bytes]) -> None:
    while not path.exists():
        if process.poll() is not None:
            sys.exit(f"the run ended before {path.name}: {process.stderr.read().decode() if process.stderr else ''}")
        time.sleep(0.2)


CACHES = ["--cache-sim=yes", "--I1=32768,8,64", "--D1=49152,12,64", "--LL=1048576,16,64"]


def _loop_events(command: list[str], folder: Path, *, cache: bool = False) -> dict[str, int]:
    """Callgrind's counts (``Ir``, and with ``cache`` its cache misses) of the loop alone, of one run of ``command``."""
    env = dict(os.environ, INSTRUCTIONS_DIR=str(folder), OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    out = folder / "callgrind.out"
    valgrind = ["valgrind", "--tool=callgrind", *(CACHES if cache else []), "--instr-atstart=no"]
    valgrind += [f"--callgrind-out-file={out}.%p", "-q"]
    with subprocess.Popen([*valgrind, *command], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as run:
        _wait_for(folder / "ready", run)
        _control("--instr=on", str(run.pid))
        _control("--zero", str(run.pid))
        (folder / "ready.go").touch()
        _wait_for(folder / "end", run)
        _control("--dump=loop", str(run.pid))
        _control("--instr=off", str(run.pid))
        (folder / "end.go").touch()
        run.wait()
    dumps = sorted(folder.glob("callgrind.out.*.1"))
    if not dumps:
        sys.exit(f"no callgrind dump in {folder}")
    text = dumps[0].read_text(encoding="utf-8", errors="replace")
    names = re.search(r"^events:\s+(.+)$", text, re.MULTILINE)
    found = re.search(r"^(?:summary|totals):\s+(.+)$", text, re.MULTILINE)
    if names is None or found is None:
        sys.exit(f"no counts in {dumps[0]}")
    return dict(zip(names.group(1).split(), (int(v) for v in found.group(1).split()), strict=False))


def _estimate(events: dict[str, float]) -> dict[str, float]:
    """L1 and L2 misses of a step, and its estimated cycles."""
    l1 = sum(events.get(k, 0) for k in ("I1mr", "D1mr", "D1mw"))
    l2 = sum(events.get(k, 0) for k in ("ILmr", "DLmr", "DLmw"))
    return {"l1": l1, "l2": l2, "cycles": events["Ir"] + 10 * l1 + 40 * l2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="N: runs of N and 2N steps")
    parser.add_argument("--cache", action="store_true", help="also simulate the caches (slower)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("needs valgrind (callgrind_control)")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train_small.py"
        script.write_text(_script(), encoding="utf-8")
        commands = {
            "plain": [sys.executable, str(script)],
            "fully traced": [sys.executable, "-m", "dtypecheck", "nan-trace", "-q", str(script), "--"],
            "watched": [sys.executable, "-m", "dtypecheck", "nan-trace", "-q", "--watch", str(script), "--"],
        }
        per_step: dict[str, dict[str, float]] = {}
        for name, command in commands.items():
            counts = []
            for steps in (args.steps, 2 * args.steps):
                folder = Path(tmp) / f"{name.replace(' ', '_')}-{steps}"
                folder.mkdir()
                counts.append(_loop_events([*command, str(steps), "0"], folder, cache=args.cache))
            step = {key: (counts[1][key] - counts[0][key]) / args.steps for key in counts[0]}
            per_step[name] = step
            loops = f"loops of {args.steps} and {2 * args.steps} steps"
            line = f"{name}: {step['Ir'] / 1e6:.2f}M instructions a step ({loops})"
            if args.cache:
                estimate = _estimate(step)
                line += (
                    f", {estimate['l1'] / 1e3:.1f}k L1 and {estimate['l2'] / 1e3:.1f}k L2 misses, "
                    f"~{estimate['cycles'] / 1e6:.2f}M cycles"
                )
            print(line)
        for name in ("fully traced", "watched"):
            ratio = per_step[name]["Ir"] / per_step["plain"]["Ir"]
            line = f"{name} / plain: {ratio:.3f}x in instructions"
            if args.cache:
                cycles = _estimate(per_step[name])["cycles"] / _estimate(per_step["plain"])["cycles"]
                line += f", {cycles:.3f}x in estimated cycles"
            print(line)


if __name__ == "__main__":
    main()
