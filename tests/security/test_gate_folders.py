"""Red team, round 5: what a model folder's other loaders run fails the gate (pickles in subfolders, code named by
``auto_map``, ``.npy``/``.npz`` arrays of objects), each payload proven live by the loader that reads it, and the
folders those loaders read as frameworks write them pass (no false alarms)."""

from __future__ import annotations

import collections
import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dtypecheck.loaders.formats import folders, side_files
from tests.conftest import CliResult
from tests.security import corpus
from tests.security.gate import model_folders
from tests.security.harness import assert_cli_fails_each_in_its_own_process, payload_scans, prove_live, run_python

# name -> (finding kind, a piece of its detail) that must be reported ``fail``
EXPECTED_FAIL = {
    "subfolder-trainer-checkpoint": ("pickle-global", "builtins.exec (in checkpoint-500/optimizer.pt)"),
    "subfolder-symlink": ("pickle-global", "builtins.exec (in checkpoint-7/rng_state.pth)"),
    "subfolder-distributed-checkpoint": ("pickle-global", "builtins.exec (in fsdp_0/)"),
    "auto-map-config": ("contains-code", "configuration_auto_map_config.EvilConfig"),
    "auto-map-escaped-key": ("contains-code", "configuration_auto_map_escaped_key.EvilConfig"),
    "auto-map-tokenizer": ("contains-code", "tokenization_evil.EvilTokenizer"),
    "diffusers-custom-component": ("contains-code", "unet/my_unet.py"),
    "custom-generate": ("contains-code", "custom_generate/generate.py: generate(custom_generate="),
    "npy-object-array": ("pickle-global", "builtins.exec (in labels.npy)"),
    "npz-object-array": ("pickle-global", "builtins.exec (in extra.npz)"),
    "npz-compressed-object-array": ("pickle-global", "builtins.exec (in extra.npz)"),
}
BENIGN = {"numpy-plain", "config-plain", "distributed-plain", "trainer-output-folder"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[corpus.Hostile]:
    return corpus.build(tmp_path_factory.mktemp("folders"), (model_folders.KLASS,))


def _fails(result: CliResult) -> list[tuple[str, str]]:
    return [(f["kind"], f["detail"]) for f in result.json()["findings"] if f["level"] == "fail"]


def test_every_payload_fails_the_gate(inputs: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    assert {h.name for h in inputs if not h.benign} == set(EXPECTED_FAIL)
    for hostile, result in payload_scans(inputs, cli):
        kind, detail = EXPECTED_FAIL[hostile.name]
        assert any(k == kind and detail in d for k, d in _fails(result)), (hostile.name, _fails(result))
        names = [t["name"] for t in result.json()["tensors"]]
        assert names, hostile.name  # the weights are still scanned
        assert names in (["w"], ["model.w"]) or hostile.name == "custom-generate", (hostile.name, names)


def test_every_payload_is_live(inputs: list[corpus.Hostile]) -> None:
    assert prove_live(inputs) == set(EXPECTED_FAIL)


def test_the_cli_fails_them_in_a_process_of_its_own(inputs: list[corpus.Hostile]) -> None:
    """As CI runs it (``python -m dtypecheck``, table and JSON): exit 1, no traceback, nothing run."""
    assert_cli_fails_each_in_its_own_process(inputs)


def test_benign_folders_pass(inputs: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    assert {h.name for h in inputs if h.benign} == BENIGN
    for hostile in (h for h in inputs if h.benign):
        result = cli(*hostile.args, "--format", "json")
        assert result.exit_code == 0, (hostile.name, result.stderr, result.json()["findings"])
        assert not _fails(result), hostile.name


def test_trainer_output_folder_reads_its_checkpoint(
    inputs: list[corpus.Hostile], cli: Callable[..., CliResult]
) -> None:
    """The subfolder's pickles are judged (a vetted TrainingArguments warns; the optimizer's globals are ok)."""
    (hostile,) = (h for h in inputs if h.name == "trainer-output-folder")
    details = [f["detail"] for f in cli(*hostile.args, "--format", "json").json()["findings"]]
    assert any("(in checkpoint-2/optimizer.pt)" in d for d in details), details
    assert any("(in checkpoint-2/training_args.bin)" in d for d in details), details


def _tree(root: Path, depth: int) -> Path:
    where = root
    for level in range(depth):
        where = where / f"d{level}"
    where.mkdir(parents=True)
    (where / "leaf.bin").write_bytes(b"\x80\x04N.")
    return where


def test_subfolder_walk_is_bounded_and_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path / "deep", side_files.MAX_SIDE_DEPTH + 1)
    files, beyond, _ = side_files._files_below(tmp_path / "deep")
    assert files == []
    assert len(beyond) == 1
    assert "folders deep" in beyond[0]
    _tree(tmp_path / "fine", side_files.MAX_SIDE_DEPTH)
    assert side_files._files_below(tmp_path / "fine")[1] == []
    many = tmp_path / "many"
    many.mkdir()
    for index in range(4):
        (many / f"f{index}").write_bytes(b"")
    monkeypatch.setattr(side_files, "MAX_SIDE_FILES", 2)
    files, beyond, _ = side_files._files_below(many)
    assert len(files) == 2
    assert "over 2 files" in beyond[0]


def test_a_broken_distributed_subfolder_fails(tmp_path: Path) -> None:
    (tmp_path / "fsdp_0").mkdir()
    # a pickle with a global but no Metadata: what dcp.load would make of the rest is not judged
    (tmp_path / "fsdp_0" / ".metadata").write_bytes(pickle.dumps(collections.OrderedDict(a=1), protocol=2))
    findings = folders.side_findings(tmp_path, set())
    assert [(f.kind, f.level) for f in findings] == [("unreadable-file", "fail")]
    assert findings[0].detail.startswith("fsdp_0/: a distributed checkpoint")


METADATA_TEXTS = {
    "text": b"created by some-tool 1.2\nrows: 10\n",
    "json": json.dumps({"version": 3, "columns": ["a", "b"], "note": "cos\nsystem\n"}).encode(),
    "none-pickle": b"\x80\x04N.",
}


@pytest.fixture(scope="module")
def dcp_reads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What ``dcp`` made of each ``METADATA_TEXTS`` file as a ``.metadata``, all read in one throwaway process
    (importing torch.distributed.checkpoint is most of its time): text name -> its first line of output."""
    folder = tmp_path_factory.mktemp("metadata")
    for name, text in METADATA_TEXTS.items():
        (folder / name).mkdir()
        (folder / name / ".metadata").write_bytes(text)
    proof = run_python(DCP_READ_METADATA, *(str(folder / name) for name in METADATA_TEXTS))
    lines = proof.stdout.splitlines()
    assert len(lines) == len(METADATA_TEXTS), proof.stdout + proof.stderr[-300:]
    return dict(zip(METADATA_TEXTS, lines, strict=True))


@pytest.mark.parametrize("name", sorted(METADATA_TEXTS))
def test_a_metadata_file_with_no_global_is_no_distributed_checkpoint(
    tmp_path: Path, name: str, dcp_reads: dict[str, str]
) -> None:
    """A ``.metadata`` some other tool wrote (text, JSON) references no global: ``dcp.load`` pickle.loads it and
    stops in ``read_metadata`` (an unpickling error, or no ``storage_meta`` to set on a plain value), running
    nothing; the subfolder is judged file by file like any other, its other files included."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / ".metadata").write_bytes(METADATA_TEXTS[name])
    assert folders.side_findings(tmp_path, set()) == []
    assert dcp_reads[name].startswith("stopped"), dcp_reads[name]
    payload = tmp_path / "logs" / "extra.bin"
    payload.write_bytes(b"cos\nsystem\n(S'true'\ntR.")
    found = folders.side_findings(tmp_path, set())
    assert ("pickle-global", "fail") in {(f.kind, f.level) for f in found}
    assert any("logs/extra.bin" in f.detail for f in found)


def test_a_metadata_payload_outside_a_distributed_checkpoint_fails(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / ".metadata").write_bytes(b"cos\nsystem\n(S'true'\ntR.")
    assert ("fail") in {f.level for f in folders.side_findings(tmp_path, set())}


DCP_READ_METADATA = """
import sys, warnings
warnings.simplefilter("ignore")
import torch.distributed.checkpoint as dcp
for folder in sys.argv[1:]:
    try:
        dcp.FileSystemReader(folder).read_metadata()
    except Exception as exc:
        print("stopped", type(exc).__name__)
    else:
        print("read")
"""


def test_subfolder_walk_survives_symlink_loops_and_skips_git(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "up").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "a" / "x.pt").write_bytes(b"")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "packed").write_bytes(b"PACK")
    files, beyond, _ = side_files._files_below(tmp_path)
    assert [label for _, label in files] == ["a/x.pt"]
    assert beyond == []


