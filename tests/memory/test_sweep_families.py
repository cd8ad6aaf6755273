"""Fixes of the real-size config sweep's failures by family (issue 28.1): GLM-4V's rope sections fitted to its
rotary width; Idefics3-style models' count of real images, read after their mask is taken as all true, and their
pixel shuffle given a grid it divides; the codecs' padding read from constants their constructors make; an unset
head width given the width over the heads (Ministral, HunYuan), unset key-value heads one per head (Nemotron); a
backbone-only config built as its backbone (RT-DETR's ResNet, ViTPose's ViT); each checked at tiny size against
MemTracker."""

from __future__ import annotations

import pytest
import torch

from dtypecheck.errors import InputError
from dtypecheck.memory import estimate_memory
from tests.memory._fixtures import TINY_TEXT, fp32_options, within_5_percent_of_memtracker

transformers = pytest.importorskip("transformers")

FP32 = fp32_options()
TEXT = TINY_TEXT


def test_the_sweep_fits_glm4v_rope_sections_to_its_rotary_width(tmp_path):
    from benchmarks.memory_config_sweep import rope_sections_fit

    # 16-wide heads rotate 8 frequencies, which the code's default sections [8, 12, 12] (32) do not split.
    config = transformers.Glm4vTextConfig(**TEXT)
    config.to_json_file(str(tmp_path / "config.json"))
    with pytest.raises(InputError) as failed:
        estimate_memory(str(tmp_path), FP32)
    assert rope_sections_fit(config, failed.value.message())
    assert config.rope_parameters["mrope_section"] == [2, 3, 3]
    within_5_percent_of_memtracker(tmp_path, config)


def test_the_sweep_leaves_other_failures_alone():
    from benchmarks.memory_config_sweep import rope_sections_fit

    config = transformers.Glm4vTextConfig(**TEXT)
    message = "cannot trace: aten.view.default in module 'connector': RuntimeError: shape '[1, 7]' is invalid"
    assert not rope_sections_fit(config, message)
    assert "mrope_section" not in config.rope_parameters


COUNTED_FIRST = """
import torch
from torch import nn


class CountFirst(nn.Module):
    \"\"\"Counts the rows that are not all zero (Idefics3's real images) before it keeps them, and reads the count
    after.\"\"\"

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 256)

    def forward(self, x):
        keep = x.abs().sum(-1) > 0  # values the trace does not know
        count = keep.view(4, -1).sum(dim=1)
        rows = self.proj(x[keep])
        return torch.cat([part.sum(0) for part in rows.split(count.tolist())])


def count_first():
    torch.manual_seed(0)
    return CountFirst(), torch.randn(64, 64) + 10.0, lambda out, inputs: out.pow(2).mean()  # every row real
"""


def test_a_count_made_before_its_mask_is_taken_as_all_true_is_known_after(tmp_path):
    path = tmp_path / "counted.py"
    path.write_text(COUNTED_FIRST, encoding="utf-8")
    # Before: "aten._local_scalar_dense.default ... depends on tensor values the trace does not know" at tolist().
    report = estimate_memory(f"{path}:count_first", FP32, measure=True)
    assert any("taken as selecting everything" in note for note in report.model.notes)
    assert max(abs(m.error) for m in report.measurements) <= 0.05, report.measurements


VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}


def _idefics3():
    return transformers.Idefics3Config(
        vision_config={**VISION, "image_size": 32, "patch_size": 8}, text_config={"model_type": "llama", **TEXT},
        image_token_id=127, scale_factor=2,
    )  # fmt: skip


def test_idefics3_counts_its_real_images_once_its_image_mask_is_taken_as_all_true(tmp_path):
    # Its forward counts the images that are not all zeros (``num_real_images_per_batch``, unknown: the zeros
    # stand for data) before it indexes with that mask, and reads the count with ``.tolist()`` after; before,
    # "aten._local_scalar_dense.default ... depends on tensor values the trace does not know".
    within_5_percent_of_memtracker(tmp_path, _idefics3())


