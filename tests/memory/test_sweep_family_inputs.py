"""Inputs that families of models take in shapes of their own, which the real-size config sweep (issue 28.1) did
not give: an audio decoder's codebooks (MusicGen flattened into the batch, Dia last), Gemma 3n's spectrogram
under its own name beside its padding mask; each checked at tiny size against MemTracker."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.memory._fixtures import within_5_percent_of_memtracker

transformers = pytest.importorskip("transformers")

ATTENTION = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}


def _musicgen():
    return transformers.MusicgenConfig(
        text_encoder={"model_type": "t5", "d_model": 32, "d_ff": 64, "num_layers": 1, "num_heads": 2,
                      "vocab_size": 128, "d_kv": 16},
        audio_encoder={"model_type": "encodec", "hidden_size": 8, "num_filters": 4, "upsampling_ratios": [2, 2],
                       "codebook_size": 64, "codebook_dim": 8},
        decoder={"model_type": "musicgen_decoder", **ATTENTION, "ffn_dim": 64, "vocab_size": 64, "num_codebooks": 4},
    )  # fmt: skip


def _dia():
    heads = {"num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64}
    return transformers.DiaConfig(
        encoder_config={**ATTENTION, **heads, "vocab_size": 128},
        decoder_config={**ATTENTION, **heads, "cross_num_attention_heads": 2, "cross_head_dim": 16,
                        "cross_num_key_value_heads": 2, "cross_hidden_size": 32, "vocab_size": 64, "num_channels": 3},
        delay_pattern=[0, 1, 2],
    )  # fmt: skip


def _inputs(model_class, config, *, train=False):
    from dtypecheck.memory.hf_inputs import hf_inputs

    with torch.device("meta"):
        model = model_class(config)
    model.train(train)
    return hf_inputs(model, config, "Seq2SeqLM", 1, 16, train=train, labels=True, real=False)


def _built_inputs(model_class: Any, config: Any, head: str) -> dict[str, Any]:
    """The inputs ``hf_inputs`` builds for ``model_class`` made of ``config`` on the meta device (batch 1, 16 tokens,
    inference)."""
    from dtypecheck.memory.hf_inputs import hf_inputs

    with torch.device("meta"):
        model = model_class(config)
    return hf_inputs(model, config, head, 1, 16, train=False, labels=False, real=False)


def test_musicgens_decoder_ids_are_its_codebooks_flattened_into_the_batch():
    # Before: (1, 16), "shape '[-1, 4, 16]' is invalid for input of size 16" in its decoder's reshape.
    found = _inputs(transformers.MusicgenForConditionalGeneration, _musicgen())
    assert tuple(found["decoder_input_ids"].shape) == (4, 16)


def test_dias_decoder_ids_are_its_processors_channels_last_and_its_labels_flattened():
    # Before: (1, 16), "shape '[1, 9, -1]' is invalid for input of size 16"; the flattened form its docs also
    # name ends in its own view of a transposed tensor, which fails in eager too.
    found = _inputs(transformers.DiaForConditionalGeneration, _dia(), train=True)
    assert tuple(found["decoder_input_ids"].shape) == (1, 16, 3)
    assert tuple(found["labels"].shape) == (3, 16)


@pytest.mark.parametrize("make_config", [_musicgen, _dia], ids=["musicgen", "dia"])
def test_an_audio_decoder_of_codebooks_is_within_5_percent_of_memtracker(tmp_path, make_config):
    within_5_percent_of_memtracker(tmp_path, make_config())


def test_gemma3n_audio_encoder_gets_its_extractors_features_and_an_unpadded_mask(tmp_path):
    # Before: "missing 1 required positional argument: 'audio_mel_mask'", with (1, 16) token ids as its audio.
    config = transformers.Gemma3nAudioConfig(
        hidden_size=32, conf_num_hidden_layers=1, conf_num_attention_heads=2, sscp_conv_channel_size=[8, 4],
        conf_conv_kernel_size=3,
    )  # fmt: skip
    found = _built_inputs(transformers.Gemma3nAudioEncoder, config, "Model")
    assert tuple(found["audio_mel"].shape) == (1, 13, 128)  # 16 x 160 samples: 13 frames of 128 bins
    assert not found["audio_mel_mask"].any()
    within_5_percent_of_memtracker(tmp_path, config)


def test_deepseek_vl_hybrid_gets_its_sam_towers_high_res_images_beside_its_siglip_towers(tmp_path):
    # Before: "Both pixel_values and high_res_pixel_values should be specified at the same time".
    from tests.memory._fixtures import TINY_TEXT

    config = transformers.DeepseekVLHybridConfig(
        text_config={"model_type": "llama", **TINY_TEXT},
        vision_config={"model_type": "siglip_vision_model", **ATTENTION, "intermediate_size": 64, "image_size": 32,
                       "patch_size": 8},
        high_res_vision_config={"model_type": "sam_vision_model", **ATTENTION, "image_size": 64, "patch_size": 16,
                                "output_channels": 16, "global_attn_indexes": [0], "mlp_dim": 64},
        image_token_id=TINY_TEXT["vocab_size"] - 1,
    )  # fmt: skip
    found = _built_inputs(transformers.DeepseekVLHybridModel, config, "Model")
    assert tuple(found["high_res_pixel_values"].shape) == (1, 3, 64, 64)
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_decision_transformer_gets_a_trajectory_of_states_actions_and_returns(tmp_path):
    # Before: its states were (1, 16) token ids, "a and b must have same reduction dim, but got [1, 16] X [17, ...]".
    config = transformers.DecisionTransformerConfig(
        state_dim=5, act_dim=3, hidden_size=32, n_layer=1, n_head=2, n_inner=64, max_ep_len=64, n_positions=128
    )
    found = _built_inputs(transformers.DecisionTransformerModel, config, "Model")
    shapes = {name: tuple(value.shape) for name, value in found.items()}
    assert shapes == {
        "states": (1, 16, 5), "actions": (1, 16, 3), "rewards": (1, 16, 1), "returns_to_go": (1, 16, 1),
        "timesteps": (1, 16), "attention_mask": (1, 16),
    }  # fmt: skip
    within_5_percent_of_memtracker(tmp_path, config)


def test_depth_pro_gets_images_whose_smallest_scaled_copy_is_one_patch(tmp_path):
    # Before: 224 pixels, "Image size 224x224 is too small to be scaled with scaled_images_ratios=[0.25, 0.5, 1]
    # when patch_size=384"; its processor's 1536 is 384 / 0.25. Here 16 / 0.25 = 64.
    tower = {"model_type": "dinov2", **ATTENTION, "num_hidden_layers": 2, "mlp_ratio": 2, "image_size": 16,
             "patch_size": 8}  # fmt: skip
    config = transformers.DepthProConfig(
        patch_size=16, image_model_config=tower, patch_model_config=tower, fov_model_config=tower,
        intermediate_hook_ids=[1, 0], intermediate_feature_dims=[16, 16], scaled_images_feature_dims=[32, 32, 16],
        fusion_hidden_size=16,
    )  # fmt: skip
    from dtypecheck.memory.family_inputs import own_image_side

    assert own_image_side(config) == 64
    assert own_image_side(transformers.DepthProConfig()) == 1536
    within_5_percent_of_memtracker(tmp_path, config)


def _clap():
    return transformers.ClapConfig(
        text_config={**ATTENTION, "intermediate_size": 64, "vocab_size": 128, "projection_dim": 16},
        audio_config={"depths": [1, 1], "num_attention_heads": [2, 2], "patch_embeds_hidden_size": 16,
                      "hidden_size": 32, "window_size": 4, "projection_dim": 16, "spec_size": 128, "num_mel_bins": 8},
        projection_dim=16,
    )  # fmt: skip


def _clvp():
    encoder = {**ATTENTION, "hidden_size": 64, "intermediate_size": 64, "vocab_size": 256, "projection_dim": 16}
    return transformers.ClvpConfig(
        text_config=encoder, speech_config=encoder, projection_dim=16,
        decoder_config={**ATTENTION, "vocab_size": 256, "max_position_embeddings": 1024, "max_text_tokens": 64},
    )  # fmt: skip


def test_a_contrastive_audio_text_model_gets_its_audio_as_clip_gets_its_images():
    # Before: text alone, "'NoneType' object has no attribute 'transpose'" (CLAP) and "conv1d() received an invalid
    # combination of arguments - got (NoneType, ...)" (CLVP). CLAP's extractor truncates as its config's
    # enable_fusion says: one spectrogram unfused (its default "fusion" stacks four, which an unfused tower refuses).
    from dtypecheck.memory.hf_inputs import hf_inputs

    for model_class, config, shape in (
        (transformers.ClapModel, _clap(), (1, 1, 1001, 8)),
        (transformers.ClvpModelForConditionalGeneration, _clvp(), (1, 80, 517)),
    ):
        with torch.device("meta"):
            model = model_class(config)
        found = hf_inputs(model, config, "Model", 1, 16, train=False, labels=False, real=False)
        assert tuple(found["input_features"].shape) == shape


@pytest.mark.parametrize("make_config", [_clap, _clvp], ids=["clap", "clvp"])
def test_a_contrastive_audio_text_model_is_within_5_percent_of_memtracker(tmp_path, make_config):
    within_5_percent_of_memtracker(tmp_path, make_config())


def test_idefics_gets_one_image_a_sample_and_the_mask_its_text_cross_attends_with(tmp_path):
    # Before: (1, 3, 32, 32) pixels, "not enough values to unpack (expected 4, got 3)" (it reads (batch, images)).
    config = transformers.IdeficsConfig(
        **{**ATTENTION, "num_hidden_layers": 2}, intermediate_size=64, vocab_size=128, additional_vocab_size=2,
        cross_layer_interval=1,
        vision_config={"embed_dim": 32, "image_size": 32, "patch_size": 8, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "intermediate_size": 64},
        perceiver_config={"resampler_n_latents": 4, "resampler_depth": 1, "resampler_n_heads": 2,
                          "resampler_head_dim": 8, "use_resampler": True},
    )  # fmt: skip
    found = _built_inputs(transformers.IdeficsModel, config, "Model")
    assert tuple(found["pixel_values"].shape) == (1, 1, 3, 32, 32)
    assert tuple(found["image_attention_mask"].shape) == (1, 16, 1)
    within_5_percent_of_memtracker(tmp_path, config)


def test_tvp_gets_its_frames_at_the_size_its_visual_prompt_pads_them_to(tmp_path):
    # Before: 224-pixel frames, "Attempting to broadcast a dimension of length 448" (its prompt's max_img_size).
    config = transformers.TvpConfig(
        backbone_config={"model_type": "resnet", "hidden_sizes": [8, 16, 16, 32], "depths": [1, 1, 1, 1],
                         "embedding_size": 8, "out_features": ["stage4"]},
        **ATTENTION, intermediate_size=64, vocab_size=128, max_img_size=64, num_frames=2, visual_prompt_size=8,
        max_grid_col_position_embeddings=8, max_grid_row_position_embeddings=8,
    )  # fmt: skip
    from dtypecheck.memory.family_inputs import own_image_side

    assert own_image_side(config) == 64
    assert own_image_side(transformers.TvpConfig()) == 448
    within_5_percent_of_memtracker(tmp_path, config)


LAGGED = {
    "prediction_length": 4, "context_length": 8, "lags_sequence": [1, 2, 3], "d_model": 16, "encoder_layers": 1,
    "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 32,
    "decoder_ffn_dim": 32, "num_time_features": 2, "num_static_categorical_features": 1, "cardinality": [3],
    "embedding_dimension": [2],
}  # fmt: skip


def test_a_lagged_time_series_gets_its_history_lags_time_features_and_horizon():
    # Before: (1, 8) past values alone, "missing 2 required positional arguments: 'past_time_features' and
    # 'past_observed_mask'".
    config = transformers.TimeSeriesTransformerConfig(**LAGGED)
    found = _built_inputs(transformers.TimeSeriesTransformerModel, config, "Model")
    assert {name: tuple(value.shape) for name, value in found.items() if name != "use_cache"} == {
        "past_values": (1, 11), "past_time_features": (1, 11, 2), "past_observed_mask": (1, 11),
        "future_values": (1, 4), "future_time_features": (1, 4, 2), "static_categorical_features": (1, 1),
    }  # fmt: skip


@pytest.mark.parametrize("name", ["TimeSeriesTransformerConfig", "InformerConfig"])
def test_a_lagged_time_series_is_within_5_percent_of_memtracker(tmp_path, name):
    within_5_percent_of_memtracker(tmp_path, getattr(transformers, name)(**LAGGED))


def test_the_sweep_fills_only_unset_values_from_the_config_classs_docstring_example():
    from benchmarks.memory_config_sweep import documented_values

    # ">>> configuration = TimeSeriesTransformerConfig(prediction_length=12)": unset in the defaults.
    assert documented_values(transformers.TimeSeriesTransformerConfig()) == {"prediction_length": 12}
    assert documented_values(transformers.TimeSeriesTransformerConfig(prediction_length=24)) == {}
    # DBRX's example shrinks set sizes (n_layers=2, d_model=256): none is read.
    assert documented_values(transformers.DbrxConfig()) == {}


def test_pix2struct_gets_its_processors_flattened_patches(tmp_path):
    # Before: (1, 16) token ids as its flattened_patches, "too many indices for tensor of dimension 2". Its image
    # processor's 2048 rows of (row id, column id, 4 x 4 x 3 values).
    config = transformers.Pix2StructConfig(
        text_config={"hidden_size": 32, "d_ff": 64, "num_layers": 1, "num_heads": 2, "d_kv": 16, "vocab_size": 128},
        vision_config={**ATTENTION, "d_ff": 64, "d_kv": 16, "patch_embed_hidden_size": 48, "seq_len": 64},
    )
    found = _built_inputs(transformers.Pix2StructForConditionalGeneration, config, "ImageTextToText")
    assert tuple(found["flattened_patches"].shape) == (1, 2048, 50)
    assert tuple(found["attention_mask"].shape) == (1, 2048)
    within_5_percent_of_memtracker(tmp_path, config)


def test_kyutai_speech_to_text_reads_a_text_stream_and_its_audio_codebooks(tmp_path):
    # Before: (1, 16) ids, "Attempting to broadcast a dimension of length 33" (its 1 + 32 streams' offsets).
    codec = {
        "model_type": "mimi", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 32, "codebook_size": 16, "num_quantizers": 3,
        "num_semantic_quantizers": 1, "codebook_dim": 8, "num_filters": 4, "upsampling_ratios": [2, 2],
        "upsample_groups": 16,
    }  # fmt: skip
    config = transformers.KyutaiSpeechToTextConfig(
        **ATTENTION, intermediate_size=64, num_key_value_heads=2, head_dim=16, vocab_size=64, codebook_vocab_size=16,
        num_codebooks=3, audio_pad_token_id=64 + 3 * 16, codec_config=codec,
    )  # fmt: skip
    found = _built_inputs(transformers.KyutaiSpeechToTextForConditionalGeneration, config, "SpeechSeq2Seq")
    assert tuple(found["input_ids"].shape) == (1, 16, 4)
    within_5_percent_of_memtracker(tmp_path, config)


def test_nemotron_transcribes_audio_model_gets_frames_padded_to_its_subsampling_factor(tmp_path):
    # Before: (1, 17, 80) features and a (1, 80) mask, "The number of spectrogram frames (17) must be a multiple
    # of `subsampling_factor` (8)". Its forward documents them padded so, as its processor pads them; its bins are
    # its speech tower's (asr_config).
    tower = {**ATTENTION, "intermediate_size": 64, "num_mel_bins": 16}
    config = transformers.Nemotron3_5TranscribeAudioConfig(
        asr_config=tower,
        diarization_config={"audio_config": tower, "head_config": {"hidden_size": 16, "audio_hidden_size": 32}},
    )
    found = _built_inputs(transformers.Nemotron3_5TranscribeAudioModel, config, "Model")
    assert tuple(found["input_features"].shape) == (1, 24, 16)
    assert tuple(found["input_features_mask"].shape) == (1, 24)
    within_5_percent_of_memtracker(tmp_path, config)


def test_gemma4s_vision_tower_gets_its_processors_patch_budget_and_positions(tmp_path):
    # Before: (1, 3, 224, 224) pixels, "missing 1 required positional argument: 'pixel_position_ids'". Its model's
    # image processor's 280 soft tokens of 1 x 1 pooling cells: a 16 x 16 grid of patches, 24 padding.
    config = transformers.Gemma4VisionConfig(
        **ATTENTION, intermediate_size=64, num_key_value_heads=2, head_dim=16, patch_size=4,
        position_embedding_size=64, pooling_kernel_size=1,
    )  # fmt: skip
    found = _built_inputs(transformers.Gemma4VisionModel, config, "Model")
    assert tuple(found["pixel_values"].shape) == (1, 280, 48)
    positions = found["pixel_position_ids"]
    assert positions[0, 255].tolist() == [15, 15]
    assert positions[0, 256:].eq(-1).all()
    within_5_percent_of_memtracker(tmp_path, config)


def test_oneformer_gets_its_task_prompt_as_its_processor_tokenizes_it():
    # Before: "OneFormerModel.forward() missing 1 required positional argument: 'task_inputs'". Its processor
    # tokenizes "the task is semantic" to ``task_seq_len`` ids of its text encoder's vocabulary.
    config = transformers.OneFormerConfig(task_seq_len=12, text_encoder_vocab_size=50)
    found = _built_inputs(transformers.OneFormerForUniversalSegmentation, config, "UniversalSegmentation")
    assert tuple(found["task_inputs"].shape) == (1, 12)
    assert found["task_inputs"].dtype == torch.long
    assert int(found["task_inputs"].min()) >= 0
    assert int(found["task_inputs"].max()) < 50
    assert tuple(found["pixel_values"].shape)[:2] == (1, 3)


def _neomme():
    return transformers.NeoMMEConfig(
        vocab_size=64, embedding_rank=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, layer_types=["sliding_attention", "full_attention"],
        sliding_window=8, architectures=["NeoMMEForMaskedLM"],
    )  # fmt: skip


def test_neomme_gets_its_images_as_flat_patches_of_the_whole_batch_and_is_within_5_percent(tmp_path):
    # Before: (1, 3, 224, 224) pixels, "pixel_values has patch width 224 but the model expects 3072". Its base
    # model documents ``(num_patches, 3 * patch_size ** 2)`` patches, as its processor cuts them.
    config = _neomme()
    found = _built_inputs(transformers.NeoMMEForMaskedLM, config, "MaskedLM")
    assert tuple(found["pixel_values"].shape) == ((224 // 32) ** 2, 3 * 32 * 32)
    within_5_percent_of_memtracker(tmp_path, config)


def _fuyu():
    return transformers.FuyuConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=60, patch_size=30, image_token_id=100, architectures=["FuyuForCausalLM"],
    )  # fmt: skip


def test_fuyu_gets_each_images_flat_patches_and_is_within_5_percent(tmp_path):
    # Before: (1, 3, 300, 300) pixels into its patch projection, "a and b must have same reduction dim, but got
    # [900, 300] X [2700, ...]". Its forward documents ``(batch_size, num_total_patches, 30 x 30 x 3)``.
    config = _fuyu()
    found = _built_inputs(transformers.FuyuForCausalLM, config, "CausalLM")
    assert tuple(found["pixel_values"].shape) == (1, (60 // 30) ** 2, 3 * 30 * 30)
    within_5_percent_of_memtracker(tmp_path, config)
