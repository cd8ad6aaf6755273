"""The general fixes of the real-size config sweep's failures (issue 28.1): values the trace knows (constants a
forward makes, ``torch.tensor`` of traced scalars), a hybrid model's training step without a cache, and the
inputs of video models, Qwen-VL-style vision towers and M-RoPE text, each checked at tiny size against a
computation of its own."""

from __future__ import annotations

import pytest
import torch

from dtypecheck.dtypes import lookup
from dtypecheck.memory import EstimateOptions, estimate_memory
from tests.memory._fixtures import within_5_percent_of_memtracker, write_factories

transformers = pytest.importorskip("transformers")

FP32 = EstimateOptions(dtypes=(lookup("float32"),))

KNOWN = '''
import torch
from torch import nn


class Cut(nn.Module):
    """Keeps the first ``k`` features, ``k`` read from a tensor (``how``) or given as a Python int."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.proj = nn.Linear(3, 8)

    def forward(self, x):
        if self.how == "constant":  # a tensor the forward makes of Python values (Qwen-VL's merge size)
            k = int(torch.tensor([3]).item())
        elif self.how == "scalars":  # torch.tensor of traced scalars (M-RoPE's position deltas)
            k = int(torch.tensor([torch.arange(3).max() + 1]).item())
        else:
            k = 3
        return self.proj(x[:, :k])


def constant():
    return Cut("constant"), torch.randn(4, 16)


def scalars():
    return Cut("scalars"), torch.randn(4, 16)


def plain():
    return Cut("plain"), torch.randn(4, 16)
'''


def _totals(target: str) -> list[tuple[str, int]]:
    report = estimate_memory(target, FP32)
    return [(str(row.mode), row.bytes.total) for row in report.estimates]


@pytest.mark.parametrize("factory", ["constant", "scalars"])
def test_a_size_read_from_values_the_trace_knows_costs_what_the_int_does(tmp_path, factory):
    path = tmp_path / "known.py"
    path.write_text(KNOWN, encoding="utf-8")
    # Before: "aten._local_scalar_dense ... depends on tensor values the trace does not know" (a real constant)
    # and "data is not allocated yet" (torch.tensor of fake scalars).
    assert _totals(f"{path}:{factory}") == _totals(f"{path}:plain")


def _on_meta(config):
    with torch.device("meta"):
        return transformers.AutoModel.from_config(config)


def _inputs(model, config, *, train=False):
    from dtypecheck.memory.hf_inputs import hf_inputs

    model.train(train)
    return hf_inputs(model, config, "Model", 1, 16, train=train, labels=False, real=False)


