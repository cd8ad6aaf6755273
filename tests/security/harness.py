"""Running the CLI on hostile inputs the way a user (or CI) does, and proving a canary payload live."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROVE_LIVE = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("ignore")
    import torch
    import os
    for path in sys.argv[1:]:
        try:
            if os.path.isdir(path):  # a torch.distributed.checkpoint folder: dcp.load every item
                import torch.distributed.checkpoint as dcp
                meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
                wanted = {k: torch.zeros(v.size) if hasattr(v, "size") else None for k, v in meta.items()}
                dcp.load(wanted, checkpoint_id=path)
            else:
                torch.load(path, weights_only=False)
        except BaseException:
            pass
    """
)


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("DTYPECHECK_TRACEBACK", None)
    return env


def run_cli(
    args: tuple[str, ...] | list[str], timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m dtypecheck ARGS`` in a fresh process (raises ``subprocess.TimeoutExpired`` on a hang)."""
    return subprocess.run(
        [sys.executable, "-m", "dtypecheck", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment(),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def torch_load_all(paths: list[Path], timeout: float = 300) -> None:
    """``torch.load(path, weights_only=False)`` of each path in one throwaway process (errors ignored)."""
    subprocess.run(
        [sys.executable, "-c", PROVE_LIVE, *map(str, paths)],
        check=False,
        capture_output=True,
        timeout=timeout,
        env=environment(),
        stdin=subprocess.DEVNULL,
    )


def one_error_line(stderr: str) -> bool:
    """The contract's failure output: exactly one line, starting ``error: ``, and no traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    return len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr


def handled(returncode: int, stderr: str, expect: frozenset[int]) -> bool:
    """The contract for a hostile input: an allowed exit code, no traceback, and for errors exactly one line."""
    if returncode not in expect or "Traceback" in stderr:
        return False
    return returncode in (0, 1) or one_error_line(stderr)