def test_an_unlistable_subfolder_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A subfolder this user cannot list (mode 0 for anyone but root, which lists any folder: the refusal is
    made by the listing itself here, so that the test runs as root too) is an unreadable-file fail."""
    locked = tmp_path / "locked"
    locked.mkdir()
    listing = Path.iterdir

    def refuse_locked(self: Path) -> Any:
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return listing(self)

    monkeypatch.setattr(Path, "iterdir", refuse_locked)
    beyond = side_files._files_below(tmp_path)[1]
    assert beyond == ["locked/: cannot be listed (Permission denied): not judged"]
    assert [(f.kind, f.level) for f in folders.side_findings(tmp_path, set())] == [("unreadable-file", "fail")]


def test_numpy_headers(tmp_path: Path) -> None:
    from dtypecheck.loaders._io.numpy_arrays import header_span, holds_objects

    for array, objects in ((np.ones(2), False), (np.array(["a"], dtype=object), True)):
        np.save(tmp_path / "a.npy", array, allow_pickle=True)
        data = (tmp_path / "a.npy").read_bytes()
        span = header_span(data[:12])
        assert span is not None
        offset, length, encoding = span
        assert holds_objects(data[offset : offset + length], encoding) is objects
    structured = np.zeros(1, dtype=[("x", "f4"), ("y", "O")])
    np.save(tmp_path / "s.npy", structured, allow_pickle=True)
    data = (tmp_path / "s.npy").read_bytes()
    span = header_span(data[:12])
    assert span is not None
    assert holds_objects(data[span[0] : span[0] + span[1]], span[2])
    # failing closed: a header that cannot be told is read as if it held objects
    assert holds_objects(b"{'descr': nonsense", "latin1")
    assert holds_objects(None, "latin1")
    assert header_span(b"\x93NUMPY\x09\x00\x00\x00\x00\x00") is None  # np.load refuses version 9.0


def test_code_references(tmp_path: Path) -> None:
    from dtypecheck.loaders._io.shipped_code import code_references

    def refs(name: str, document: object) -> list[str]:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document))
        return [f.detail for f in code_references(path, name) if f.kind == "contains-code" and f.level == "fail"]

    assert refs("config.json", {"model_type": "bert", "architectures": ["BertModel"]}) == []
    assert refs("config.json", {"auto_map": {}}) == []
    assert refs("config.json", {"text_config": {"auto_map": {"AutoConfig": "m.C"}}})
    assert refs("config.json", {"custom_pipelines": {"x": {"impl": "p.P"}}})
    assert refs("other.json", {"auto_map": {"AutoModel": "org/repo--modeling.M"}})
    index = {"_class_name": "DDPMPipeline", "unet": ["diffusers", "UNet2DModel"], "safety_checker": [None, None]}
    assert refs("model_index.json", index) == []
    index["scheduler"] = ["stable_diffusion", "StableDiffusionSafetyChecker"]  # a diffusers pipeline module
    assert refs("model_index.json", index) == []
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "stable_diffusion.py").write_text("")
    assert refs("model_index.json", index) == [
        "model_index.json: names code (scheduler/stable_diffusion.py) that "
        "from_pretrained(..., trust_remote_code=True) imports and runs"
    ]
    assert refs("model_index.json", {**index, "_class_name": ["pipeline", "MyPipeline"]})
    (tmp_path / "custom_generate").mkdir()
    generate = tmp_path / "custom_generate" / "generate.py"
    generate.write_text("def generate(model, **kwargs): pass\n")
    assert [f.kind for f in code_references(generate, "custom_generate/generate.py")] == ["contains-code"]


def test_folder_loaders_class_is_registered() -> None:
    assert model_folders.KLASS in corpus.GATE_CLASSES
