"""Class "hangs": inputs that cost seconds to write must not cost hours or gigabytes to scan."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dtypecheck.scan.tensor import TensorScanner
from tests.conftest import CliResult
from tests.security import corpus
from tests.security.harness import handled, run_hostile


@pytest.fixture(scope="module")
def hangs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, corpus.Hostile]:
    folder = tmp_path_factory.mktemp("hostile")
    return {h.name: h for h in corpus.hang_inputs(folder, aliases=ALIASES, views=VIEWS, empty=EMPTY)}


ALIASES, VIEWS, EMPTY = 100_000, 20_000, 260_000  # the benchmark scans the attack's sizes (1M, 100k, 1.4M)


def test_a_hundred_thousand_names_of_one_tensor_are_scanned_once(
    hangs: dict[str, corpus.Hostile], cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks: list[int] = []
    process = TensorScanner.process

    def counted(self: TensorScanner, chunk: object) -> object:
        chunks.append(1)
        return process(self, chunk)  # type: ignore[arg-type]

    monkeypatch.setattr(TensorScanner, "process", counted)
    for name, more in (("million-aliases", ALIASES + 1 - 16), ("rebuilt-views", VIEWS - 16)):  # t0 + ALIASES keys
        chunks.clear()
        result = cli(*hangs[name].args, "-f", "json")
        assert result.exit_code == 0, result.stderr
        document = result.json()
        assert len(document["tensors"]) == 16  # MAX_ALIASES names listed, each with the same statistics
        assert {t["max"] for t in document["tensors"]} == {1.0}
        aliases = [f for f in document["findings"] if f["kind"] == "aliases"]
        assert [f["detail"].split()[0] for f in aliases] == [str(more)]
        assert aliases[0]["level"] == "warn"
        assert len(chunks) == 1  # 16 names, one read of the data


def test_views_that_claim_far_more_than_the_file_are_refused(
    hangs: dict[str, corpus.Hostile], cli: Callable[..., CliResult]
) -> None:
    result = cli(*hangs["stride0-views"].args)
    assert result.exit_code == 3
    assert "its tensors claim 83936070000 bytes in all" in result.stderr  # 5000 * (2**22 + mean index) * 4


def test_headers_listing_millions_of_tensors_are_refused(
    hangs: dict[str, corpus.Hostile], cli: Callable[..., CliResult]
) -> None:
    result = cli(*hangs["empty-tensors"].args)
    assert result.exit_code == 3
    assert f"{EMPTY} tensors in one file, over the 250000 limit" in result.stderr


def test_a_huge_gguf_row_is_dequantized_in_bounded_runs(
    hangs: dict[str, corpus.Hostile], cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dtypecheck.loaders import open_checkpoint

    checkpoint = open_checkpoint(hangs["gguf-huge-row"].args[1])
    try:
        (record,) = checkpoint.records()
        assert record.source is not None
        sizes = [chunk.numel() for chunk in record.source.iter_chunks(1 << 20)]
    finally:
        checkpoint.close()
    assert max(sizes) == 1 << 18  # 1 MiB of float32 per chunk, although the row holds 2**26 values
    assert sum(sizes) == 1 << 26
    result = cli(*hangs["gguf-huge-row"].args, "-f", "json")
    assert result.json()["tensors"][0]["zeros"] == 1 << 26  # all-zero Q8_0 blocks are zeros


def test_baseline_from_a_device_is_refused(hangs: dict[str, corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    result = cli(*hangs["baseline-dev-zero"].args)
    assert result.exit_code == 3
    assert result.stderr == "error: --baseline /dev/zero: not a regular file\n"


def test_a_thread_left_running_by_the_factory_does_not_block_the_exit(hangs: dict[str, corpus.Hostile]) -> None:
    hostile = hangs["factory-leaves-thread"]
    returncode, stderr, _ = run_hostile(hostile, timeout=300)  # without the fix: blocks for an hour
    assert handled(returncode, stderr, hostile.expect), stderr
    assert "left 1 thread(s) running" in stderr
