"""More general fixes of the real-size config sweep's failures (issue 28.1): LLaVA-NeXT's any-resolution tiles,
LLaVA's CLIP tower without Pixtral's image sizes, an audio tower's features from the extractor of the model
holding it, each checked at tiny size against MemTracker."""

from __future__ import annotations

import pytest
import torch

from dtypecheck.memory import estimate_memory
from tests.memory._fixtures import TINY_TEXT, fp32_options, within_5_percent_of_memtracker

transformers = pytest.importorskip("transformers")

FP32 = fp32_options()
TEXT = TINY_TEXT
CLIP = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 32,
    "patch_size": 8, "projection_dim": 32,
}  # fmt: skip


def _on_meta(config):
    with torch.device("meta"):
        return transformers.AutoModel.from_config(config)


def _inputs(model, config, *, train=False):
    from dtypecheck.memory.hf_inputs import hf_inputs

    model.train(train)
    return hf_inputs(model, config, "Model", 1, 16, train=train, labels=False, real=False)


def _llava_next():
    return transformers.LlavaNextConfig(
        vision_config=transformers.CLIPVisionConfig(**CLIP), text_config=transformers.LlamaConfig(**TEXT),
        image_grid_pinpoints=[[32, 64], [64, 32]], image_token_index=127, projector_hidden_act="gelu",
    )  # fmt: skip


def test_a_llava_next_image_is_its_base_patch_and_the_tiles_of_its_best_grid():
    config = _llava_next()
    with torch.device("meta"):
        model = transformers.LlavaNextModel(config)
    found = _inputs(model, config)
    # 32 x 32 pixels fit the 32 x 64 grid best: two tiles and the image itself, each 32 x 32.
    # Before: (1, 3, 32, 32), "split_with_sizes expects split_sizes to sum exactly to 1".
    assert tuple(found["pixel_values"].shape) == (1, 3, 3, 32, 32)
    assert found["image_sizes"].tolist() == [[32, 32]]


def test_a_llava_next_model_iswithin_5_percent_of_memtracker(tmp_path):
    within_5_percent_of_memtracker(tmp_path, _llava_next())


def test_a_llava_next_model_at_512_tokens_iswithin_5_percent_of_memtracker(tmp_path):
    # Run with use_cache=False, its text model's mask is traced as the real run makes it: none, SDPA's is_causal.
    # Before: inference +139% (2,227,628 bytes against 932,156), a (1, 1, 548, 548) boolean mask and its float copy.
    within_5_percent_of_memtracker(tmp_path, _llava_next(), seq_len=512)


def _llava():
    return transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**CLIP), text_config=transformers.LlamaConfig(**TEXT),
        image_token_index=127,
    )  # fmt: skip


def test_a_llava_with_a_clip_tower_gets_no_image_sizes():
    config = _llava()
    with torch.device("meta"):
        model = transformers.LlavaModel(config)
    # Before: image_sizes, which LLaVA's forward reads for a Pixtral tower ("'CLIPVisionModel' object has no
    # attribute 'patch_size'").
    assert "image_sizes" not in _inputs(model, config)


def test_a_llava_model_iswithin_5_percent_of_memtracker(tmp_path):
    within_5_percent_of_memtracker(tmp_path, _llava())


def test_an_audio_tower_on_its_own_gets_the_features_of_the_model_that_holds_it():
    from dtypecheck.memory.hf_config import _extractor_type

    # Nemotron's diarization tower has no extractor of its own; the diarization model holding it has.
    config = transformers.Nemotron3DiarizationAudioConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        num_mel_bins=16,
    )  # fmt: skip
    assert _extractor_type(type(config)) == "nemotron3_diarization"
    assert _extractor_type(transformers.WhisperConfig) == "whisper"
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    # (batch, frames, bins) as its extractor makes them; before: (batch, bins, frames), which its first
    # projection refuses ("a and b must have same reduction dim").
    features = _inputs(model, config)["input_features"]
    assert (features.shape[0], features.shape[-1]) == (1, 16)
    assert features.shape[1] > 1


def test_an_audio_tower_on_its_own_iswithin_5_percent_of_memtracker(tmp_path):
    within_5_percent_of_memtracker(
        tmp_path,
        transformers.Nemotron3DiarizationAudioConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
            num_mel_bins=16,
        ),
    )  # fmt: skip


def test_a_batch_only_extractor_is_given_a_batch_of_one():
    from dtypecheck.memory.hf_config import _feature_shape

    # Gemma 4's extractor refuses a single clip ("cannot select an axis to squeeze out").
    found = _feature_shape("gemma4", 2560, None)
    assert found is not None
    assert (found[0], len(found[1])) == ("input_features", 2)


