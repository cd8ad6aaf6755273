"""Class "loadable-files": every file torch.load accepts is judged, detected as torch.load detects it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult
from tests.security import corpus
from tests.security.harness import torch_load_all


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> list[corpus.Hostile]:
    return corpus.build(tmp_path_factory.mktemp("hostile"), ("loadable-files",))


def test_raw_pickles_and_legacy_tars_fail_wherever_they_are(
    built: list[corpus.Hostile], cli: Callable[..., CliResult]
) -> None:
    assert len(built) == 7
    for hostile in built:
        result = cli(*hostile.args, "--format", "json")
        assert result.exit_code == 1, (hostile.name, result.stderr)
        fails = [f["detail"] for f in result.json()["findings"] if f["level"] == "fail"]
        assert any(d.startswith("builtins.exec") for d in fails), (hostile.name, fails)
        assert hostile.canary is not None
        assert not hostile.canary.exists()
    torch_load_all([h.torch_load for h in built if h.torch_load is not None])
    assert all(h.canary is not None and h.canary.exists() for h in built)


def test_a_lone_raw_pickle_is_a_pickle_report(built: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    by_name = {h.name: h for h in built}
    document = cli(*by_name["raw-protocol-0"].args, "--format", "json").json()
    assert document["format"] == "pickle"
    assert document["tensors"] == []
    kinds = [(f["kind"], f["level"]) for f in document["findings"]]
    assert kinds == [("no-tensors", "fail"), ("pickle-global", "fail")]


def test_harmless_files_beside_weights_add_nothing(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    import pickle

    folder = tmp_path
    corpus._safetensors_weights(folder / "model.safetensors")
    (folder / "config.json").write_text('{"hidden_size": 4}')
    (folder / "README.md").write_text("# a model\n")
    (folder / "state.pkl").write_bytes(pickle.dumps({"step": 3, "lr": [0.1, 0.01]}, protocol=0))
    result = cli("scan-model", str(folder), "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["findings"] == []


def test_a_pickle_stopped_at_a_limit_is_a_finding(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    folder = tmp_path
    corpus._safetensors_weights(folder / "model.safetensors")
    (folder / "optimizer.pt").write_bytes(b"(" * 100_001 + b".")  # MARK nesting past ours
    result = cli("scan-model", str(folder), "--format", "json")
    assert result.exit_code == 1
    (finding,) = [f for f in result.json()["findings"] if f["level"] == "fail"]  # (and a "skipped" warning)
    assert finding["kind"] == "unreadable-file"
    assert finding["detail"].startswith("optimizer.pt: torch.load would run a pickle that dtypecheck stopped reading")


def test_a_payload_after_a_storage_of_a_legacy_tar_is_found(tmp_path: Path) -> None:
    """The second storage's header pickle lies after the first storage's raw bytes: it is found by walking the
    member as torch.load does (count, header, int64 element count, elements, ...)."""
    import pickle
    import struct

    import torch

    from dtypecheck.loaders._io.pickle_files import file_globals

    header = pickle.dumps(("0", "cpu", torch.FloatStorage), 2)
    payload = pickle.dumps(corpus._Payload(tmp_path / "canary"), 2)
    storages = pickle.dumps(2, 2) + header + struct.pack("<q", 3) + struct.pack("<3f", 1, 2, 3) + payload
    path = corpus.legacy_tar(tmp_path / "old.pt", storages)
    report = file_globals(path)
    assert [ref.qualname for ref in report.globals] == ["torch.FloatStorage", "builtins.exec"]
    assert not report.limited
