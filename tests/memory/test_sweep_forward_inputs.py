"""Inputs the real-size config sweep's models named in their forward and were not given (issue 28.1): a W2v-BERT
encoder's stacked filter banks (Wav2Vec2-BERT, and beside their waveform NeuCodec's and XCodec2's), SegGPT's
prompt image and mask, VideoLLaMA3's merge sizes, each checked at tiny size against MemTracker."""

from __future__ import annotations

import pytest

from dtypecheck.memory import estimate_memory
from tests.memory._fixtures import fp32_options, within_5_percent_of_memtracker

transformers = pytest.importorskip("transformers")

FP32 = fp32_options()
W2V_BERT = {
    "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
    "output_hidden_size": 32, "conv_depthwise_kernel_size": 3,
}  # fmt: skip


def test_wav2vec2_bert_gets_stacked_filter_banks_not_its_mapped_extractors_samples(tmp_path):
    # Its mapped extractor is Wav2Vec2's, whose raw samples (input_values) its forward does not take ("missing 1
    # required positional argument: 'input_features'"): SeamlessM4T's filter banks, 160 values a 20 ms row.
    within_5_percent_of_memtracker(tmp_path, transformers.Wav2Vec2BertConfig(**W2V_BERT))


def _neucodec():
    return transformers.NeuCodecConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        head_dim=32, encoder_hidden_size=2, quantization_dim=96, quantization_levels=[4, 4],
        semantic_model_config={"model_type": "wav2vec2-bert", **W2V_BERT},
    )  # fmt: skip


def test_a_codec_gets_its_semantic_towers_filter_banks_beside_its_waveform(tmp_path):
    # NeuCodec's extractor needs torchaudio: its forward got the waveform alone, 2-D ("missing 1 required
    # positional argument: 'input_features'"). Now (1, 16, 160) filter banks and a (1, 1, 5120) mono waveform.
    _neucodec().to_json_file(str(tmp_path / "config.json"))
    report = estimate_memory(str(tmp_path), FP32, measure=True, seq_len=16)
    # Before: inference 6.4% under MemTracker's (153,604 of 2,404,356 bytes): its ISTFT head's two folds (col2im)
    # each return their signal in storage of their frames' size, counted at the signal's. Now 4 bytes under in
    # both: the head's periodic Hann window, a 1920-value buffer that torch.hann_window makes as a view of 1921.
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    assert max(abs(m.error) for m in report.measurements) <= 0.01, report.measurements


def test_a_codec_whose_own_extractor_runs_still_gets_its_waveform_beside_the_filter_banks(monkeypatch):
    # With torchaudio installed, NeuCodec's extractor runs and gives (frames, 160) features alone: the forward
    # then missed its waveform ("missing 1 required positional argument: 'input_values'"). The stacked rows and
    # the samples are given as without it.
    import torch

    import dtypecheck.memory.hf_media as media
    from dtypecheck.memory.hf_inputs import hf_inputs

    monkeypatch.setattr(media, "_feature_shape", lambda *args, **kwargs: ("input_features", (8, 160)))
    config = _neucodec()
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    found = hf_inputs(model, config, "Model", 1, 16, train=False, labels=False, real=False)
    assert tuple(found["input_features"].shape) == (1, 16, 160)
    assert tuple(found["input_values"].shape) == (1, 1, 16 * 320)


def test_seggpt_gets_its_prompt_image_and_mask_at_half_the_configs_height(tmp_path):
    # SegGPT's forward stacks the prompt above the input ("missing 2 required positional arguments:
    # 'prompt_pixel_values' and 'prompt_masks'"): each is (1, 3, 32, 32) of the config's 64 x 32.
    config = transformers.SegGptConfig(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=2, mlp_dim=64, image_size=[64, 32], patch_size=8,
        decoder_hidden_size=8, merge_index=1, intermediate_hidden_state_indices=[1, 3], pretrain_image_size=32,
    )  # fmt: skip
    within_5_percent_of_memtracker(tmp_path, config)


def test_a_qwen_vl_style_tower_gets_each_images_merge_size(tmp_path):
    # VideoLLaMA3's tower takes the merge beside the grid ("missing 1 required positional argument:
    # 'merge_sizes'"): 1 for an image, its config naming none.
    config = transformers.VideoLlama3VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=8
    )
    within_5_percent_of_memtracker(tmp_path, config)
