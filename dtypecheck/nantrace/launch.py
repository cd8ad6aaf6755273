"""``nan-trace --nproc N``: the same command, run by ``torch.distributed.run`` as N ranks on this machine.

The ranks merge their reports themselves (``distributed.py``); rank 0 writes the merged exit code to a file this
process reads, so the command exits with nan-trace's code (0, 1, 3) rather than the launcher's, and the ranks exit
0 so that the launcher does not add its own failure report to stderr.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

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
        "torch.distributed.run",
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
