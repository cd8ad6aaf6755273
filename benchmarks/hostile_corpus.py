"""The hostile corpus end to end: every input through the real CLI, each in its own process, one table per class.

Builds the whole corpus (``tests/security/corpus.py`` and, for issue 27's classes, ``tests/security/gate/``:
malicious and hidden pickles, polyglots, shipped configs, numbers behind bookkeeping names, inputs that once hung or
gave a traceback, and benign files as frameworks really write them; nothing is stored, everything is generated),
runs ``python -m dtypecheck`` on each input in a subprocess with a timeout, proves every payload live in a
throw-away process (``torch.load(weights_only=False)``, ``torch.jit.load`` or ``dcp.load``, from the working folder
the payload needs), and prints per class:

- **inputs**, and **held**: an allowed exit code (0/1 for a report, 2 usage, 3 input error, 130 Ctrl-C) with, for
  errors, exactly one ``error:`` line and no traceback;
- **live**: payloads whose canary the proof creates, and **live passed**: those the default gate let through with
  exit 0 (must be 0); **missed**: other inputs that must be flagged (exit 1) and were not;
- **ran**: canaries created by the scans themselves (code executed; must be 0);
- **hangs** (past ``--timeout``), **tracebacks** (dtypecheck's own: a user factory that raises shows its own
  frames above the ``error:`` line, as the README says, and that is held), **crashes** (killed by a signal);
- **false alarms**: benign inputs (``benign=True``) that did not get their expected exit code;
- **peak RSS**: the largest maximum resident set size of the class's runs.

    .venv/bin/python benchmarks/hostile_corpus.py [--timeout 60] [--keep DIR] [--only CLASS ...] [--code DIR]
    .venv/bin/python benchmarks/hostile_corpus.py --gate      # issue 27's classes only

``--code DIR`` runs another checkout's dtypecheck on the same corpus (``git archive COMMIT | tar -x -C DIR``), to
give the same table before a change.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.security import corpus  # noqa: E402  (the corpus lives with the tests that use it)
from tests.security.harness import (  # noqa: E402
    code_under_test,
    environment,
    prove_live,
    read_stderr,
    run_hostile,
)

ALL_CLASSES = (*corpus.CLASSES, *corpus.GATE_CLASSES)

MEASURED_RUN = """
import json, resource, subprocess, sys, time
start = time.monotonic()
try:
    done = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          check=False, timeout=float(sys.argv[1]))
    code, err = done.returncode, done.stderr.decode("utf-8", "replace")