def test_a_qwen_vl_vision_tower_gets_flat_patches_and_their_grid():
    config = transformers.Qwen2_5_VLVisionConfig(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[0],
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    # 224-pixel image: 224 // (14 * 2) = 8 merged cells a side, 16 patches a side, each 3 x 2 x 14 x 14 values
    assert set(found) == {"hidden_states", "grid_thw"}
    assert tuple(found["hidden_states"].shape) == (16 * 16, 3 * 2 * 14 * 14)
    assert found["grid_thw"].tolist() == [[1, 16, 16]]


def test_m_rope_text_gets_each_tokens_kind():
    config = transformers.Glm4vConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": 128},
        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32},
        image_token_id=100,
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    vision = config.vision_config
    per_image = (vision.image_size // (vision.patch_size * vision.spatial_merge_size)) ** 2  # merged cells
    assert tuple(found["input_ids"].shape) == (1, per_image + 16)
    kinds = found["mm_token_type_ids"]
    assert kinds.dtype == torch.int32
    assert kinds.tolist() == [[1] * per_image + [0] * 16]


def test_a_video_model_gets_its_configs_frames():
    config = transformers.VideoMAEConfig(
        image_size=32, patch_size=16, num_frames=4, tubelet_size=2, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64,
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    assert tuple(found["pixel_values"].shape) == (1, 4, 3, 32, 32)


def test_a_video_model_is_within_5_percent_of_memtracker(tmp_path):
    transformers.VideoMAEConfig(
        image_size=32, patch_size=16, num_frames=4, tubelet_size=2, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64,
    ).to_json_file(str(tmp_path / "config.json"))  # fmt: skip
    report = estimate_memory(str(tmp_path), FP32, measure=True)
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    assert max(abs(m.error) for m in report.measurements) <= 0.05


def _hybrid(layers: int):
    # Jamba's first layer is a Mamba layer: a shallow copy of one layer has no attention layer in its cache.
    return transformers.JambaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=128, num_experts=2, num_experts_per_tok=1, mamba_d_state=4,
        mamba_dt_rank=4, mamba_expand=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
        expert_layer_offset=1,
    )  # fmt: skip


def test_a_hybrid_cache_of_only_linear_layers_trains_without_a_cache():
    shallow = _hybrid(1)
    with torch.device("meta"):
        model = transformers.JambaForCausalLM(shallow)
    assert _inputs(model, shallow, train=True)["use_cache"] is False
    llama = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=128
    )
    with torch.device("meta"):
        decoder = transformers.LlamaForCausalLM(llama)
    # An attention cache is kept in training, as its users run it (the stored sweep numbers depend on it).
    assert "use_cache" not in _inputs(decoder, llama, train=True)


def test_a_hybrid_model_trains(tmp_path):
    _hybrid(2).to_json_file(str(tmp_path / "config.json"))
    report = estimate_memory(str(tmp_path), FP32, seq_len=16)
    assert [str(row.mode) for row in report.estimates] == ["inference", "training"]
    assert all(row.bytes.total > 0 for row in report.estimates)


def test_the_sweep_pairs_a_vision_merger_with_its_text_width():
    from benchmarks.memory_config_sweep import coherent

    config = coherent(transformers.Qwen2_5_VLConfig())
    assert config.vision_config.out_hidden_size == config.text_config.hidden_size == 8192
    bert = transformers.BertConfig()
    assert coherent(bert).to_dict() == transformers.BertConfig().to_dict()
    # Qwen2-VL names its merger's output ``hidden_size`` (3584 by default, against a text width of 8192); the
    # tower's own width, ``embed_dim``, stays.
    qwen2 = coherent(transformers.Qwen2VLConfig())
    assert qwen2.vision_config.hidden_size == qwen2.text_config.hidden_size == 8192
    assert qwen2.vision_config.embed_dim == transformers.Qwen2VLConfig().vision_config.embed_dim == 1280


def test_the_sweep_pairs_ovis2s_visual_table_and_janus_aligner_with_their_text_width():
    from benchmarks.memory_config_sweep import coherent

    ovis2 = coherent(transformers.Ovis2Config())
    assert transformers.Ovis2Config().hidden_size == 1536
    assert ovis2.hidden_size == ovis2.text_config.hidden_size == 4096
    janus = coherent(transformers.JanusConfig())
    assert transformers.JanusConfig().vision_config.projection_dim == 2048
    assert janus.vision_config.projection_dim == janus.text_config.hidden_size == 4096
    # A contrastive model's projection is its joint space, not a text width: left as it is.
    assert coherent(transformers.CLIPConfig()).to_dict() == transformers.CLIPConfig().to_dict()
    assert coherent(transformers.LlavaConfig()).to_dict() == transformers.LlavaConfig().to_dict()


