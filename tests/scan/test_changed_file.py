"""A checkpoint written to while it is scanned is an input error (exit 3), not a report mixing two versions.

Every read (``FileMap.pread``) checks afterwards that the file still has the size and modification time it had when
it was opened. The rewrites here set a modification time of their own (``os.utime``), as any later write does, so
the tests do not depend on the file system's timestamp granularity. (Truncation under a running process, which
with memory-mapped reads would be SIGBUS: ``tests/security/test_crashes.py``.)
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.errors import ExitCode, InputError, describe
from dtypecheck.loaders import open_checkpoint
from dtypecheck.scan import tensor as scan_tensor
from dtypecheck.scan.run import scan_checkpoint


def _checkpoint(path: Path) -> Path:
    x = np.random.default_rng(1).standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB
    save_file({"w": torch.from_numpy(x)}, str(path))
    return path


def _rewrite_in_place(path: Path) -> None:
    """New bytes over the old ones, same size (``open(..., 'r+b')``), and a later modification time."""
    size = path.stat().st_size
    with path.open("r+b") as handle:
        handle.seek(size // 2)
        handle.write(b"\x7f" * 4096)
    stamp = path.stat().st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(stamp, stamp))


def _truncate_and_write_back(path: Path) -> None:
    """What ``open(path, 'wb')`` and a new save of the same size do: the size is the old one again afterwards."""
    data = path.read_bytes()
    with path.open("wb") as handle:
        handle.write(data)
    stamp = path.stat().st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(stamp, stamp))


@pytest.mark.parametrize("change", [_rewrite_in_place, _truncate_and_write_back])
def test_a_read_after_the_file_changed_is_an_input_error(tmp_path: Path, change: object) -> None:
    path = _checkpoint(tmp_path / "w.safetensors")
    checkpoint = open_checkpoint(str(path))
    try:
        (record,) = checkpoint.records()
        readers = record.source.iter_readers(1 << 20, arrays=True)  # type: ignore[union-attr]
        read, _ = next(readers)
        first = read()
        assert first.nbytes == 1 << 20
        assert callable(change)
        change(path)
        read, _ = next(readers)
        with pytest.raises(InputError, match="written to while it was read"):
            read()
    finally:
        checkpoint.close()


def test_a_scan_whose_file_is_rewritten_midway_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _checkpoint(tmp_path / "w.safetensors")
    monkeypatch.setattr(scan_tensor, "KERNEL_CHUNK_BYTES", 256 * 1024)  # 16 chunks, at most 2 read ahead
    rewritten: list[int] = []

    def progress(done: int, total: int, name: str) -> None:
        if not rewritten:
            _rewrite_in_place(path)
            rewritten.append(done)

    with pytest.raises(InputError, match="changed during the scan") as caught:
        scan_checkpoint(str(path), workers=1, progress=progress)
    assert rewritten
    mapped = describe(caught.value)
    assert mapped is not None
    assert mapped[0] == ExitCode.INPUT_ERROR
    assert mapped[1].startswith(f"{path}: the file was written to")


def test_an_unchanged_file_scans_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same scan without the rewrite: every chunk read, the statistics numpy's."""
    path = _checkpoint(tmp_path / "w.safetensors")
    monkeypatch.setattr(scan_tensor, "KERNEL_CHUNK_BYTES", 256 * 1024)
    (scan,) = scan_checkpoint(str(path), workers=1).tensors
    x = np.random.default_rng(1).standard_normal((1024, 1024)).astype(np.float32)
    assert (scan.min, scan.max, scan.zeros) == (float(x.min()), float(x.max()), 0)
