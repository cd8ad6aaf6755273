"""Inputs of towers that the real-size config sweep's models take from another tower or a state (issue 28.1):
BLIP-2's Q-Former's query tokens and image features, MuseGlimmer's drafter's noise block and target hidden states,
VibeVoice's acoustic tokenizer's waveform channels and latents, each checked at tiny size against MemTracker."""

from __future__ import annotations

import pytest

from tests.memory._fixtures import within_5_percent_of_memtracker

transformers = pytest.importorskip("transformers")


def test_a_q_former_gets_its_query_tokens_and_its_vision_towers_features(tmp_path):
    # "missing 1 required positional argument: 'query_embeds'": BLIP-2's 32 query tokens, attending to 257 image
    # features (a class token and 16 x 16 patches of its default vision tower) of ``encoder_hidden_size``.
    config = transformers.Blip2QFormerConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, encoder_hidden_size=24,
        cross_attention_frequency=1,
    )  # fmt: skip
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_block_drafter_gets_its_noise_block_and_its_targets_hidden_states(tmp_path):
    # "missing 1 required positional argument: 'context_hidden_states'": a block of 4 noise embeddings and 16
    # tokens of the target's 3 chosen layers' hidden states, side by side.
    config = transformers.MuseGlimmerAssistantConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        head_dim=16, vocab_size=128, block_size=4, target_layer_ids=[0, 1, 2],
    )  # fmt: skip
    within_5_percent_of_memtracker(tmp_path, config)


TOKENIZER = {"hidden_size": 8, "num_filters": 4, "downsampling_ratios": [2, 4], "depths": [1, 1, 1]}


@pytest.mark.parametrize(
    "make",
    [
        # Its waveform was (1, 5120) ("Dimension out of range" in its first ConvNeXt block): (1, 1, 128) now,
        # 16 frames of its 8-sample stride.
        lambda: transformers.VibeVoiceAcousticTokenizerConfig(**TOKENIZER),
        # "missing 1 required positional argument: 'hidden_states'": the waveform for the encoder, and (1, 8, 16)
        # latents for the decoder.
        lambda: transformers.VibeVoiceAcousticTokenizerEncoderConfig(**TOKENIZER),
        lambda: transformers.VibeVoiceAcousticTokenizerDecoderConfig(**TOKENIZER),
    ],
    ids=["whole", "encoder", "decoder"],
)
def test_an_acoustic_tokenizer_gets_its_waveforms_channels_and_its_halves_their_inputs(tmp_path, make):
    within_5_percent_of_memtracker(tmp_path, make())


def test_a_head_passing_use_cache_on_in_its_kwargs_runs_without_a_cache_that_has_no_length(tmp_path):
    # GraniteMoeHybrid's defaults are all linear-attention layers, and its head passes ``use_cache`` on in its
    # kwargs to a model that takes the config's True: "`get_seq_length` can only be called on Attention layers".
    config = transformers.GraniteMoeHybridConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=128, num_local_experts=2, num_experts_per_tok=1, shared_intermediate_size=32, mamba_d_state=8,
        mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1,
    )  # fmt: skip
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_speech_encoder_decoder_gets_its_encoders_audio_not_token_ids(tmp_path):
    # Its main input is the generic ``inputs``, given token ids, which its Wav2Vec2 encoder's group norm refused
    # ("mean(): could not infer output dtype ... Got: torch.int64"): now its encoder's raw samples.
    encoder = transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, conv_dim=[16, 16],
        conv_stride=[5, 4], conv_kernel=[10, 4], num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2,
    )  # fmt: skip
    decoder = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=128,
        is_decoder=True, add_cross_attention=True,
    )  # fmt: skip
    config = transformers.SpeechEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_tower_fed_another_towers_states_gets_them_not_token_ids(tmp_path):
    # Nemotron 3.5 Transcribe's word-timestamp head takes its speech encoder's frames as ``inputs_embeds``: it
    # was given (1, 16) token ids ("Dimension out of range" transposing them), now (1, 16, 32) states.
    config = transformers.Nemotron3_5TranscribeWordTimestampConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=128, blank_token_id=127,
    )  # fmt: skip
    within_5_percent_of_memtracker(tmp_path, config)


