"""A diffusers pipeline folder (``model_index.json``, weights only in its components' subfolders), as
``DiffusionPipeline.save_pretrained`` writes it, is scanned component by component (each tensor named by its
subfolder) and passes when healthy; a payload in any component still fails. A sharded component is read through
its index, as the top level of a transformers folder is: a shard it names outside the folder, or missing, fails.
Built here from a tiny DDPM pipeline (nothing downloaded)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.security.harness import run_cli


def _save(folder: Path, **options: object) -> Path:
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8,),
        down_block_types=("DownBlock2D",), up_block_types=("UpBlock2D",), norm_num_groups=4,
    )  # fmt: skip
    diffusers.DDPMPipeline(unet=unet, scheduler=diffusers.DDPMScheduler()).save_pretrained(folder, **options)
    return folder


@pytest.fixture
def pipeline(tmp_path: Path) -> Path:
    return _save(tmp_path / "pipe")


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    """The same pipeline, its unet saved in shards of 10 KB (an index and several safetensors shards)."""
    folder = _save(tmp_path / "sharded", max_shard_size="10KB")
    assert len(list((folder / "unet").glob("*.safetensors"))) > 1
    return folder


INDEX = "unet/diffusion_pytorch_model.safetensors.index.json"


def _scan(folder: Path) -> tuple[int, dict[str, object]]:
    result = run_cli(["scan-model", str(folder), "--format", "json"])
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout) if result.stdout else {}


def _fails(document: dict[str, object]) -> list[str]:
    findings = document["findings"]
    assert isinstance(findings, list)
    return [f"{f['kind']}: {f['detail']}" for f in findings if f["level"] == "fail"]


def test_a_sharded_component_is_read_through_its_index(sharded: Path) -> None:
    code, document = _scan(sharded)
    assert code == 0, _fails(document)
    tensors = document["tensors"]
    assert isinstance(tensors, list)
    names = [t["name"] for t in tensors]
    index = json.loads((sharded / INDEX).read_text())
    assert sorted(names) == sorted(f"unet/diffusion_pytorch_model.{name}" for name in index["weight_map"])


def test_a_shard_named_outside_the_folder_fails(sharded: Path) -> None:
    """diffusers joins the index's shard name to the component folder: ``../../x.bin`` loads a file elsewhere."""
    torch.save({"w": torch.zeros(2), "x": _Payload()}, sharded.parent / "elsewhere.bin")
    index = json.loads((sharded / INDEX).read_text())
    index["weight_map"]["extra.weight"] = "../../elsewhere.bin"
    (sharded / INDEX).write_text(json.dumps(index))
    code, document = _scan(sharded)
    assert code == 1
    assert f"missing-shard: {INDEX}: index names a shard outside the folder: ../../elsewhere.bin" in _fails(document)


def test_a_missing_shard_and_a_tensor_not_in_its_shard_fail(sharded: Path) -> None:
    index = json.loads((sharded / INDEX).read_text())
    shard = next(iter(index["weight_map"].values()))
    index["weight_map"]["gone.weight"] = "diffusion_pytorch_model-00099-of-00099.safetensors"
    index["weight_map"]["moved.weight"] = shard
    (sharded / INDEX).write_text(json.dumps(index))
    code, document = _scan(sharded)
    assert code == 1
    fails = _fails(document)
    assert any("diffusion_pytorch_model-00099-of-00099.safetensors missing" in f for f in fails), fails
    assert any(f.startswith(f"index-mismatch: {INDEX}: in the index but not in {shard}") for f in fails), fails


def test_a_bin_index_names_a_pickle_shard_that_is_judged(sharded: Path) -> None:
    """With only a ``.bin`` index, its shards are what the component loads: a payload in one fails."""
    unet = sharded / "unet"
    index = json.loads((sharded / INDEX).read_text())
    for shard in set(index["weight_map"].values()):
        (unet / shard).unlink()
    (sharded / INDEX).unlink()
    torch.save({"w": torch.zeros(2), "x": _Payload()}, unet / "weights-1.bin")
    (unet / "diffusion_pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"w": "weights-1.bin"}}))
    code, document = _scan(sharded)
    assert code == 1
    assert "pickle-global: builtins.print" in _fails(document)


def test_a_healthy_pipeline_passes(pipeline: Path) -> None:
    assert (pipeline / "model_index.json").is_file()
    assert (pipeline / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    result = run_cli(["scan-model", str(pipeline), "--format", "json"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "unet/diffusion_pytorch_model." in result.stdout


def test_a_payload_in_a_component_fails(pipeline: Path) -> None:
    (pipeline / "unet" / "diffusion_pytorch_model.safetensors").unlink()
    torch.save({"w": torch.zeros(2), "x": _Payload()}, pipeline / "unet" / "diffusion_pytorch_model.bin")
    result = run_cli(["scan-model", str(pipeline)])
    assert result.returncode == 1, result.stdout + result.stderr


def test_a_payload_beside_a_component_fails(pipeline: Path) -> None:
    (pipeline / "scheduler" / "extra.pt").write_bytes(b"cos\nsystem\n(S'true'\ntR.")
    result = run_cli(["scan-model", str(pipeline)])
    assert result.returncode == 1, result.stdout + result.stderr


def test_an_index_with_no_component_weights_is_still_no_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "DDPMPipeline"}))
    result = run_cli(["scan-model", str(tmp_path)])
    assert result.returncode == 3, result.stdout + result.stderr


class _Payload:
    def __reduce__(self) -> tuple[Callable[..., object], tuple[str]]:
        return print, ("payload",)
