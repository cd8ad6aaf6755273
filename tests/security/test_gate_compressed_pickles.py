"""Compressed pickles in a model folder (``joblib.dump(..., compress=3)``, ``x.pkl.gz``, a gzip ``opt.bin``) and
joblib's arrays written between a pickle's opcodes: each payload is live under ``joblib.load`` and fails the gate
(all exited 0 on main, or were flagged only by the then unvetted ``NumpyArrayWrapper``, which also failed every
benign joblib file); a decompression bomb is refused, not read; joblib's own files pass."""

from __future__ import annotations

import importlib.util
import pickle
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dtypecheck.loaders._io import joblib_pickles
from dtypecheck.loaders._io.pickle_files import side_file_findings
from tests.conftest import CliResult
from tests.security import corpus
from tests.security.gate import compressed_pickles
from tests.security.harness import assert_cli_fails_each_in_its_own_process, payload_scans, prove_live

LIVE = {
    "joblib-zlib", "joblib-gzip", "joblib-bz2", "joblib-xz", "joblib-lzma", "joblib-after-array",
    "joblib-object-array", "zlib-pickle-joblib", "gzip-pickle-pkl-gz", "gzip-pickle-opt-bin", "joblib-zfile",
    "gzip-truncated",
}  # fmt: skip
REFUSED = {"decompression-bomb": "a decompression bomb?", "lz4-unreadable": "no lz4 reader is installed"}
SMALL_CAP = 4 << 20
"""The cap while this module's corpus is built and scanned in process: the bomb inflates past it in milliseconds."""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[corpus.Hostile]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(joblib_pickles, "MAX_DECOMPRESSED_BYTES", SMALL_CAP)
        yield corpus.build(tmp_path_factory.mktemp("compressed"), (compressed_pickles.KLASS,))


def _fails(result: CliResult) -> list[str]:
    return [f["detail"] for f in result.json()["findings"] if f["level"] == "fail"]


def test_every_payload_fails_the_gate(inputs: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    live = [h for h in inputs if h.canary is not None]
    assert {h.name for h in live} == LIVE
    for hostile, result in payload_scans(live, cli):
        assert any(detail.startswith("builtins.exec (in ") for detail in _fails(result)), (hostile.name, result)
        assert [t["name"] for t in result.json()["tensors"]] == ["w"], hostile.name  # the weights still scanned


def test_what_cannot_be_read_fails(inputs: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    refused = [h for h in inputs if h.canary is None and not h.benign]
    expected = (
        REFUSED if importlib.util.find_spec("lz4") is None else {"decompression-bomb": REFUSED["decompression-bomb"]}
    )
    assert {h.name for h in refused} == set(expected)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(joblib_pickles, "MAX_DECOMPRESSED_BYTES", SMALL_CAP)
        for hostile in refused:
            result = cli(*hostile.args, "--format", "json")
            assert result.exit_code == 1, (hostile.name, result.stderr)
            assert any(expected[hostile.name] in detail for detail in _fails(result)), _fails(result)


def test_every_payload_is_live(inputs: list[corpus.Hostile]) -> None:
    assert prove_live(inputs) == LIVE


def test_the_cli_fails_them_in_a_process_of_its_own(inputs: list[corpus.Hostile]) -> None:
    chosen = {"joblib-zlib", "gzip-pickle-opt-bin", "joblib-object-array"}
    assert_cli_fails_each_in_its_own_process([h for h in inputs if h.name in chosen])


def test_joblib_files_and_other_compressed_files_pass(
    inputs: list[corpus.Hostile], cli: Callable[..., CliResult]
) -> None:
    benign = [h for h in inputs if h.benign]
    assert {h.name for h in benign} == {"joblib-arrays", "compressed-not-pickles"}
    for hostile in benign:
        result = cli(*hostile.args, "--format", "json")
        assert result.exit_code == 0, (hostile.name, result.stderr, _fails(result))
        kinds = {(f["kind"], f["level"]) for f in result.json()["findings"]}
        assert kinds <= {("pickle-global", "ok"), ("pickle-global", "warn")}, (hostile.name, kinds)


def test_a_joblib_file_is_read_past_each_array(tmp_path: Path) -> None:
    """Every array of every layout is stepped over as joblib.load reads it: the globals after the last array
    are found, and nothing breaks off (the plain reading, which stops in the first array's bytes, is not
    reported as a broken pickle once joblib's reading ends cleanly)."""
    joblib = pytest.importorskip("joblib")
    path = tmp_path / "scaler.joblib"
    joblib.dump({**compressed_pickles.benign_arrays(), "last": pickle.loads(pickle.dumps(Path("x")))}, path)
    found = side_file_findings(path, "scaler.joblib")
    assert "pathlib.PosixPath (in scaler.joblib)" in {f.detail for f in found}
    assert {f.kind for f in found} == {"pickle-global"}


def test_the_plain_reading_of_an_array_is_judged_too(tmp_path: Path) -> None:
    """An array whose bytes are a pickle's opcodes: joblib.load reads them as data, pickle.load (and torch.load)
    runs them. Both readings are judged."""
    joblib = pytest.importorskip("joblib")
    np = pytest.importorskip("numpy")
    hidden = b"cbuiltins\nexec\n(Vpass\ntR0"  # exec("pass"), then POP: the stream goes on as before
    wrapper = joblib.numpy_pickle.NumpyArrayWrapper(np.ndarray, (len(hidden),), "C", np.dtype("u1"), False, None)
    path = tmp_path / "evil.pkl"
    with path.open("wb") as handle:
        handle.write(pickle.dumps(wrapper, protocol=2)[:-1] + hidden + b".")  # the array's bytes after its BUILD
    found = {f.detail: f.level for f in side_file_findings(path, "evil.pkl")}
    assert found["builtins.exec (in evil.pkl)"] == "fail"


@pytest.mark.parametrize(
    ("name", "named"),
    [("extra.joblib", True), ("x.pkl.gz", True), ("m.pickle.xz", True), ("s.PKL.Z", True), ("o.bin", False),
     ("vocab.txt.gz", False), ("joblib", False)],
)  # fmt: skip
def test_pickle_names(name: str, named: bool) -> None:
    assert joblib_pickles.pickle_named(Path(name)) is named


def test_an_unknown_array_layout_fails_closed(tmp_path: Path) -> None:
    """A ``NumpyArrayWrapper`` whose dtype is not one joblib writes: where the array ends is unknown."""
    joblib = pytest.importorskip("joblib")
    np = pytest.importorskip("numpy")
    wrapper = joblib.numpy_pickle.NumpyArrayWrapper(np.ndarray, (2,), "C", "not a dtype", False, None)
    path = tmp_path / "odd.joblib"
    path.write_bytes(zlib.compress(pickle.dumps([wrapper, Path("after")], protocol=2)))
    found = side_file_findings(path, "odd.joblib")
    assert any(f.kind == "unreadable-file" and f.level == "fail" for f in found), found


def test_compressed_pickles_class_is_registered() -> None:
    assert compressed_pickles.KLASS in corpus.GATE_CLASSES
