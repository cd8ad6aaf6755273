"""Checks that each need an interpreter of their own, run as forks of one fresh interpreter that imported torch once.

A check that runs in a child process because of what it may do to that process (exhaust its memory, die of SIGBUS,
import torch's dynamo for good) needs a process of its own, not a torch import of its own: ``import torch`` is
~2 CPU s, most of what such a child cost. ``run_each_forked`` starts one interpreter, runs a prelude in it (the
imports every check shares), then forks a child per check from that state: each check still has its own process,
memory, descriptors and exit, and none sees what another did.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

FORK_EACH = r"""
import atexit, json, os, signal, sys, tempfile, time

spec = json.loads(sys.argv[1])
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
exec(compile(spec["prelude"], "<prelude>", "exec"), namespace)
for code, argv in spec["checks"]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the check; then it ends as python -c ends, short of tearing its modules down (seconds of
            status = 1  # copy-on-write faults in a process that imported torch)
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.argv = argv
                exec(compile(code, "<check>", "exec"), namespace)
                status = 0
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            except BaseException:
                sys.excepthook(*sys.exc_info())
            finally:
                atexit._run_exitfuncs()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        deadline = time.monotonic() + spec["timeout"]
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            ended = None
        else:
            ended = os.waitstatus_to_exitcode(done[1])
        out.seek(0)
        err.seek(0)
        printed = [stream.read().decode(errors="replace") for stream in (out, err)]
        print(json.dumps([ended, *printed]), flush=True)
"""


@dataclass(frozen=True)
class Forked:
    """How one check's child ended."""

    returncode: int | None
    """Its exit code (negative: the signal that killed it), or None when it ran past the timeout and was killed."""
    stdout: str
    stderr: str


def run_each_forked(
    prelude: str,
    checks: Sequence[tuple[str, Sequence[str]]],
    *,
    timeout: float = 120,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> list[Forked]:
    """Run ``prelude`` once in a fresh ``python``, then each ``(code, argv)`` of ``checks`` in a child forked from
    it: ``code`` runs as ``__main__`` with the prelude's names and ``sys.argv = argv``, its stdout and stderr its
    own; the child ends as ``python -c`` would (an uncaught exception: its traceback and exit 1; ``atexit``
    handlers run and the streams are flushed) but without tearing its modules down, and is killed after ``timeout``
    seconds. One ``Forked`` per check, in order (none, and no process,
    for no checks)."""
    if not checks:
        return []
    spec = {"prelude": prelude, "checks": [[code, list(argv)] for code, argv in checks], "timeout": timeout}
    done = subprocess.run(
        [sys.executable, "-c", FORK_EACH, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=120 + timeout * len(checks),
        env=None if env is None else dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(lines) == len(checks), done.stdout[-2000:]
    return [Forked(*json.loads(line)) for line in lines]