def test_longformers_global_attention_check_is_answered_from_its_known_mask(tmp_path):
    # ``(attention_mask > 0).any().item()`` of the float mask the model makes of its known 0/1 mask; before:
    # "aten._local_scalar_dense ... depends on tensor values the trace does not know".
    within_5_percent_of_memtracker(
        tmp_path,
        transformers.LongformerConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=128,
            attention_window=8, max_position_embeddings=64,
        ),
    )  # fmt: skip


def test_vilts_default_pixel_mask_of_ones_is_known(tmp_path):
    # ViLT makes a pixel mask of ones (float), interpolates it to its patch grid and sizes each image's patches
    # from it; before: "aten._local_scalar_dense ... depends on tensor values the trace does not know".
    within_5_percent_of_memtracker(
        tmp_path,
        transformers.ViltConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=128,
            image_size=32, patch_size=8, max_image_length=-1,
        ),
    )  # fmt: skip


def test_the_zeros_standing_for_a_models_pixels_stay_unknown(tmp_path):
    from dtypecheck.memory.routing import Shadows

    shadows = Shadows(None)  # type: ignore[arg-type]
    with torch.device("meta"):
        pixels, ids = torch.zeros(1, 3, 4, 4), torch.zeros(1, 4, dtype=torch.long)
    shadows.values[pixels] = torch.zeros(1, 3, 4, 4)
    shadows.values[ids] = torch.zeros(1, 4, dtype=torch.long)
    shadows.forget_data({"pixel_values": pixels, "input_ids": ids})
    assert pixels not in shadows.values
    assert ids in shadows.values


def _jamba(layers: int):
    # Attention only at layer 3: copies of 1-3 blocks (layers 0-2) are Mamba alone.
    return transformers.JambaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=128, num_experts=2, num_experts_per_tok=1, mamba_d_state=4,
        mamba_dt_rank=4, mamba_expand=2, attn_layer_period=8, attn_layer_offset=3, expert_layer_period=8,
        expert_layer_offset=7,
    )  # fmt: skip


def test_a_model_whose_later_blocks_differ_from_its_first_is_not_extrapolated_from_them(tmp_path):
    _jamba(5).to_json_file(str(tmp_path / "config.json"))
    report = estimate_memory(str(tmp_path), FP32, measure=True, seq_len=16)
    # Before: "activations of 5 identical blocks extrapolated from traces with 1 and 2 blocks", which have no
    # attention layer.
    assert not any("extrapolated" in note for note in report.model.notes)
    assert max(abs(m.error) for m in report.measurements) <= 0.05, report.measurements


def _videoprism():
    return transformers.VideoPrismVisionConfig(
        image_size=36, num_frames=2, tubelet_size=[1, 18, 18], hidden_size=32, num_attention_heads=2,
        intermediate_size=64, num_spatial_layers=1, num_temporal_layers=1, num_auxiliary_layers=1,
    )  # fmt: skip


def test_a_video_tower_whose_main_input_is_its_clip_gets_a_clip():
    config = _videoprism()
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    # Before: token ids of the clip's name, (1, 16) ("not enough values to unpack (expected 5, got 2)").
    assert tuple(_inputs(model, config)["pixel_values_videos"].shape) == (1, 2, 3, 36, 36)


def test_a_video_tower_iswithin_5_percent_of_memtracker(tmp_path):
    within_5_percent_of_memtracker(tmp_path, _videoprism())


def test_a_text_tower_named_after_a_vision_parents_input_gets_token_ids():
    from dtypecheck.memory.hf_inputs import hf_inputs

    class TextTower(torch.nn.Module):
        main_input_name = "pixel_values"  # SAM3-lite-text's text model keeps its vision parent's

        def forward(self, input_ids=None, attention_mask=None):
            return input_ids

    config = transformers.PretrainedConfig(vocab_size=128)
    found = hf_inputs(TextTower(), config, "Model", 1, 16, train=False, labels=False, real=False)
    # Before: no inputs at all ("embedding(): argument 'indices' must be Tensor, not NoneType").
    assert tuple(found["input_ids"].shape) == (1, 16)


def test_a_codecs_decoder_on_its_own_gets_continuous_latents():
    config = transformers.MimiDecoderConfig() if hasattr(transformers, "MimiDecoderConfig") else None
    if config is None:
        pytest.skip("this transformers has no MimiDecoderConfig")
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    # (batch, hidden_size, frames), as its docs say; before: token ids (1, 16), which its first transposed
    # convolution refuses.
    assert tuple(_inputs(model, config)["latents"].shape) == (1, config.hidden_size, 16)


def _colqwen2():
    vlm = transformers.Qwen2VLConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": 128,
                     "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
        image_token_id=120, vision_start_token_id=121, vision_end_token_id=122, video_token_id=123,
    )  # fmt: skip
    return transformers.ColQwen2Config(vlm_config=vlm, embedding_dim=16)


