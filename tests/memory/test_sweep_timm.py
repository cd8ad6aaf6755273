"""Model types whose towers timm builds (transformers' ``TimmWrapper``), which the real-size config sweep (issue 28.1)
could not reach: this machine's only torchvision wheels are CUDA builds that do not import beside the CPU build of
torch, and timm needs torchvision. The sweep declares torchvision's two unguarded ops so that it imports; the
image side of a timm tower comes from timm's registry (PE's ViT takes only its 336-pixel images)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def _fake_timm(monkeypatch: pytest.MonkeyPatch, sizes: dict[str, tuple[int, int, int]]) -> None:
    """A ``timm`` whose registry knows ``sizes`` (architecture: input size), as timm's pretrained configs say."""

    def get_pretrained_cfg(name: str) -> Any:
        if name not in sizes:
            raise RuntimeError(f"unknown architecture {name}")
        return types.SimpleNamespace(input_size=sizes[name])

    timm = types.ModuleType("timm")
    timm.models = types.SimpleNamespace(get_pretrained_cfg=get_pretrained_cfg)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "timm", timm)


def test_a_timm_tower_takes_the_image_side_its_architecture_was_made_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from dtypecheck.memory.hf_config import sizes_of

    _fake_timm(monkeypatch, {"vit_pe_core_large_patch14_336": (3, 336, 336), "fastvit_mci3": (3, 256, 192)})
    # PE Video keeps its timm tower one level down, in its video config's vision config.
    pe = transformers.AutoConfig.for_model("pe_video")
    assert pe.video_config.vision_config.architecture == "vit_pe_core_large_patch14_336"
    assert sizes_of(pe, "image_size", (224,)) == (336, 336)
    fast = transformers.AutoConfig.for_model("fast_vlm")
    assert sizes_of(fast, "image_size", (224,)) == (256, 192)
    # ``model_args`` that set the size win over the registry's default; an architecture unknown to it, or a
    # config that is not timm's, keeps the caller's default.
    fast.vision_config.model_args = {"img_size": 512}
    assert sizes_of(fast, "image_size", (224,)) == (512,)
    fast.vision_config.model_args = None
    fast.vision_config.architecture = "not_in_the_registry"
    assert sizes_of(fast, "image_size", (224,)) == (224,)
    assert sizes_of(transformers.AutoConfig.for_model("bert"), "image_size", (224,)) == (224,)


def test_without_timm_the_default_side_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    from dtypecheck.memory.hf_config import sizes_of

    monkeypatch.setitem(sys.modules, "timm", None)  # ``import timm`` raises ImportError
    assert sizes_of(transformers.AutoConfig.for_model("pe_video"), "image_size", (224,)) == (224,)


# A torchvision as this machine's CUDA wheel behaves beside CPU torch: its C++ ops never load, and its import fails
# at the one fake registration that does not first ask whether they exist.
BROKEN_TORCHVISION = """
import torch

@torch.library.register_fake("torchvision::nms")
def _(dets, scores, iou_threshold):
    return dets.new_empty((0,), dtype=torch.int64)

__version__ = "0.0+cuda"
"""

CHECK = """
import sys
sys.path.insert(0, sys.argv[1])
from benchmarks.memory_config_sweep import declare_torchvision_ops

try:
    import torchvision
except RuntimeError as exc:
    print("plain import:", "torchvision::nms" in str(exc))
print("declared:", declare_torchvision_ops())
import torch, torchvision
print("imported:", torchvision.__version__)
print("ops:", [str(getattr(torch.ops.torchvision, op).default._schema) for op in ("nms", "qnms")])
print("again:", declare_torchvision_ops())
"""


def test_the_sweep_declares_the_ops_a_cuda_torchvision_wheel_cannot_load(tmp_path: Path) -> None:
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(BROKEN_TORCHVISION), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(ROOT)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "plain import: True",
        "declared: True",
        "imported: 0.0+cuda",
        "ops: ['torchvision::nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor', "
        "'torchvision::qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor']",
        "again: False",  # imported now: nothing more to do
    ]
