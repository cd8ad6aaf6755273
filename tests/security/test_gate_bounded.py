"""Issue 27, class 5: bounded time on any input.

One-line pickles read in time linear in the line (a 64 MiB line is read by ``Window.readline`` in well under a
second; the old reader copied the line so far for every 64 KiB block, 32 GiB of copying for that line), zero-filled
safetensors whose header length reads as a line-reading opcode pass as fast as the 0x58 control, a consolidated
side file is read in both readings, and a sparse 512 GiB file stops with one error line.
"""

from __future__ import annotations

import os
import re
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dtypecheck.loaders._io.mapped import MAX_HOLE_BYTES, LineTooLongError, Window, hole_bytes
from tests.conftest import CliResult
from tests.security.corpus import Hostile
from tests.security.gate import bounded
from tests.security.harness import one_error_line, prove_live, run_cli

LINE = 8 << 20
"""The tests' line length (the corpus's own is 160 MB, for benchmarks/hostile_corpus.py)."""
LONG_LINES = ("long-line-string-payload", "long-line-global", "long-line-persid")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Hostile]:
    return {h.name: h for h in bounded.build(tmp_path_factory.mktemp("bounded"), line_bytes=LINE)}


def test_the_long_line_payloads_are_live(built: dict[str, Hostile]) -> None:
    payloads = [built[name] for name in LONG_LINES]
    assert prove_live(payloads) == set(LONG_LINES)


@pytest.mark.parametrize("name", LONG_LINES)
def test_a_long_line_pickle_is_read_and_fails(
    name: str, built: dict[str, Hostile], cli: Callable[..., CliResult]
) -> None:
    hostile = built[name]
    assert hostile.canary is not None
    hostile.canary.unlink(missing_ok=True)  # the live proof may have made it
    assert Path(hostile.args[1]).stat().st_size > LINE
    result = cli(*hostile.args, "--format", "json")
    assert result.exit_code == 1, result.stderr
    fails = {f["detail"].split(" ")[0] for f in result.json()["findings"] if f["kind"] == "pickle-global"}
    assert "builtins.exec" in fails
    details = [f["detail"] for f in result.json()["findings"]]
    assert all(len(d) < 1000 for d in details)  # a GLOBAL naming 8 MiB is shown cut short
    assert not hostile.canary.exists()


def test_readline_is_linear_in_the_line() -> None:
    line = b"a" * (64 << 20) + b"\n" + b"rest"
    window = Window(line, 0, len(line))
    start = time.perf_counter()
    got = window.readline()
    elapsed = time.perf_counter() - start
    assert got == line[: (64 << 20) + 1]
    assert window.tell() == (64 << 20) + 1
    assert window.read() == b"rest"
    assert elapsed < 5, elapsed  # quadratic copying took minutes for this line


def test_readline_stops_at_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Window, "MAX_LINE", 1 << 20)
    data = b"P" + b"7" * (3 << 20)
    window = Window(data, 0, len(data))
    with pytest.raises(LineTooLongError, match="a line of over 1048576 bytes"):
        window.readline()
    short = Window(b"ab\ncd", 0, 5)
    assert (short.readline(), short.readline(), short.readline()) == (b"ab\n", b"cd", b"")
    assert Window(b"abcdef", 0, 6).readline(4) == b"abcd"


@pytest.mark.parametrize("length", [0x50, 0x58, 0x70])
def test_zero_filled_safetensors_pass(length: int, built: dict[str, Hostile], cli: Callable[..., CliResult]) -> None:
    hostile = built[f"zero-filled-header-{length:#x}"]
    raw = Path(hostile.args[1]).read_bytes()
    assert raw[0] == length  # P, X, p: the first opcode a pickle reader would see
    result = cli(*hostile.args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    (tensor,) = result.json()["tensors"]
    assert tensor["zeros"] == tensor["numel"] == LINE // 4
    assert result.json()["findings"] == []


def test_a_consolidated_side_file_passes(built: dict[str, Hostile], cli: Callable[..., CliResult]) -> None:
    hostile = built["consolidated-side-file"]
    result = cli(*hostile.args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert [t["name"] for t in result.json()["tensors"]] == ["w"]
    assert not [f for f in result.json()["findings"] if f["level"] != "ok"]


def test_a_sparse_512_gib_file_stops_with_one_error_line(built: dict[str, Hostile]) -> None:
    hostile = built["sparse-512GiB"]
    path = Path(hostile.args[1])
    status = path.stat()
    if status.st_blocks * 512 + MAX_HOLE_BYTES >= status.st_size:
        pytest.skip("this file system does not keep holes")
    start = time.monotonic()
    done = run_cli(hostile.args, timeout=120)
    assert time.monotonic() - start < 60
    assert done.returncode == 3
    assert one_error_line(done.stderr), done.stderr
    found = re.search(r"a sparse file: (\d+) of its (\d+) bytes are holes", done.stderr)
    assert found is not None, done.stderr
    holes, size = map(int, found.groups())
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
    assert size == status.st_size == 8 + length + (512 << 30)
    assert size - status.st_blocks * 512 <= holes <= size  # what is not allocated is a hole


def test_hole_bytes_counts_the_holes(tmp_path: Path) -> None:
    path = tmp_path / "holes"
    with path.open("wb") as out:
        out.write(b"x" * (1 << 20))
        out.seek(9 << 20)  # 8 MiB hole
        out.write(b"y" * (1 << 20))
        out.truncate(20 << 20)  # and 10 MiB at the end
    if path.stat().st_blocks * 512 > (4 << 20):
        pytest.skip("this file system does not keep holes")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert hole_bytes(fd, 20 << 20) == 18 << 20
    finally:
        os.close(fd)
