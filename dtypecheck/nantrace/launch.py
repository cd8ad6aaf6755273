"""``nan-trace --nproc N``: the same command, run by ``torch.distributed.run`` as N ranks on this machine (through
``torchrun.py``, which keeps the launcher's own failure report off stderr); and
``run_rank``, what each rank (of ``--nproc`` or of the user's own ``torchrun``) does.

The ranks merge their reports themselves (``distributed.py``); rank 0 writes the merged exit code to a file this
process reads, so the command exits with nan-trace's code (0, 1, 3) rather than the launcher's, and the ranks exit
0 so that the launcher does not add its own failure report to stderr.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from dtypecheck.launcher import RankInfo
    from dtypecheck.nantrace.options import RunSettings
    from dtypecheck.nantrace.report import NanTraceReport

EXIT_FILE_ENV = "DTYPECHECK_NANTRACE_EXIT_FILE"


def free_port() -> int:
    """A TCP port nothing listens on now (bound, read, released), for the launcher's store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launch_command(nproc: int, port: int, arguments: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dtypecheck.nantrace.torchrun",  # torch.distributed.run, without its own failure report
        "--nproc-per-node",
        str(nproc),
        "--nnodes",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "-m",
        "dtypecheck",
        "nan-trace",
        *arguments,
    ]


def launch_arguments(
    script: Path, script_args: list[str], flags: Mapping[str, object], switches: Mapping[str, bool]
) -> list[str]:
    """What each rank runs after ``dtypecheck nan-trace``: the script by its absolute path, the ``flags`` that were
    given (``{"--history": 5}``; None: not given, left to the rank's own config and defaults), the ``switches`` that
    are on, then ``--`` and the script's arguments."""
    arguments = [str(script.resolve())] + [f"{flag}={value}" for flag, value in flags.items() if value is not None]
    arguments += [flag for flag, on in switches.items() if on]
    return [*arguments, "--", *script_args]


def launch(nproc: int, arguments: list[str]) -> int:
    """Run ``dtypecheck nan-trace ARGUMENTS`` as ``nproc`` ranks; the merged run's exit code."""
    with tempfile.TemporaryDirectory(prefix="dtypecheck-nproc-") as folder:
        exit_file = Path(folder) / "exit-code"
        env = {**os.environ, EXIT_FILE_ENV: str(exit_file)}
        env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would set, without its banner
        done = subprocess.run(launch_command(nproc, free_port(), arguments), env=env, check=False)
        try:
            return int(exit_file.read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            return done.returncode or 3


def write_exit_code(code: int) -> bool:
    """Rank 0 of a ``--nproc`` run: hand the merged exit code to the launching command. Whether it was asked."""
    target = os.environ.get(EXIT_FILE_ENV)
    if not target:
        return False
    Path(target).write_text(f"{code}\n", encoding="utf-8")
    return True


def run_rank(
    info: RankInfo,
    path: Path,
    script_args: list[str],
    settings: RunSettings,
    *,
    to_text: Callable[[NanTraceReport], str],
    for_people: bool,
    output: Path | None,
    exit_code: Callable[[NanTraceReport], int],
    guard: Callable[[bool], AbstractContextManager[None]],
) -> NoReturn:
    """One rank of a torchrun run: trace the script, merge with the other ranks, and end the process.

    Rank 0 delivers the merged report: atomically to ``output``, else to the standard output this process started
    with (duplicated now: the merged report may be written from the watcher thread, while the script's stdout goes
    to stderr). ``exit_code(merged)`` is the run's code, handed to ``--nproc``'s launcher when it started the run.
    ``guard(captured)`` wraps the user's code (``captured``: its stdout goes to stderr). ``to_text(merged)`` is the
    rendered report (the caller's renderer: a core never imports render/); ``for_people``: it is a table, so rank
    0's script may keep its stdout."""
    from dtypecheck.nantrace.distributed import Session
    from dtypecheck.nantrace.runner import run_script
    from dtypecheck.output import write_atomically

    real_stdout = os.dup(1)

    def deliver(merged: NanTraceReport) -> int:
        code = exit_code(merged)
        if info.rank == 0:
            text = to_text(merged)
            if output is not None:
                write_atomically(output, text)
            else:
                os.write(real_stdout, text.encode())
        launched = write_exit_code(code) if info.rank == 0 else EXIT_FILE_ENV in os.environ
        return 0 if launched else code

    def end_process(code: int) -> NoReturn:
        # The script's process group and sharded model are still alive (a peer may be gone): tearing them down
        # can hang or crash, and the report is out.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)

    session = Session(info, deliver, end_process)
    captured = not for_people or info.rank != 0
    try:
        with guard(captured):
            report = run_script(path, script_args, settings, stdout=sys.stderr if captured else None, session=session)
    except BaseException:
        session.abandon()
        raise
    end_process(session.finish(report))