def test_a_retriever_wrapping_a_qwen_vl_gets_each_samples_patches_padded_and_their_grid():
    config = _colqwen2()
    with torch.device("meta"):
        model = transformers.ColQwen2ForRetrieval(config)
    found = _inputs(model, config)
    # 224 pixels: 16 patches a side of 3 x 2 x 14 x 14 values, one image a sample, as ColQwen2's processor pads
    # them; before: (256, 588) flat patches of the retriever's own (absent) vision config.
    assert tuple(found["pixel_values"].shape) == (1, 16 * 16, 3 * 2 * 14 * 14)
    assert found["image_grid_thw"].tolist() == [[1, 16, 16]]
    assert tuple(found["input_ids"].shape) == (1, 8 * 8 + 16)  # a placeholder per merged cell, then the text


def test_a_retriever_wrapping_a_qwen_vl_iswithin_5_percent_of_memtracker(tmp_path):
    within_5_percent_of_memtracker(tmp_path, _colqwen2())


def test_the_sweep_pairs_a_wrapped_vlms_merger_with_its_text_width():
    from benchmarks.memory_config_sweep import coherent

    colqwen2 = coherent(transformers.ColQwen2Config())
    vlm = colqwen2.vlm_config
    assert vlm.vision_config.hidden_size == vlm.text_config.hidden_size


def test_paddleocr_vl_gets_each_patch_unflattened_for_its_2d_convolution(tmp_path):
    # Its vision config names no frames a patch (no temporal patch size), and its embedding convolves each patch
    # as given, (patches, C, 14, 14); before: Qwen-VL's flat (patches, C x 14 x 14) rows, and "not enough values to
    # unpack (expected 5, got 3)".
    config = transformers.PaddleOCRVLConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
                     "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 56, "patch_size": 14, "spatial_merge_size": 2},
        image_token_id=120, video_token_id=121, vision_start_token_id=122, vision_end_token_id=123,
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    # 56 pixels: 4 x 4 patches, merged 2 x 2 into 4 image tokens
    assert tuple(found["pixel_values"].shape) == (16, 3, 14, 14)
    assert found["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert found["input_ids"][0, :4].tolist() == [120] * 4
    within_5_percent_of_memtracker(tmp_path, config)


def test_voxtral_realtime_gets_the_audio_of_each_text_token_beside_the_text(tmp_path):
    # Its forward adds each token's audio to the token's embedding: the spectrogram's audio_length_per_tok (8)
    # frames a token, (batch, bins, frames); before: text alone, and "You must specify exactly one of
    # input_features or encoder_inputs_embeds".
    config = transformers.VoxtralRealtimeConfig(
        audio_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                      "head_dim": 16, "num_mel_bins": 16, "vocab_size": 128},
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128},
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    assert tuple(found["input_ids"].shape) == (1, 16)
    assert tuple(found["input_features"].shape) == (1, 16, 16 * 8)
    within_5_percent_of_memtracker(tmp_path, config)


def _hunyuan_vl():
    return transformers.HunYuanVLConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 2, 2]}},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "num_key_value_heads": 2, "out_hidden_size": 32, "text_hidden_size": 32, "patch_size": 16,
                       "spatial_merge_size": 2, "min_image_size": 128, "max_image_size": 256},
        image_token_id=120,
    )  # fmt: skip


