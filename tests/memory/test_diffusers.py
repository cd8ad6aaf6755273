"""diffusers UNet and VAE configs (the ``diffusers`` extra): built with ``from_config`` on the meta device, estimated,
and measured against MemTracker on a real CPU step; tiny configs, nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import diffusers
import pytest

UNET = {
    "_class_name": "UNet2DConditionModel",
    "_diffusers_version": diffusers.__version__,
    "sample_size": 8,
    "in_channels": 4,
    "out_channels": 4,
    "block_out_channels": [32, 64],
    "layers_per_block": 1,
    "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
    "cross_attention_dim": 32,
    "attention_head_dim": 8,
    "norm_num_groups": 32,
}
VAE = {
    "_class_name": "AutoencoderKL",
    "_diffusers_version": diffusers.__version__,
    "sample_size": 16,
    "in_channels": 3,
    "out_channels": 3,
    "block_out_channels": [32, 64],
    "layers_per_block": 1,
    "latent_channels": 4,
    "norm_num_groups": 32,
    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D"],
}


def _folder(tmp_path: Path, config: dict[str, Any]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("config", [UNET, VAE], ids=["unet", "vae"])
def test_diffusers_configs_estimate_within_1_percent_of_memtracker(
    cli: Any, tmp_path: Path, config: dict[str, Any]
) -> None:
    built = getattr(diffusers, config["_class_name"]).from_config({k: v for k, v in config.items() if k[0] != "_"})
    doc = cli("estimate-memory", str(_folder(tmp_path, config)), "-d", "fp32", "--measure", "-f", "json").json()
    model = doc["model"]
    assert (model["architecture"], model["model_class"]) == (config["_class_name"], config["_class_name"])
    assert model["parameters"] == sum(p.numel() for p in built.parameters())  # counted by diffusers itself
    assert model["loss"] == "mse"  # noise prediction, not a cross-entropy over the float timestep
    assert [m["mode"] for m in doc["measurements"]] == ["inference", "training"]
    assert all(abs(m["error"]) < 0.01 for m in doc["measurements"]), doc["measurements"]


def test_a_unet_defaults_to_clips_77_tokens_and_an_unknown_diffusers_class_is_one_line(
    cli: Any, tmp_path: Path
) -> None:
    (tmp_path / "unet").mkdir()
    unet = _folder(tmp_path / "unet", UNET)
    doc = cli("estimate-memory", str(unet), "-d", "fp32", "-m", "inference", "-f", "json").json()
    assert doc["estimates"][0]["seq_len"] == 77
    assert any("CLIP's" in note for note in doc["model"]["notes"])
    (tmp_path / "other").mkdir()
    unknown = {"_class_name": "PriorTransformer", "_diffusers_version": diffusers.__version__}
    result = cli("estimate-memory", str(_folder(tmp_path / "other", unknown)))
    assert (result.exit_code, result.stdout) == (3, "")
    assert result.stderr.startswith("error: ")
    builds = "UNet2DConditionModel, UNet2DModel, AutoencoderKL"
    assert f"'PriorTransformer' config; estimate-memory builds {builds}" in result.stderr