def test_the_sweep_gives_a_pixel_shuffle_or_a_pooled_grid_an_image_it_divides():
    from benchmarks.memory_config_sweep import coherent

    # 224 pixels are 7 patches of 32 a side (Idefics3), 14 of 16 (Gemma 3, pooled to 16 x 16 tokens).
    assert coherent(transformers.Idefics3Config()).vision_config.image_size == 256
    assert coherent(transformers.Gemma3Config()).vision_config.image_size == 256
    assert coherent(transformers.T5Gemma2Config()).encoder.vision_config.image_size == 256
    assert coherent(transformers.ColModernVBertConfig()).vlm_config.vision_config.image_size == 256


def test_a_retriever_wrapping_an_idefics_style_vlm_gets_its_images_and_their_size():
    from dtypecheck.memory.hf_inputs import hf_inputs

    vlm = transformers.ModernVBertConfig(
        vision_config={**VISION, "image_size": 64, "patch_size": 8},
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "vocab_size": 128, "global_attn_every_n_layers": 1, "pad_token_id": 0, "bos_token_id": 1,
                     "eos_token_id": 2, "cls_token_id": 3, "sep_token_id": 4},
        image_token_id=127, pixel_shuffle_factor=2,
    )  # fmt: skip
    config = transformers.ColModernVBertConfig(vlm_config=vlm, embedding_dim=16)
    with torch.device("meta"):
        model = transformers.ColModernVBertForRetrieval(config)
    found = hf_inputs(model, config, "Model", 1, 16, train=False, labels=False, real=False)
    # Before: (1, 3, 224, 224), "not enough values to unpack (expected 5, got 4)".
    assert tuple(found["pixel_values"].shape) == (1, 1, 3, 64, 64)


def _encodec():
    return transformers.EncodecConfig(
        hidden_size=16, num_filters=4, upsampling_ratios=[4, 2], codebook_size=32, codebook_dim=16,
        num_lstm_layers=1, sampling_rate=800,
    )  # fmt: skip


def test_a_codec_reads_its_padding_from_the_constants_its_constructor_made(tmp_path):
    # Encodec's convolutions keep their stride and kernel size as buffers made of Python ints, and read them to
    # pad (``.item()``); on the meta device they had no values ("aten._local_scalar_dense.default ... depends on
    # tensor values the trace does not know"). Its quantizer's integer codes cut its encoder off from the loss:
    # MemTracker's module tracking kept that graph alive until the step ended (4,874,580 bytes against the
    # estimate's 2,924,944), where a plain step frees it.
    within_5_percent_of_memtracker(tmp_path, _encodec())


def test_a_graph_no_gradient_reaches_is_freed_in_the_breakdown_too(tmp_path):
    # The per-module trace held every autograd node it attributed, so Encodec's cut-off encoder graph stayed alive
    # there: 4.8 MB in training against the plain trace's 2.9 MB. Both traces count the same step.
    import dataclasses

    _encodec().to_json_file(str(tmp_path / "config.json"))
    plain = estimate_memory(str(tmp_path), FP32, seq_len=16)
    by_module = estimate_memory(str(tmp_path), dataclasses.replace(FP32, by_module=1), seq_len=16)
    totals = [[row.bytes.total for row in report.estimates] for report in (plain, by_module)]
    assert totals[0] == totals[1]
    assert len(totals[0]) == 2


def test_a_constructors_constant_meeting_a_meta_tensor_joins_it():
    from dtypecheck.memory.fakes import on_meta_without_init

    with on_meta_without_init():
        stride = torch.tensor(2, dtype=torch.int64)
        ramp = torch.arange(4)
        joined = torch.cat([torch.tensor([7]), ramp])  # LayoutLMv3's box of its [CLS] token before its patches'
        wide = torch.tensor(list(range(65)))
    assert stride.device.type == "cpu"
    assert int(stride) == 2
    assert ramp.device.type == "meta"
    assert joined.device.type == "meta"
    assert wide.device.type == "meta"  # past CONSTANT_LIMIT elements


