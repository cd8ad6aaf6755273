"""Bytes that only look like a pickle to a reader that does not import: ``torch.load`` fails on them before any
code runs, so a scan says "not a checkpoint" (exit 3) rather than inventing findings (random bytes hit these
opcodes about once in 40 files of 4 KiB)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.conftest import CliResult

NOT_RUNNABLE = {
    # GLOBAL with names no import can resolve: pickle.load raises ModuleNotFoundError
    "unimportable global": b"cfoo bar\nbaz\x05qux\n.",
    # NEXT_BUFFER: torch.load passes no out-of-band buffers, so pickle.load raises there
    "out-of-band buffer": b"\x80\x05\x97.",
}


@pytest.mark.parametrize("name", sorted(NOT_RUNNABLE))
def test_bytes_torch_load_cannot_run_are_not_a_checkpoint(
    cli: Callable[..., CliResult], tmp_path: Path, name: str
) -> None:
    path = tmp_path / "random.bin"
    path.write_bytes(NOT_RUNNABLE[name])
    with pytest.raises(Exception) as raised:  # noqa: PT011  (what torch.load raises differs per case)
        torch.load(path, weights_only=False)
    assert not isinstance(raised.value, SystemExit)
    result = cli("scan-model", str(path))
    assert result.exit_code == 3, result.stdout
    assert result.stdout == ""
    assert result.stderr.startswith("error: ")
    assert "not a checkpoint" in result.stderr
    assert result.stderr.count("\n") == 1
