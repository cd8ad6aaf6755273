"""The hostile corpus of issue 13, end to end: every input through the real CLI, each in its own process.

Builds the whole corpus (``tests/security/corpus.py``: malicious pickles, hidden pickles, polyglots, truncated,
oversized and malformed files, hostile user code; nothing is stored, everything is generated), runs
``python -m dtypecheck`` on each input in a subprocess with a timeout, and prints:

- **inputs tried**;
- **handled per contract**: an allowed exit code (0/1 for a report, 2 usage, 3 input error, 130 Ctrl-C) with,
  for errors, exactly one ``error:`` line and no traceback;
- **code executed**: canary files created by any payload during the scans (must be 0). Each code-carrying input
  would create its own canary file if anything in it ran;
- **canaries proven live**: the same inputs handed to ``torch.load(weights_only=False)`` (or ``dcp.load``) in a
  throwaway process, which does create the canary: the payloads are real, so "0 executed" means something;
- **crashes**: processes killed by a signal (SIGBUS, SIGSEGV...), and **hangs**: runs past the timeout;
- **peak memory** of the ``special-files`` class (FIFOs, sockets, devices and symlinks to ``/dev/zero`` where a
  scan reads a small file): the largest maximum resident set size of those runs, to stay <= 1 GiB.

    .venv/bin/python benchmarks/hostile_corpus.py [--timeout 120] [--keep DIR] [--only CLASS ...] [--code DIR]

``--code DIR`` runs another checkout's dtypecheck on the same corpus (``git archive COMMIT | tar -x -C DIR``), to
compare with an older commit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.security import corpus  # noqa: E402  (the corpus lives with the tests that use it)
from tests.security.harness import handled, run_hostile, torch_load_all  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a run counts as a hang")
    parser.add_argument("--keep", type=Path, help="build the corpus in DIR and keep it")
    parser.add_argument("--only", nargs="*", choices=corpus.CLASSES, help="only these classes")
    parser.add_argument("--code", type=Path, help="run the dtypecheck of this checkout instead of this one")
    options = parser.parse_args()
    if options.code is not None:
        os.environ["DTYPECHECK_CODE_UNDER_TEST"] = str(options.code.resolve())
    folder = options.keep or Path(tempfile.mkdtemp(prefix="dtypecheck-hostile-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        run(folder, tuple(options.only or corpus.CLASSES), options.timeout)
    finally:
        if options.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


def run(folder: Path, classes: tuple[str, ...], timeout: float) -> None:
    started = time.monotonic()
    inputs = corpus.build(folder, classes)
    print(f"built {len(inputs)} inputs in {time.monotonic() - started:.1f} s under {folder}", flush=True)
    tally = {"handled": 0, "crashes": 0, "hangs": 0, "executed": 0}
    per_class: dict[str, list[int]] = {}
    for hostile in inputs:
        try:
            returncode, stderr, seconds = run_hostile(hostile, timeout)
        except subprocess.TimeoutExpired:
            tally["hangs"] += 1
            per_class.setdefault(hostile.klass, [0, 0])[0] += 1
            print(f"HANG    {hostile.klass:15} {hostile.name} (over {timeout:.0f} s)", flush=True)
            continue
        good = handled(returncode, stderr, hostile.expect)
        crashed = returncode < 0
        executed = hostile.canary is not None and hostile.canary.exists()
        tally["handled"] += good
        tally["crashes"] += crashed
        tally["executed"] += executed
        counts = per_class.setdefault(hostile.klass, [0, 0])
        counts[0] += 1
        counts[1] += good
        state = "CRASH" if crashed else "RAN" if executed else "ok" if good else "BAD"
        last = stderr.strip().splitlines()[-1][:110] if stderr.strip() else ""
        line = f"{state:7} {hostile.klass:15} {hostile.name:34} exit {returncode:>4} {seconds:6.1f} s  {last}"
        print(line, flush=True)
    peaks = [peak_rss(h, timeout) for h in inputs if h.klass == "special-files"]
    carriers = [h for h in inputs if h.canary is not None]
    for hostile in carriers:
        if hostile.canary is not None:
            hostile.canary.unlink(missing_ok=True)
    provable = [h for h in carriers if h.torch_load is not None]
    torch_load_all([h.torch_load for h in provable if h.torch_load is not None], timeout=600)
    dead = [h.name for h in provable if h.canary is not None and not h.canary.exists()]
    live = len(provable) - len(dead)
    print()
    for klass in classes:
        tried, passed = per_class.get(klass, [0, 0])
        print(f"  {klass:15} {passed}/{tried} handled")
    print(f"inputs tried:          {len(inputs)}")
    print(f"handled per contract:  {tally['handled']}")
    print(f"code executed:         {tally['executed']} (canaries created by the scans; must be 0)")
    print(f"code-carrying inputs:  {len(carriers)} (each with its own canary; damaged copies share one)")
    print(f"canaries proven live:  {live} of {len(provable)} under torch.load(weights_only=False) / dcp.load")
    if dead:
        print(f"  not run by torch: {', '.join(dead)}")
        print("  (torch reads one copy of a duplicated entry; __main__.evil does not exist in a plain process)")
    if peaks:
        print(
            f"peak memory:           {max(peaks) / 1024:.0f} MiB (largest max RSS of {len(peaks)} special-files runs)"
        )
    print(f"crashes:               {tally['crashes']}")
    print(f"hangs:                 {tally['hangs']} (timeout {timeout:.0f} s)")
    print(f"total time:            {time.monotonic() - started:.0f} s")


MEASURE = """
import resource, subprocess, sys
try:
    subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                   check=False, timeout=float(sys.argv[1]))  # killed on timeout: a hang still has its peak
except subprocess.TimeoutExpired:
    pass
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""
"""Run a command from a small launcher and print its children's max RSS (KiB). A child forked straight from this
script would count the pages it shared with it before ``exec`` (Linux keeps the high-water mark across ``exec``),
which after building the corpus are over a GiB that the scan never used."""


def peak_rss(hostile: corpus.Hostile, timeout: float) -> int:
    """The maximum resident set size of one run, in KiB."""
    from tests.security.harness import code_under_test, environment

    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(timeout), sys.executable, "-m", "dtypecheck", *hostile.args],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        env=environment(),
        cwd=code_under_test(),
        check=False,
    )
    return int(done.stdout.strip() or 0)


if __name__ == "__main__":
    main()