def test_hunyuan_vl_gets_its_smallest_image_and_a_placeholder_for_each_row_separator_and_boundary(tmp_path):
    # Its config names no image size but the processor's smallest (min_image_size 128: 8 x 8 patches of 16 px),
    # and its tower adds a token after each row of merged patches and one before and after the image: 4 rows of
    # 4 + 1, + 2 = 22 placeholders, where the grid says 16. Before: the 224-pixel default and the grid's count
    # ("Image features and image tokens do not match: ... features 58").
    config = _hunyuan_vl()
    found = _inputs(transformers.AutoModel.from_config(config), config)  # on CPU: the count runs for real
    assert tuple(found["pixel_values"].shape) == (64, 3 * 16 * 16)
    assert found["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert found["input_ids"][0, :22].tolist() == [120] * 22
    assert 120 not in found["input_ids"][0, 22:].tolist()
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_low_frame_rate_speech_encoder_gets_rows_of_stacked_mel_frames(tmp_path):
    # Fun-ASR-Nano's encoder takes each row as num_stacked_frames (7) mel frames of num_mel_bins (16 here)
    # stacked, (batch, rows, 16 x 7), as its extractor makes them; before: (batch, bins, frames), which its
    # position embedding's add refused ("Attempting to broadcast a dimension of length 560").
    config = transformers.FunAsrNanoEncoderConfig(
        num_mel_bins=16, hidden_size=32, num_attention_heads=2, intermediate_size=64, num_hidden_layers=2,
        num_stacked_frames=7, num_timestamp_prediction_layers=1,
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    assert tuple(found["input_features"].shape) == (1, 16, 16 * 7)
    assert found["input_features_mask"].tolist() == [[1] * 16]
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_tower_that_documents_whole_token_pixels_gets_them_and_a_grid_of_tokens(tmp_path):
    # Inkling 2's tower takes each image token's pixels whole, (tokens, patch x merge, patch x merge, channels), and
    # its grid counted in image tokens, as its forward documents them; before: Qwen-VL's flat patches, which its
    # embedding's reshape refused ("shape '[-1, 2, 20, 2, 20, 1200]' is invalid"). 224 pixels: 56 patches of 4 a
    # side, merged 2 x 2 into 28 x 28 tokens of 8 x 8 pixels.
    config = transformers.Inkling2VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, patch_size=4,
        spatial_merge_size=2, posemb_grid_size=4, projection_hidden_dim=32, text_hidden_size=32,
    )  # fmt: skip
    found = _inputs(_on_meta(config), config)
    assert tuple(found["pixel_values"].shape) == (28 * 28, 8, 8, 3)
    assert found["image_grid_thw"].tolist() == [[1, 28, 28]]
    within_5_percent_of_memtracker(tmp_path, config)


def test_nemotron_h_omni_gets_flat_patches_and_their_grid_in_whole_pixel_shuffle_cells(tmp_path):
    # Its RADIO tower takes flat patches and image_grid_hw (rows, columns), and its pixel shuffle (downsample_ratio
    # 0.5) merges 2 x 2 patches into one image token; before: (batch, C, H, W) pixels and no grid ("'NoneType'
    # object has no attribute 'prod'"). 32 pixels: 4 x 4 patches of 8, 4 image tokens.
    config = transformers.CONFIG_MAPPING["nemotron_h_omni"](
        text_config={"model_type": "nemotron_h", "vocab_size": 128, "hidden_size": 32, "num_attention_heads": 2,
                     "layers_block_type": ["full_attention", "mlp"], "num_key_value_heads": 2, "head_dim": 16,
                     "intermediate_size": 64},
        vision_config={"model_type": "radio", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "patch_size": 8, "image_size": 32, "video_temporal_patch_size": 2},
        vision_hidden_size=32, projector_hidden_size=32, image_token_id=120,
    )  # fmt: skip
    found = _inputs(transformers.NemotronH_Omni_Reasoning_V3(config), config)  # on CPU: the count runs for real
    assert tuple(found["pixel_values"].shape) == (16, 3 * 8 * 8)
    assert found["image_grid_hw"].tolist() == [[4, 4]]
    assert found["input_ids"][0, :4].tolist() == [120] * 4
    assert 120 not in found["input_ids"][0, 4:].tolist()
    within_5_percent_of_memtracker(tmp_path, config)
    # Its tower on its own takes a batch of one size dense, as before (the grid is for packed sizes).
    alone = _inputs(_on_meta(config.vision_config), config.vision_config)
    assert (tuple(alone["pixel_values"].shape), "image_grid_hw" in alone) == ((1, 3, 32, 32), False)


def test_a_vision_language_action_model_gets_its_action_tokens_cameras_and_image_placeholders(tmp_path):
    # PI0's action expert reads the robot's state and chunk_size (4) action tokens at its width (32) after the
    # VLM's prefix: action_embeds (1, 1 + 4, 32); its cameras' mask (one camera, real) beside the images, and
    # its PaliGemma's num_image_tokens (16) placeholders a camera. Before: "missing 1 required positional
    # argument: 'action_embeds'".
    gemma = {"model_type": "gemma", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 128}  # fmt: skip
    vlm = {
        "model_type": "paligemma", "image_token_id": 120, "projection_dim": 32, "text_config": gemma,
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                          "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 32, "patch_size": 8,
                          "projection_dim": 32},
    }  # fmt: skip
    config = transformers.PI0Config(
        vlm_config=vlm, dit_config=dict(gemma), chunk_size=4, max_state_dim=8, max_action_dim=8
    )
    found = _inputs(_on_meta(config), config)
    assert tuple(found["action_embeds"].shape) == (1, 1 + 4, 32)
    assert tuple(found["pixel_values"].shape) == (1, 1, 3, 32, 32)
    assert found["pixel_attention_mask"].tolist() == [[True]]
    assert found["input_ids"][0, :16].tolist() == [120] * 16
    assert 120 not in found["input_ids"][0, 16:].tolist()
    within_5_percent_of_memtracker(tmp_path, config)