def test_a_retriever_wrapping_a_vlm_gets_its_image_tokens(tmp_path):
    # ColPali names its image token in the PaliGemma config it wraps (``vlm_config``), and only that model has
    # ``get_image_features``: no placeholder was put in the text, and the VLM refused its 16 features (224 px / 56
    # px patches = 4 x 4).
    transformers.ColPaliConfig(
        vlm_config={"model_type": "paligemma", "image_token_index": 100, "projection_dim": 32, "hidden_size": 32,
                    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                                      "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 224,
                                      "patch_size": 56, "projection_dim": 32},
                    "text_config": {"model_type": "gemma", "hidden_size": 32, "intermediate_size": 64,
                                    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                                    "head_dim": 16, "vocab_size": 128}},
        embedding_dim=16,
    ).to_json_file(str(tmp_path / "config.json"))  # fmt: skip
    report = estimate_memory(str(tmp_path), FP32, seq_len=16, measure=True)
    assert report.model.model_class == "ColPaliForRetrieval"
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    # The real step runs only if its 16 placeholders match the 16 features; its peak is the estimate's.
    assert max(abs(m.error) for m in report.measurements) <= 0.05


def test_a_multimodal_config_without_its_vision_tower_is_given_text_alone(tmp_path):
    # Gemma 4's defaults leave the vision tower out (``vision_config`` None): its forward still names
    # ``pixel_values``, and the images given reached a tower that is None.
    transformers.Gemma4Config(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "head_dim": 16, "global_head_dim": 16, "vocab_size": 128,
                     "vocab_size_per_layer_input": 128, "hidden_size_per_layer_input": 8},
        vision_config=None,
        audio_config=None,
    ).to_json_file(str(tmp_path / "config.json"))  # fmt: skip
    report = estimate_memory(str(tmp_path), FP32, seq_len=16, measure=True)
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    assert max(abs(m.error) for m in report.measurements) <= 0.05


def test_a_region_based_vlm_gets_region_features_and_boxes(tmp_path):
    # LXMERT refuses a forward without ``visual_feats`` and ``visual_pos``: 36 regions of 2048 features (its
    # config's width) and 4 box coordinates each.
    from dtypecheck.memory.hf_inputs import VISUAL_REGIONS

    config = transformers.LxmertConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=2, l_layers=1, x_layers=1, r_layers=1,
        vocab_size=128, visual_feat_dim=24, visual_pos_dim=4,
    )  # fmt: skip
    inputs = _inputs(_on_meta(config), config)
    assert VISUAL_REGIONS == 36
    assert tuple(inputs["visual_feats"].shape) == (1, 36, 24)
    assert tuple(inputs["visual_pos"].shape) == (1, 36, 4)
    config.to_json_file(str(tmp_path / "config.json"))
    report = estimate_memory(str(tmp_path), FP32, seq_len=16, measure=True)
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    # The last cross layer's vision branch and the pooler get no gradient from the loss over the language output:
    # counted with gradients and AdamW states, the training step was +9.9% against MemTracker.
    assert max(abs(m.error) for m in report.measurements) <= 0.05