except subprocess.TimeoutExpired:
    code, err = None, ""
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"code": code, "stderr": err, "rss": rss, "seconds": time.monotonic() - start}))
"""
"""Run the CLI from a small launcher: its exit code, stderr, and its children's max RSS (KiB). A child forked
straight from this script would count the pages it shared with it before ``exec`` (Linux keeps the high-water mark
across ``exec``), which after building the corpus are over a GiB that the scan never used."""


@dataclass
class Tally:
    inputs: int = 0
    held: int = 0
    live: int = 0
    live_passed: int = 0
    missed: int = 0
    ran: int = 0
    hangs: int = 0
    tracebacks: int = 0
    crashes: int = 0
    benign: int = 0
    false_alarms: int = 0
    peak_kib: int = 0
    names: dict[str, list[str]] = field(default_factory=dict)

    def note(self, what: str, name: str) -> None:
        self.names.setdefault(what, []).append(name)


@dataclass(frozen=True)
class Outcome:
    code: int | None
    """The exit code; None for a hang."""
    stderr: str
    rss_kib: int
    seconds: float


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a run counts as a hang")
    parser.add_argument("--keep", type=Path, help="build the corpus in DIR and keep it")
    parser.add_argument("--only", nargs="*", choices=ALL_CLASSES, help="only these classes")
    parser.add_argument("--gate", action="store_true", help="issue 27's classes only")
    parser.add_argument("--code", type=Path, help="run the dtypecheck of this checkout instead of this one")
    parser.add_argument("--json", type=Path, help="also write the per-class table to this file")
    options = parser.parse_args()
    if options.code is not None:
        os.environ["DTYPECHECK_CODE_UNDER_TEST"] = str(options.code.resolve())
    classes = tuple(options.only or (corpus.GATE_CLASSES if options.gate else ALL_CLASSES))
    folder = options.keep or Path(tempfile.mkdtemp(prefix="dtypecheck-hostile-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        tallies = run(folder, classes, options.timeout)
    finally:
        if options.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    if options.json is not None:
        options.json.write_text(json.dumps({k: {f: getattr(t, f) for f in FIELDS} for k, t in tallies.items()}))


def measured(hostile: corpus.Hostile, timeout: float) -> Outcome:
    """One run of the CLI on ``hostile``, with its peak memory where no driver is needed."""
    if hostile.driver:
        try:
            code, stderr, seconds = run_hostile(hostile, timeout)
        except subprocess.TimeoutExpired:
            return Outcome(None, "", 0, timeout)
        return Outcome(code, stderr, 0, seconds)
    done = subprocess.run(
        [sys.executable, "-c", MEASURED_RUN, str(timeout), sys.executable, "-m", "dtypecheck", *hostile.args],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        env=environment(),
        cwd=hostile.cwd or code_under_test(),
        check=False,
    )
    result = json.loads(done.stdout)
    return Outcome(result["code"], result["stderr"], int(result["rss"]), float(result["seconds"]))


def run(folder: Path, classes: tuple[str, ...], timeout: float) -> dict[str, Tally]:
    started = time.monotonic()
    inputs = corpus.build(folder, classes)
    print(f"built {len(inputs)} inputs in {time.monotonic() - started:.1f} s under {folder}", flush=True)
    for hostile in inputs:  # a canary left by an earlier run would count as code run by this one
        if hostile.canary is not None:
            hostile.canary.unlink(missing_ok=True)
    outcomes: dict[str, Outcome] = {}
    for hostile in inputs:
        outcome = measured(hostile, timeout)
        outcomes[hostile.name] = outcome
        stderr = read_stderr(outcome.stderr)
        if outcome.code is None:
            state = "HANG"
        elif outcome.code < 0:
            state = "CRASH"
        else:
            state = "ok" if stderr.handled(outcome.code, hostile.expect) else "BAD"
        last = stderr.last[:100]
        code = "-" if outcome.code is None else str(outcome.code)
        print(f"{state:6} {hostile.klass:17} {hostile.name:40} exit {code:>4} {outcome.seconds:6.1f} s  {last}")
    ran = {h.name for h in inputs if h.canary is not None and h.canary.exists()}
    live = prove_live(inputs, timeout=max(600.0, timeout))
    tallies = {klass: Tally() for klass in classes}
    for hostile in inputs:
        tally, outcome = tallies[hostile.klass], outcomes[hostile.name]
        tally.inputs += 1
        tally.peak_kib = max(tally.peak_kib, outcome.rss_kib)
        if outcome.code is None:
            tally.hangs += 1
            tally.note("hangs", hostile.name)
            continue
        stderr = read_stderr(outcome.stderr)
        users_own = not stderr.own_traceback and stderr.last.startswith("error: ")  # the user's code raised
        tally.held += stderr.handled(outcome.code, hostile.expect) or (users_own and outcome.code in hostile.expect)
        tally.crashes += outcome.code < 0
        if stderr.own_traceback:
            tally.tracebacks += 1
            tally.note("tracebacks", hostile.name)
        if hostile.name in ran:
            tally.ran += 1
            tally.note("ran", hostile.name)
        if hostile.name in live:
            tally.live += 1
            if outcome.code == 0:
                tally.live_passed += 1
                tally.note("live passed", hostile.name)
        elif 0 not in hostile.expect and outcome.code == 0:
            tally.missed += 1
            tally.note("missed", hostile.name)
        if hostile.benign:
            tally.benign += 1
            if outcome.code not in hostile.expect:
                tally.false_alarms += 1
                tally.note("false alarms", hostile.name)
    unproven = [h.name for h in inputs if h.canary and h.torch_load and h.loader != "none" and h.name not in live]
    report(tallies, unproven, time.monotonic() - started, timeout)
    return tallies


FIELDS = (
    "inputs", "held", "live", "live_passed", "missed", "ran", "hangs", "tracebacks", "crashes", "benign",
    "false_alarms", "peak_kib",
)  # fmt: skip


def report(tallies: dict[str, Tally], unproven: list[str], took: float, timeout: float) -> None:
    heads: tuple[str, ...] = (
        "class",
        "inputs",
        "held",
        "live",
        "live passed",
        "missed",
        "ran",
        "hangs",
        "tracebacks",
        "crashes",
    )
    heads = (*heads, "benign", "false alarms", "peak RSS")
    print()
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    total = Tally()
    for klass, tally in tallies.items():
        row = [getattr(tally, f) for f in FIELDS[:-1]]
        print(f"| {klass} | " + " | ".join(map(str, row)) + f" | {tally.peak_kib / 1024:.0f} MiB |")
        for f in FIELDS[:-1]:
            setattr(total, f, getattr(total, f) + getattr(tally, f))
        total.peak_kib = max(total.peak_kib, tally.peak_kib)
    row = [getattr(total, f) for f in FIELDS[:-1]]
    print("| **all** | " + " | ".join(map(str, row)) + f" | {total.peak_kib / 1024:.0f} MiB |")
    print()
    for klass, tally in tallies.items():
        for what, names in tally.names.items():
            print(f"  {klass}: {what}: {', '.join(names)}")
    if unproven:
        print(f"  carry a canary but torch did not run it: {', '.join(unproven)}")
    print(f"hang timeout {timeout:.0f} s; total time {took:.0f} s")


if __name__ == "__main__":
    main()