def test_the_sweep_gives_an_unset_head_width_the_width_over_the_heads(tmp_path):
    from benchmarks.memory_config_sweep import coherent

    # Ministral's and HunYuan's defaults leave head_dim None, which their attention raises to a power ("unsupported
    # operand type(s) for ** or pow(): 'NoneType' and 'float'").
    config = transformers.MinistralConfig(**TEXT, head_dim=None)
    assert coherent(config).head_dim == 16
    within_5_percent_of_memtracker(tmp_path, config)
    mixtral = transformers.MixtralConfig()  # whose code takes the same width for None: left as it would build
    assert coherent(mixtral).head_dim == mixtral.hidden_size // mixtral.num_attention_heads


def test_the_sweep_gives_unset_key_value_heads_one_per_head(tmp_path):
    from benchmarks.memory_config_sweep import coherent

    # Nemotron's defaults leave num_key_value_heads None, which its attention divides by.
    config = transformers.NemotronConfig(**{**TEXT, "num_key_value_heads": None})
    assert coherent(config).num_key_value_heads == 2
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_backbone_config_estimates_as_its_backbone(tmp_path):
    # A detector's backbone config (RT-DETR's ResNet) has no class in any AutoModel mapping, only AutoBackbone's
    # ("transformers has no model class for a RTDetrResNetConfig"): it is built as that backbone, fed images.
    config = transformers.RTDetrResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1])
    config.to_json_file(str(tmp_path / "config.json"))
    report = estimate_memory(str(tmp_path), FP32)
    assert report.model.model_class == "RTDetrResNetBackbone"
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_transformer_backbone_config_estimates_at_its_image_size(tmp_path):
    # ViTPose's backbone takes 256 x 192 images, its config's.
    config = transformers.VitPoseBackboneConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=[64, 48]
    )
    within_5_percent_of_memtracker(tmp_path, config)


def test_the_sweep_gives_instructblip_videos_unset_placeholders_the_last_text_id():
    from benchmarks.memory_config_sweep import coherent

    # Its defaults name no video placeholder (video_token_index None), which its forward compares the ids with:
    # released checkpoints add one past the text vocabulary's last, as BLIP-2's do for their image placeholder.
    config = coherent(transformers.InstructBlipVideoConfig())
    assert config.video_token_index == config.text_config.vocab_size - 1
    assert "image_token_index" not in vars(config)  # a setting it does not have is not made


def test_the_sweep_report_names_the_defaults_that_contradict_themselves_only_where_they_fail():
    from benchmarks.memory_config_sweep import AT_FAULT, render

    failed = "error: x/config.json: cannot trace an inference pass in float32: aten.cat.default ..."
    rows = [
        {"type": "lw_detr", "result": failed, "seconds": 1.0},
        {"type": "edgetam", "result": "ok (EdgeTamModel, 1 parameters; ...)", "seconds": 1.0},
        {"type": "blt", "result": failed, "seconds": 1.0},
    ]
    report = render(rows, ["blt", "edgetam", "lw_detr"])
    assert f"| {AT_FAULT} | 1 |" in report
    assert "| the forward pass fails on the inputs built | 1 |" in report  # blt: not in the table
    assert "| ok | 1 |" in report  # a listed type that estimates is ok
    (row,) = [line for line in report.splitlines() if line.startswith("| lw_detr |")]
    assert "the defaults contradict themselves: no feature levels" in row


def test_the_sweep_gives_nemotron_h_omnis_unset_image_placeholder_the_last_text_id():
    from benchmarks.memory_config_sweep import coherent

    # Its defaults leave image_token_id None, which its forward counts the ids of; MiniCPM-V's, also None, stay
    # None (its forward places no image tokens).
    config = coherent(transformers.CONFIG_MAPPING["nemotron_h_omni"]())
    assert config.image_token_id == config.text_config.vocab_size - 1
    assert coherent(transformers.CONFIG_MAPPING["minicpmv4_6"]()).image_token_id is None