def test_a_pixtral_vlm_counts_its_image_tokens_with_the_values_the_trace_knows(tmp_path):
    # Pixtral's tower reads ``image_sizes.tolist()``: counting its features outside the trace's known values
    # failed, no placeholder was put in the text, and the VLM refused its 4 features (64 px / 16 px patches = 4 x 4,
    # merged 2 x 2).
    transformers.Mistral3Config(
        vision_config={"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 64, "patch_size": 16, "head_dim": 16},
        text_config={"model_type": "mistral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 128, "head_dim": 16},
        image_token_index=100,
        spatial_merge_size=2,
    ).to_json_file(str(tmp_path / "config.json"))  # fmt: skip
    report = estimate_memory(str(tmp_path), FP32, seq_len=16, measure=True)
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    # The real step runs only if its 4 placeholders match the 4 features; its peak is the estimate's.
    assert max(abs(m.error) for m in report.measurements) <= 0.05


def _wav2vec2(tmp_path, mask_prob: float) -> list[tuple[str, int]]:
    folder = tmp_path / str(mask_prob)
    folder.mkdir(parents=True)
    transformers.Wav2Vec2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, conv_dim=(16, 16),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        mask_time_prob=mask_prob, mask_time_length=2, architectures=["Wav2Vec2ForSequenceClassification"],
    ).to_json_file(str(folder / "config.json"))  # fmt: skip
    report = estimate_memory(str(folder), FP32, seq_len=64)
    return [(str(row.mode), row.bytes.total) for row in report.estimates]


def test_wav2vec2_span_masking_in_training_is_traced(tmp_path):
    # The span mask is drawn with numpy and made a real tensor (torch.tensor(mask)): its values are known, so
    # ``hidden_states[mask] = embedding`` is sized from it instead of stopping the trace as data-dependent.
    unmasked = dict(_wav2vec2(tmp_path, 0.0))
    masked = dict(_wav2vec2(tmp_path, 0.5))
    # Inference: only ``masked_spec_embed`` differs, a parameter of hidden_size floats made only when masking.
    assert masked["inference"] == unmasked["inference"] + 32 * 4
    # Training is traced too (it raised before).
    assert masked["training"] > 0


def test_an_estimate_that_draws_from_numpy_is_the_same_whatever_numpy_s_state(tmp_path):
    # The spans are drawn from numpy's global random state: each trace seeds it, so every shallow copy masks alike
    # and the estimate does not depend on what ran before it (a third apart at this size before); the caller's
    # state is put back.
    import numpy as np

    np.random.seed(1)
    torch.manual_seed(1)
    first = _wav2vec2(tmp_path / "a", 0.5)
    after, torch_after = np.random.random(), torch.rand(3)
    np.random.seed(1)
    torch.manual_seed(1)
    assert np.random.random() == after  # the estimate left numpy's and torch's states as it found them
    assert torch.equal(torch.rand(3), torch_after)
    np.random.seed(2)
    np.random.random(1000)
    assert _wav2vec2(tmp_path / "b", 0.5) == first


def test_a_model_whose_batch_norm_cannot_train_at_batch_1_is_estimated_at_batch_2(tmp_path):
    from benchmarks.memory_config_sweep import BATCH_NORM_AT_ONE, estimate_type
    from dtypecheck.errors import InputError

    (tmp_path / "one").mkdir()
    report = estimate_type("lasr_encoder", tmp_path / "one", tiny=True)
    assert [(str(row.mode), row.batch_size) for row in report.estimates] == [("inference", 2), ("training", 2)]
    # At batch 1 the training step raises what torch's batch norm itself raises there.
    with pytest.raises(InputError, match=BATCH_NORM_AT_ONE):
        estimate_memory(str(tmp_path / "one"), FP32, seq_len=16)
    # At batch 2 the estimate is the plain one at that batch (the sweep only chose the batch).
    plain = estimate_memory(str(tmp_path / "one"), FP32, seq_len=16, batch_size=2)
    assert [row.bytes.total for row in plain.estimates] == [row.bytes.total for row in report.estimates]


def test_layerdrop_is_counted_as_keeping_every_layer(tmp_path):
    # A training step that drops no layer is the largest; LayerDrop's draw would make each estimate another.
    def estimate(layerdrop: float) -> tuple[list[int], tuple[str, ...]]:
        folder = tmp_path / str(layerdrop)
        folder.mkdir()
        transformers.Wav2Vec2Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, conv_dim=(16, 16),
            conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
            mask_time_prob=0.0, layerdrop=layerdrop, architectures=["Wav2Vec2ForSequenceClassification"],
        ).to_json_file(str(folder / "config.json"))  # fmt: skip
        report = estimate_memory(str(folder), FP32, seq_len=64)
        return [row.bytes.total for row in report.estimates], report.model.notes

    kept, kept_notes = estimate(0.0)
    dropping, notes = estimate(0.9)
    assert dropping == kept
    assert not any("LayerDrop" in note for note in kept_notes)
    assert any(note.startswith("LayerDrop (layerdrop 0.9) counted as keeping every layer") for note in notes)


