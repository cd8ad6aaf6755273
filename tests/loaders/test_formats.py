"""``loaders.formats.FORMATS`` is the one list of formats: detection, folder suffixes, help, errors and the
pre-commit pattern all agree with it."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
import typer
import yaml
from safetensors.torch import save_file

from dtypecheck.cli import app
from dtypecheck.errors import InputError
from dtypecheck.loaders import open_checkpoint
from dtypecheck.loaders.formats import (
    FORMATS,
    describe_formats,
    detect,
    detect_folder,
    pre_commit_exclude,
    pre_commit_pattern,
)
from dtypecheck.loaders.formats.folders import CHECKPOINT_SUFFIXES

ROOT = Path(__file__).resolve().parents[2]


def _hook(key: str) -> str:
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    return str(next(h for h in hooks if h["id"] == "dtypecheck-scan-model")[key])


def test_pre_commit_leaves_out_trainer_files_that_hold_no_tensors() -> None:
    exclude = _hook("exclude")
    assert exclude == pre_commit_exclude()
    for name in ("training_args.bin", "out/checkpoint-500/training_args.bin", "checkpoint-500/scheduler.pt"):
        assert re.search(exclude, name), name
    for name in ("pytorch_model.bin", "my_training_args.bin", "optimizer.pt", "lr_scheduler.pt.bak"):
        assert not re.search(exclude, name), name


def test_pre_commit_pattern_lists_exactly_the_file_formats_suffixes() -> None:
    pattern = _hook("files")
    assert pattern == pre_commit_pattern()
    # Read the alternation back out of the YAML's own text, independently of how the code builds it.
    listed = re.fullmatch(r"\\\.\((.*)\)\$", pattern)
    assert listed is not None
    file_suffixes = {s for f in FORMATS if f.kind == "file" for s in f.suffixes}
    assert {"." + s for s in listed.group(1).split("|")} == file_suffixes
    assert file_suffixes == {".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".gguf"}
    for suffix in file_suffixes:
        assert re.search(pattern, f"models/llama{suffix}"), suffix
    for name in ("train.py", "model.safetensors.index.json", "x.ptx", "notes.bin.txt", "__0_0.distcp"):
        assert not re.search(pattern, name), name


def test_folder_suffixes_help_and_error_come_from_the_table(tmp_path: Path) -> None:
    assert set(CHECKPOINT_SUFFIXES) == {s for f in FORMATS for s in f.suffixes}
    commands = getattr(typer.main.get_command(app), "commands")  # noqa: B009  (a TyperGroup's, untyped)
    help_text = str(commands["scan-model"].params[0].help)
    for row in FORMATS:
        assert row.description in help_text, row.name
    noise = tmp_path / "noise.bin"
    noise.write_bytes(b"\x01" * 64)
    with pytest.raises(InputError) as caught:
        open_checkpoint(str(noise))
    assert str(caught.value) == f"{noise}: not a checkpoint: expected one of {describe_formats()}"
    assert "GGUF (.gguf)" in describe_formats()


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_each_file_format_is_detected_by_content_not_by_name(tmp_path: Path) -> None:
    weights = {"w": torch.arange(4, dtype=torch.float32)}
    # Every file is named .bin: only the content may decide.
    save_file(weights, str(tmp_path / "a.bin"))
    torch.save(weights, tmp_path / "b.bin")
    torch.save(weights, tmp_path / "c.bin", _use_new_zipfile_serialization=False)
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), tmp_path / "d.bin")
    (tmp_path / "e.bin").write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 24)
    from torch.package.package_exporter import PackageExporter

    with warnings.catch_warnings(), PackageExporter(str(tmp_path / "f.bin")) as exporter:
        warnings.simplefilter("ignore")  # (torch.package pickles TypedStorage, which torch deprecates)
        exporter.extern("torch.**")
        exporter.save_pickle("model", "state.pkl", weights)
    found = {p.name: getattr(detect(p), "name", None) for p in sorted(tmp_path.iterdir())}
    assert found == {
        "a.bin": "safetensors",
        "b.bin": "torch-zip",
        "c.bin": "torch-legacy",
        "d.bin": "torchscript",
        "e.bin": "gguf",
        "f.bin": "torch-package",
    }
    assert {row.name for row in FORMATS if row.kind == "file"} == set(found.values())


def test_folder_formats_are_detected_by_their_marker_files(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert detect_folder(plain) is None
    dcp = tmp_path / "dcp"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(b"")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "model.safetensors.index.json").write_text("{}")
    assert getattr(detect_folder(dcp), "name", None) == "torch-dcp"
    assert getattr(detect_folder(sharded), "name", None) == "hf-sharded"
