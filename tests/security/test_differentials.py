"""Class "differentials": the bytes judged are the bytes torch's reader returns, not what Python's zipfile finds."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult
from tests.security import corpus
from tests.security.harness import torch_load_all


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, corpus.Hostile]:
    return {h.name: h for h in corpus.build(tmp_path_factory.mktemp("hostile"), ("differentials",))}


def test_two_central_directories_disagree_and_fail(
    built: dict[str, corpus.Hostile], cli: Callable[..., CliResult]
) -> None:
    hostile = built["zip-two-central-directories"]
    path = hostile.args[1]
    # Python's zipfile reads the benign directory: one data.pkl, no duplicate for the old checks to see
    with zipfile.ZipFile(path) as archive:
        assert [i.filename for i in archive.infolist()].count("archive/data.pkl") == 1
    result = cli(*hostile.args, "--format", "json")
    assert result.exit_code == 1, result.stderr
    findings = result.json()["findings"]
    kinds = {(f["kind"], f["level"]) for f in findings}
    assert ("zip-differential", "fail") in kinds
    assert ("pickle-global", "fail") in kinds
    assert any(f["detail"] == "builtins.exec" for f in findings)  # the data.pkl torch reads was judged
    assert [t["name"] for t in result.json()["tensors"]] == ["w"]


def test_deflated_pickles_are_inflated_and_judged(
    built: dict[str, corpus.Hostile], cli: Callable[..., CliResult]
) -> None:
    for name in ("deflated-data-pkl", "deflated-side-file"):  # the twin is a zip: scanned as a part of the folder
        result = cli(*built[name].args, "--format", "json")
        assert result.exit_code == 1, (name, result.stderr)
        fails = [f["detail"] for f in result.json()["findings"] if f["level"] == "fail"]
        assert "builtins.exec" in fails, (name, fails)


def test_every_payload_is_live_and_none_ran(built: dict[str, corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    for hostile in built.values():
        cli(*hostile.args)
        assert hostile.canary is not None
        assert not hostile.canary.exists()
    torch_load_all([h.torch_load for h in built.values() if h.torch_load is not None])
    assert all(h.canary is not None and h.canary.exists() for h in built.values())


def test_a_deflate_bomb_is_an_input_error(
    tmp_path: Path, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dtypecheck.loaders._io.zip_records.MAX_INFLATED_BYTES", 1 << 20)
    path = corpus.deflated_torch_zip(tmp_path / "bomb.pt", b"\x80\x02}" + b"N0" * (1 << 20) + b".")
    assert path.stat().st_size < 1 << 16  # a few KiB that inflate to 2 MiB, past the (lowered) limit
    result = cli("scan-model", str(path))
    assert result.exit_code == 3
    assert result.stderr.startswith("error: ")
    assert "data.pkl inflates to 2097156 bytes, over the 1048576 limit" in result.stderr


def test_an_entry_that_inflates_past_its_declared_size_stops_at_the_limit(
    tmp_path: Path, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The declared size is only a claim: inflation itself stops at the limit (never allocating what the stream
    would grow to), and a stream that disagrees with its declared size is refused."""
    import struct

    path = corpus.deflated_torch_zip(tmp_path / "liar.pt", b"\x80\x02}" + b"N0" * (1 << 20) + b".")
    data = bytearray(path.read_bytes())
    local = data.index(b"PK\x03\x04")
    central = data.index(b"PK\x01\x02")
    struct.pack_into("<I", data, local + 22, 10)  # uncompressed size: 10 bytes, in both headers
    struct.pack_into("<I", data, central + 24, 10)
    path.write_bytes(bytes(data))
    result = cli("scan-model", str(path))
    assert result.exit_code == 3
    assert "data.pkl inflates to 2097156 bytes, not the 10 its entry declares" in result.stderr
    monkeypatch.setattr("dtypecheck.loaders._io.zip_records.MAX_INFLATED_BYTES", 1 << 20)
    result = cli("scan-model", str(path))
    assert result.exit_code == 3
    assert "data.pkl inflates past the 1048576 limit (a decompression bomb)" in result.stderr