def test_a_model_whose_shallow_copy_cannot_run_is_traced_whole_and_within_5_percent_of_memtracker(tmp_path):
    # ConvNeXt's "layers" are its stages, each of another width: a one-stage copy feeds the final norm 8 features
    # where it expects 64, so its blocks cannot be extrapolated; the whole model is traced instead.
    transformers.ConvNextConfig(
        num_channels=3, patch_size=4, num_stages=4, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
        image_size=32, num_labels=3,
    ).to_json_file(str(tmp_path / "config.json"))  # fmt: skip
    report = estimate_memory(str(tmp_path), FP32, measure=True)
    assert not any("extrapolated" in note for note in report.model.notes)
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    assert max(abs(m.error) for m in report.measurements) <= 0.05


MASKED = '''
import torch
from torch import nn


class Select(nn.Module):
    """Keeps the rows that are not all zero (Idefics' real images), then counts them as its own code does."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(256, 1024)

    def forward(self, x):
        keep = x.abs().sum(-1) > 0  # values the trace does not know
        rows = x[keep]
        count = int(keep.sum())
        return self.proj(rows).reshape(count, 1024)


def select():
    torch.manual_seed(0)
    return Select(), torch.randn(4096, 256) + 10.0, lambda out, inputs: out.pow(2).mean()  # every row real
'''


def test_an_unknown_boolean_mask_is_taken_as_selecting_everything(tmp_path):
    path = tmp_path / "masked.py"
    path.write_text(MASKED, encoding="utf-8")
    report = estimate_memory(f"{path}:select", FP32, measure=True)
    assert any("taken as selecting everything" in note for note in report.model.notes)
    # The real step, whose every row is kept, is what the estimate counted (MemTracker on CPU).
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    assert max(abs(m.error) for m in report.measurements) <= 0.05
    inference = next(row for row in report.estimates if str(row.mode) == "inference")
    # At least the selected rows (4096 x 256 float32) and their projection (4096 x 1024) are live at once.
    assert (inference.bytes.activations or 0) >= 4096 * (256 + 1024) * 4


def test_an_idefics_style_model_gets_each_samples_images():
    config = transformers.Idefics3Config(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 64, "patch_size": 16},
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": 128},
        scale_factor=2,
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    # (batch, images, C, H, W) beside its pixel mask; a NaFlex tower's mask over flat patches is another input.
    assert tuple(found["pixel_values"].shape) == (1, 1, 3, 64, 64)


def test_m_rope_text_without_an_image_token_is_all_text(monkeypatch):
    # MiniCPM-V's config names no image token (GLM-4V's validation refuses None: the lookup is made to find none):
    # every token is text; comparing the ids with None gave a bool.
    from dtypecheck.memory import hf_inputs as inputs_module

    monkeypatch.setattr(inputs_module, "_token_id", lambda config, *names: None)
    config = transformers.Glm4vConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": 128},
        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32},
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    kinds = found["mm_token_type_ids"]
    assert kinds.dtype == torch.int32
    assert kinds.shape == found["input_ids"].shape
    assert int(kinds.abs().sum()) == 0
    # A training step with labels goes on to make them from the ids, as the sweep's does.
    with torch.device("meta"):
        model = transformers.Glm4vForConditionalGeneration(config)
    model.train()
    found = inputs_module.hf_inputs(model, config, "CausalLM", 1, 16, train=True, labels=True, real=False)
    assert found["labels"].shape == found["input_ids"].shape


def test_a_composite_config_is_built_as_its_image_text_model_not_its_text_model():
    # Qwen3.5's config maps to Qwen3_5ForCausalLM too, which takes the text sub-config and failed on the whole one.
    from dtypecheck.memory.config_models import _head_and_class

    assert _head_and_class(transformers, transformers.Qwen3_5Config()) == (
        "ImageTextToText",
        transformers.Qwen3_5ForConditionalGeneration,
    )
    assert _head_and_class(transformers, transformers.LlamaConfig()) == ("CausalLM", transformers.LlamaForCausalLM)


