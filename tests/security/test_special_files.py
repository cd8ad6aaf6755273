"""Class "special-files": a FIFO, socket or device (or a symlink to one) where a scan reads a file is refused
before it is opened: exit 3 with one line, at once, and without reading /dev/zero's endless bytes."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from dtypecheck.errors import InputError
from dtypecheck.loaders._io.regular import read_regular_file
from tests.conftest import CliResult
from tests.security import corpus
from tests.security.harness import handled, one_error_line, run_hostile


def test_every_special_file_is_refused_with_one_line(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    inputs = corpus.build(tmp_path, ("special-files",))
    assert len(inputs) >= 7  # the socket case needs an AF_UNIX path short enough
    for hostile in inputs:
        result = cli(*hostile.args)
        assert result.exit_code == 3, (hostile.name, result.stderr)
        assert one_error_line(result.stderr), (hostile.name, result.stderr)
        assert "not a regular file" in result.stderr, (hostile.name, result.stderr)


def test_in_a_fresh_process_nothing_hangs(tmp_path: Path) -> None:
    """Through the real CLI: a FIFO nobody writes to would block an open() or a read() forever."""
    for hostile in corpus.build(tmp_path, ("special-files",)):
        returncode, stderr, seconds = run_hostile(hostile, timeout=60)
        assert handled(returncode, stderr, hostile.expect), (hostile.name, stderr)
        assert seconds < 60


def test_read_regular_file_checks_its_cap_before_reading(tmp_path: Path) -> None:
    small = tmp_path / "small.json"
    small.write_bytes(b"{}")
    assert read_regular_file(small, 2) == b"{}"
    with pytest.raises(InputError, match=r"small.json: index file larger than 1 bytes"):
        read_regular_file(small, 1, "index file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="a FIFO, not a regular file"):
        read_regular_file(fifo, 1 << 20)
    link = tmp_path / "zero"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputError, match="a device, not a regular file"):
        read_regular_file(link, 1 << 20)


def test_a_dangling_symlink_beside_the_weights_is_not_an_error(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    """An interrupted Hugging Face download leaves links to missing blobs: nothing torch.load could read."""
    corpus._safetensors_weights(tmp_path / "model.safetensors")
    (tmp_path / "optimizer.pt").symlink_to(tmp_path / "missing-blob")
    result = cli("scan-model", str(tmp_path), "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["findings"] == []