def test_the_sweep_pairs_llama4s_vision_tower_and_projector_with_its_adapter():
    from benchmarks.memory_config_sweep import coherent

    # Its defaults' adapter is Scout's (5632 = 1408 / 0.5**2 inputs, 4096 outputs); its tower 768 wide, and its
    # projector reading 7680: "a and b must have same reduction dim" in the adapter, then in the projector.
    vision = coherent(transformers.Llama4Config()).vision_config
    assert (vision.hidden_size, vision.vision_output_dim) == (1408, 4096)


def test_a_coherent_llama4_with_its_image_is_within_5_percent(tmp_path):
    vision = {
        "hidden_size": 32, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
        "image_size": 56, "patch_size": 14, "pixel_shuffle_ratio": 0.5, "projector_input_dim": 64,
        "projector_output_dim": 64, "vision_output_dim": 64,
    }  # fmt: skip
    text = {
        "hidden_size": 32, "intermediate_size": 64, "intermediate_size_mlp": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
        "num_local_experts": 2, "num_experts_per_tok": 1,
    }  # fmt: skip
    config = transformers.Llama4Config(vision_config=vision, text_config=text, image_token_index=120)
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_vlm_whose_projector_maps_patch_counts_to_queries_gets_an_image_of_the_largest(tmp_path):
    # Aria's projector takes 1225 or 4900 patches an image ("Number of patches 49 not found in
    # patch_to_query_dict" of the vision config's 224 px): here 4 or 16 patches of 14 px (not 42 px's 9), so a
    # 56 px image and 8 image placeholders in the text.
    config = transformers.AriaConfig(
        vision_config={"model_type": "idefics3_vision", "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 42, "patch_size": 14},
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": 128, "moe_num_experts": 2, "moe_topk": 1,
                     "moe_intermediate_size": 32},
        projector_patch_to_query_dict={4: 4, 16: 8}, image_token_index=120,
    )  # fmt: skip
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_qwen_vl_style_vlm_gets_each_images_merge_beside_its_grid(tmp_path):
    # VideoLLaMA3 reads ``image_merge_sizes`` beside the grid ("'NoneType' object has no attribute 'tolist'"):
    # 1 an image, as its processor gives them, and as its 14 x 14 placeholders were counted.
    config = transformers.VideoLlama3Config(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "patch_size": 16},
        text_config={"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 128},
        image_token_id=120,
    )  # fmt: skip
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_windowed_backbones_detector_gets_an_image_whose_grid_its_windows_divide(tmp_path):
    # RF-DETR's DINOv2 splits its grid into 2 x 2 windows here: its 70 px (5 patches a side) made the window
    # partition fail ("shape '[1, 2, 2, 2, 2, -1]' is invalid"); now 84 px, 6 patches.
    config = transformers.RfDetrConfig(
        backbone_config={"model_type": "rf_detr_dinov2", "hidden_size": 32, "num_hidden_layers": 2,
                         "num_attention_heads": 2, "image_size": 70, "patch_size": 14, "num_windows": 2,
                         "window_block_indexes": [0], "out_features": ["stage1", "stage2"]},
        d_model=32, decoder_ffn_dim=64, decoder_layers=1, decoder_self_attention_heads=2,
        decoder_cross_attention_heads=2, num_queries=10, group_detr=2, intermediate_size=64, c2f_num_blocks=1,
    )  # fmt: skip
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_vlm_whose_image_features_need_its_tile_mask_gets_every_tile_real(tmp_path):
    # GraniteDocling's ``get_image_features`` requires the (batch, tiles) mask of real tiles ("'NoneType' object
    # has no attribute 'sum'"), and its image placeholders are counted with it: 4 x 4 patches of one 64 px tile,
    # shuffled by 2, 4 tokens.
    config = transformers.GraniteDoclingConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 64, "patch_size": 16, "out_hidden_size": 32, "scale_factor": 2,
                       "deepstack_visual_indexes": [0], "use_fine_route": False},
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": 128, "pad_token_id": 0, "bos_token_id": 1,
                     "eos_token_id": 2},
        image_token_id=120, pad_token_id=0,
    )  # fmt: skip
    within_5_percent_of_memtracker(tmp_path, config)