def test_a_tiled_image_model_gets_its_tiles_and_their_masks():
    # Llama 3.2 Vision: one image a sample in every tile, its aspect-ratio id, the tile mask and the text's
    # cross-attention mask onto the tiles, as its processor returns them.
    config = transformers.MllamaConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_global_layers": 1,
                       "attention_heads": 2, "image_size": 32, "patch_size": 16, "max_num_tiles": 4,
                       "vision_output_dim": 64, "intermediate_layers_indices": [0]},
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": 128, "cross_attention_layers": [0], "pad_token_id": 0},
        image_token_index=100,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.MllamaForConditionalGeneration(config)
    found = _inputs(model, config)
    batch, tokens = found["input_ids"].shape
    assert tuple(found["pixel_values"].shape) == (batch, 1, 4, 3, 32, 32)
    assert tuple(found["aspect_ratio_ids"].shape) == (batch, 1)
    assert int(found["aspect_ratio_ids"].max()) <= config.vision_config.max_aspect_ratio_id
    assert tuple(found["aspect_ratio_mask"].shape) == (batch, 1, 4)
    assert tuple(found["cross_attention_mask"].shape) == (batch, tokens, 1, 4)


def test_a_naflex_tower_gets_flat_patches_their_mask_and_grid():
    config = transformers.Siglip2VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_patches=64,
        patch_size=4,
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    # 64 patches: an 8 x 8 grid, each patch 3 x 4 x 4 values, all of them real
    assert tuple(found["pixel_values"].shape) == (1, 64, 3 * 4 * 4)
    assert found["pixel_attention_mask"].tolist() == [[1] * 64]
    assert found["spatial_shapes"].tolist() == [[8, 8]]


def test_a_tower_naming_its_merge_and_temporal_patch_otherwise_gets_their_patches():
    config = transformers.MuseSparkVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, patch_size=14,
        patch_temporal=2, merge_size=2, layer_types=["full_attention"],
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    # As Qwen-VL's: 224 // (14 * 2) = 8 merged cells a side, 16 patches a side, each 3 x 2 x 14 x 14 values.
    # Before: 3 x 1 x 14 x 14 values a patch ("a and b must have same reduction dim").
    assert tuple(found["pixel_values"].shape) == (16 * 16, 3 * 2 * 14 * 14)
    assert found["grid_thw"].tolist() == [[1, 16, 16]]


