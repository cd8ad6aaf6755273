"""A diffusers pipeline folder (``model_index.json``, weights only in its components' subfolders), as
``DiffusionPipeline.save_pretrained`` writes it, is scanned component by component (each tensor named by its
subfolder) and passes when healthy; a payload in any component still fails. Built here from a tiny DDPM pipeline
(nothing downloaded)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.security.harness import run_cli


@pytest.fixture
def pipeline(tmp_path: Path) -> Path:
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8,),
        down_block_types=("DownBlock2D",), up_block_types=("UpBlock2D",), norm_num_groups=4,
    )  # fmt: skip
    folder = tmp_path / "pipe"
    diffusers.DDPMPipeline(unet=unet, scheduler=diffusers.DDPMScheduler()).save_pretrained(folder)
    return folder


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