def test_a_time_series_model_gets_its_context_of_each_channel():
    config = transformers.PatchTSTConfig(
        context_length=24, num_input_channels=3, patch_length=4, patch_stride=4, d_model=16, num_hidden_layers=1,
        num_attention_heads=2, ffn_dim=32,
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    assert set(found) == {"past_values"}
    assert tuple(found["past_values"].shape) == (1, 24, 3)  # before: 16 token ids, "sequence length (1)"


def test_timesfm_gets_one_series_a_sample_its_padding_and_frequency():
    config = transformers.TimesFmConfig(
        context_length=64, patch_length=32, horizon_length=32, hidden_size=16, intermediate_size=32,
        num_hidden_layers=1, num_attention_heads=2, head_dim=8,
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    assert tuple(found["past_values"].shape) == (1, 64)
    assert found["past_values_padding"].tolist() == [[0] * 64]
    assert found["freq"].tolist() == [[0]]


def test_a_keypoint_matcher_gets_an_image_pair_a_sample():
    from dtypecheck.memory.hf_inputs import hf_inputs

    config = transformers.EfficientLoFTRConfig()

    class EfficientLoFTRForKeypointMatching(torch.nn.Module):  # the task's class, by its name
        def forward(self, pixel_values):
            return pixel_values

    found = hf_inputs(EfficientLoFTRForKeypointMatching(), config, "Model", 1, 16, train=False, labels=False,
                      real=False)  # fmt: skip
    side = 224  # the EfficientLoFTR config has no image_size: the default side
    # Before: (1, 3, 224, 224), "Input must be a 5D tensor of shape (batch_size, 2, num_channels, height, width)".
    assert tuple(found["pixel_values"].shape) == (1, 2, 3, side, side)


@pytest.mark.parametrize(
    "config",
    [
        lambda: transformers.PatchTSTConfig(
            context_length=24, num_input_channels=3, patch_length=4, patch_stride=4, d_model=16, num_hidden_layers=1,
            num_attention_heads=2, ffn_dim=32,
        ),
        lambda: transformers.TimesFmConfig(
            context_length=64, patch_length=32, horizon_length=32, hidden_size=16, intermediate_size=32,
            num_hidden_layers=1, num_attention_heads=2, head_dim=8,
        ),
    ],
    ids=["patchtst", "timesfm"],
)  # fmt: skip
def test_a_time_series_model_is_within_5_percent_of_memtracker(tmp_path, config):
    config().to_json_file(str(tmp_path / "config.json"))
    report = estimate_memory(str(tmp_path), FP32, measure=True)
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    assert max(abs(m.error) for m in report.measurements) <= 0.05


def test_a_codecs_encoder_on_its_own_gets_channels_of_samples():
    config = transformers.MimiEncoderConfig() if hasattr(transformers, "MimiEncoderConfig") else None
    assert config is not None
    from dtypecheck.memory.hf_inputs import hf_inputs

    class MimiEncoderModel(torch.nn.Module):
        main_input_name = "input_values"

        def forward(self, input_values):
            return input_values

    found = hf_inputs(MimiEncoderModel(), config, "Model", 1, 16, train=False, labels=False, real=False)
    # 16 frames of 320 samples (no conv_stride in the config), one audio channel; before: (1, 5120)
    assert tuple(found["input_values"].shape) == (1, config.audio_channels, 16 * 320)


def test_an_audio_encoder_that_counts_its_real_frames_gets_a_mask_of_every_frame():
    config = transformers.AudioFlamingo3EncoderConfig(
        d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, num_mel_bins=8,
        max_source_positions=12,
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    features = found["input_features"]
    # Before: no mask, and the encoder's input_features_mask.sum(-1) failed on None.
    assert tuple(features.shape[:2]) == (1, 8)
    assert found["input_features_mask"].tolist() == [[1] * int(features.shape[-1])]


def test_a_minicpm_v_tower_gets_its_images_patch_grid():
    config = transformers.MiniCPMV4_7VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=56,
        patch_size=14,
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    assert tuple(found["pixel_values"].shape) == (1, 3, 56, 56)
    # 56 // 14 = 4 patches a side; before: no target_sizes, and the tower's position ids failed on None
    assert found["target_sizes"].tolist() == [[4, 4]]
    assert found["target_sizes"].dtype == torch.int32


def _tiny_tower() -> dict[str, int]:
    return {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "image_size": 32, "patch_size": 16}  # fmt: skip


def _qformer_vlm() -> dict[str, object]:
    """An InstructBLIP-style VLM's towers, tiny: a ViT, a Q-Former reading its own 64-id vocabulary, a Llama."""
    return {
        "vision_config": _tiny_tower(),
        "qformer_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                           "num_attention_heads": 2, "vocab_size": 64, "encoder_hidden_size": 32},
        "text_config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                        "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 128},
    }  # fmt: skip


def test_a_qformer_vlm_gets_the_instruction_for_its_qformer_and_a_placeholder_per_query(tmp_path):
    # InstructBLIP's forward requires ``qformer_input_ids`` (the instruction in the Q-Former's own vocabulary), and
    # its language model takes one feature per Q-Former query at the image placeholders. Its output holds the
    # towers' outputs first and the language model's last: the loss is taken of the text's logits.
    config = transformers.InstructBlipConfig(**_qformer_vlm(), num_query_tokens=4, image_token_index=127)
    inputs = _inputs(_on_meta(config), config)
    assert tuple(inputs["qformer_input_ids"].shape) == (1, 16)
    assert int(inputs["qformer_input_ids"].max()) < 64
    assert tuple(inputs["input_ids"].shape) == (1, 4 + 16)
    assert inputs["input_ids"][0, :4].tolist() == [127] * 4
    config.to_json_file(str(tmp_path / "config.json"))
    report = estimate_memory(str(tmp_path), FP32, seq_len=16, measure=True)
    assert not [note for note in report.model.notes if "no gradient" in note]  # every tower reached by the loss
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    assert max(abs(m.error) for m in report.measurements) <= 0.05


def test_instructblip_video_gets_clips_of_its_processors_4_frames_and_a_placeholder_per_query_and_frame(tmp_path):
    # Its config names no frame count; its forward unpacks (batch, frames, C, H, W) and its processor writes
    # num_query_tokens * 4 video placeholders. Before: "not enough values to unpack (expected 5, got 4)".
    config = transformers.InstructBlipVideoConfig(**_qformer_vlm(), num_query_tokens=3, video_token_index=127)
    inputs = _inputs(_on_meta(config), config)
    assert tuple(inputs["pixel_values"].shape) == (1, 4, 3, 32, 32)
    assert tuple(inputs["input_ids"].shape) == (1, 3 * 4 + 16)
    assert inputs["input_ids"][0, :12].tolist() == [127] * 12
    assert 127 not in inputs["input_ids"][0, 12:].tolist()
    within_5_percent_of_memtracker(tmp_path, config)


def test_kosmos2_gets_its_latent_queries_positions_before_the_text(tmp_path):
    config = transformers.Kosmos2Config(
        vision_config=_tiny_tower(),
        text_config={"embed_dim": 32, "ffn_dim": 64, "layers": 1, "attention_heads": 2, "vocab_size": 128},
        latent_query_num=8,
    )
    inputs = _inputs(_on_meta(config), config)
    assert tuple(inputs["input_ids"].shape) == (1, 8 + 16)
    assert inputs["image_embeds_position_mask"].tolist() == [[1] * 8 + [0] * 16]
    config.to_json_file(str(tmp_path / "config.json"))
    # Before: "'NoneType' object has no attribute 'to'" (no mask). MemTracker's module tracking asserted on its
    # latent queries in the real step; the measure leaves that tracking out (it only sorts bytes by module).
    report = estimate_memory(str(tmp_path), FP32, seq_len=16, measure=True)
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    assert max(abs(m.error) for m in report.measurements) <= 0.05, report.measurements


def test_a_real_step_that_fails_under_measure_is_one_line_and_exit_3(tmp_path, cli):
    factories = write_factories(tmp_path)
    result = cli("estimate-memory", f"{factories}:fails_for_real", "-d", "fp32", "--measure", "-q")
    assert result.exit_code == 3
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: measuring a real inference pass in float32 raised _LinAlgError: linalg.cholesky")
    assert "not positive-definite" in line
    assert "in forward; --traceback shows the traceback" in line


def test_xmod_gets_its_first_languages_ids_and_vitpose_its_backbones_image_size():
    xmod = transformers.XmodConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=128
    )
    found = _inputs(_on_meta(xmod), xmod)  # before: "Input language unknown"
    assert found["lang_ids"].tolist() == [0]
    vitpose = transformers.VitPoseConfig(
        backbone_config={"model_type": "vitpose_backbone", "hidden_size": 32, "intermediate_size": 64,
                         "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": [64, 48],
                         "patch_size": [16, 16], "out_indices": [1]},
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.VitPoseForPoseEstimation(vitpose)
    # The image size is the backbone config's (256 x 192 by default): before, 224 x 224, which the model refuses.
    assert tuple(_inputs(model, vitpose)["pixel_values"].shape) == (1, 3, 64, 48)
