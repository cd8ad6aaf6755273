"""Models that train at one sequence length only, or on labels of another kind than their head's, which the
real-size config sweep (issue 28.1) tried at its 16 tokens: Reformer's axial position embeddings (the length their
factors multiply to), Perceiver's masked-LM decoder (its ``max_position_embeddings`` output positions), Qwen3-ASR's
chunked audio encoder (positions within a chunk, frames in whole chunks) and ShieldGemma 2's image classifier (the
token labels of the language model it hands them to). Each is checked at tiny size against MemTracker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.memory._fixtures import fp32_options, within_5_percent_of_memtracker

transformers = pytest.importorskip("transformers")


def _reformer() -> Any:
    return transformers.ReformerConfig(
        hidden_size=32, attention_head_size=16, num_attention_heads=2, feed_forward_size=64, vocab_size=64,
        axial_pos_shape=(4, 8), axial_pos_embds_dim=(16, 16), attn_layers=["local", "lsh"],
        local_attn_chunk_length=8, lsh_attn_chunk_length=8, num_buckets=4, max_position_embeddings=32,
        is_decoder=False, architectures=["ReformerForMaskedLM"],
    )  # fmt: skip


def _perceiver() -> Any:
    return transformers.PerceiverConfig(
        num_latents=8, d_latents=32, d_model=32, num_blocks=1, num_self_attends_per_block=1,
        num_self_attention_heads=2, num_cross_attention_heads=2, vocab_size=64, max_position_embeddings=64,
        architectures=["PerceiverForMaskedLM"],
    )  # fmt: skip


def _training_error_at_16_tokens(tmp_path: Path, config: Any) -> str:
    from dtypecheck.errors import InputError
    from dtypecheck.memory import estimate_memory

    config.to_json_file(str(tmp_path / "config.json"))
    with pytest.raises(InputError) as raised:
        estimate_memory(str(tmp_path), fp32_options(), seq_len=16)
    return raised.value.message()


@pytest.mark.parametrize(
    ("make_config", "length"),
    [(_reformer, 4 * 8), (_perceiver, 64)],
    ids=["reformer-axial-factors", "perceiver-output-positions"],
)
def test_a_model_that_trains_at_one_length_is_estimated_there_within_5_percent(
    tmp_path: Path, make_config: Any, length: int
) -> None:
    from benchmarks.memory_config_sweep import required_length

    config = make_config()
    # At the sweep's 16 tokens the training step raises what the model itself raises (its forward, or the loss
    # of logits of another length than its labels), and the length it names is the config's own.
    (tmp_path / "at16").mkdir()
    message = _training_error_at_16_tokens(tmp_path / "at16", config)
    assert "cannot trace a training step" in message
    assert required_length(config, message, 16) == length
    (tmp_path / "there").mkdir()
    within_5_percent_of_memtracker(tmp_path / "there", config, seq_len=length)


def test_the_sweep_row_of_such_a_model_says_the_length(tmp_path: Path) -> None:
    from benchmarks.memory_config_sweep import estimate_type, ok_result

    (tmp_path / "sweep").mkdir()
    report = estimate_type("reformer", tmp_path / "sweep", tiny=False)
    # The defaults' own axial factors, (64, 64), at real size.
    assert json.loads((tmp_path / "sweep" / "config.json").read_text())["axial_pos_shape"] == [64, 64]
    assert [(str(row.mode), row.seq_len, row.batch_size) for row in report.estimates] == [
        ("inference", 64 * 64, 1),
        ("training", 64 * 64, 1),
    ]
    assert ok_result(report, {}).endswith("; at 4096 tokens, the one length it trains at)")


@pytest.mark.parametrize(
    "message",
    [
        "ValueError: Expected input batch_size (272) to match target batch_size (1).",  # ShieldGemma 2's head
        "ValueError: Expected input batch_size (2048) to match target batch_size (32).",  # not the sweep's 16
        "ValueError: Expected input batch_size (1024) to match target batch_size (16).",  # not its positions
        "RuntimeError: shape '[1, 9, -1]' is invalid for input of size 16",
    ],
)
def test_no_other_failure_is_read_as_a_required_length(message: str) -> None:
    from benchmarks.memory_config_sweep import required_length

    assert required_length(transformers.PerceiverConfig(), message, 16) is None
    assert required_length(transformers.BertConfig(), f"{message} axial_pos_shape factors", 16) is None


def _qwen3_asr_encoder() -> Any:
    return transformers.Qwen3ASREncoderConfig(
        num_mel_bins=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
        output_dim=32, downsample_hidden_size=8, max_position_embeddings=13,
    )  # fmt: skip


def test_a_chunked_audio_encoder_gets_whole_chunks_and_no_token_limit(tmp_path: Path) -> None:
    # Before: "seq_len 16 is beyond this model's max_position_embeddings (13)", then (bins, 32) features, which
    # its encoder refuses ("a multiple of `n_window * 2` (100)"). Its positions count within one chunk.
    import torch

    from dtypecheck.memory.hf_inputs import hf_inputs
    from dtypecheck.memory.subject import SeqLimit

    config = _qwen3_asr_encoder()
    assert SeqLimit.from_config(config.to_dict()) is None
    assert SeqLimit.from_config(transformers.WhisperConfig().to_dict()) == SeqLimit(448, "max_target_positions")
    with torch.device("meta"):
        model = transformers.Qwen3ASREncoder(config)
    built = hf_inputs(model, config, "Model", 1, 16, train=False, labels=False, real=False)
    # 2 frames a token (32), padded up to a whole chunk of 2 x 50 frames (its defaults'); every frame real.
    assert tuple(built["input_features"].shape) == (1, 16, 100)
    assert tuple(built["input_features_mask"].shape) == (1, 100)
    within_5_percent_of_memtracker(tmp_path, config)


def test_frames_are_padded_to_chunks_only_where_the_config_documents_them() -> None:
    from dtypecheck.memory.family_inputs import chunks_padded

    assert chunks_padded(_qwen3_asr_encoder(), (16, 32)) == (16, 100)
    assert chunks_padded(_qwen3_asr_encoder(), (16, 200)) == (16, 200)
    assert chunks_padded(transformers.Qwen3ASREncoderConfig(n_window=5), (128, 32)) == (128, 40)
    # Qwen2.5-Omni's audio encoder has an ``n_window`` of its own (100), not documented as such chunks: its
    # features stay as built; Whisper has none.
    assert chunks_padded(transformers.Qwen2_5OmniAudioEncoderConfig(), (128, 32)) == (128, 32)
    assert chunks_padded(transformers.WhisperConfig(), (80, 3000)) == (80, 3000)


def _shieldgemma2() -> Any:
    text = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "vocab_size": 300,
        "sliding_window": 8,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    config = transformers.ShieldGemma2Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, boi_token_index=290, eoi_token_index=291,
        image_token_index=299, architectures=["ShieldGemma2ForImageClassification"],
    )  # fmt: skip
    config.yes_token_index, config.no_token_index = 5, 6  # within the tiny vocabulary (its real ones: 10784, 3771)
    return config


def test_an_image_classifier_that_hands_its_labels_to_its_language_model_trains_on_token_labels(tmp_path: Path) -> None:
    # Before: one class label, "Expected input batch_size (272) to match target batch_size (1)" in its Gemma 3's
    # loss. ShieldGemma 2 passes ``labels`` to the Gemma 3 it wraps, which takes the text's token labels.
    import torch

    from dtypecheck.memory.family_inputs import labels_go_to_a_language_model
    from dtypecheck.memory.hf_inputs import hf_inputs

    config = _shieldgemma2()
    with torch.device("meta"):
        model = transformers.ShieldGemma2ForImageClassification(config)
        plain = transformers.ViTForImageClassification(
            transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32)
        )
    assert labels_go_to_a_language_model(model)
    assert not labels_go_to_a_language_model(plain)
    built = hf_inputs(model, config, "ImageClassification", 1, 16, train=True, labels=True, real=False)
    # The text's own tokens (and image placeholders, where the trace counts them first), not one class.
    assert built["labels"] is built["input_ids"]
    assert built["labels"].dtype == torch.long
    assert built["labels"].ndim == 2
    within_5_percent_of_memtracker(tmp_path, config)


def test_an_extractors_features_are_padded_to_whole_chunks_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # The feature extractor's own (bins, frames) shape takes the same padding as the built one above: 37 frames
    # (or Whisper-style 2 per source position, where the config names them) up to whole chunks of 2 x 50.
    import torch

    from dtypecheck.memory import hf_media
    from dtypecheck.memory.hf_inputs import hf_inputs

    config = _qwen3_asr_encoder()
    asked: list[int] = []

    def extractor_shape(model_type: Any, samples: int, bins: Any, fused: Any = None) -> Any:
        asked.append(samples)
        return ("input_features", (bins, 37))

    monkeypatch.setattr(hf_media, "_feature_shape", extractor_shape)
    with torch.device("meta"):
        model = transformers.Qwen3ASREncoder(config)
    built = hf_inputs(model, config, "Model", 1, 16, train=False, labels=False, real=False)
    assert asked  # the extractor path was taken
    positions = getattr(config, "max_source_positions", 0)
    frames = 2 * positions if positions else 37
    whole = -(-frames // 100) * 100
    assert tuple(built["input_features"].shape) == (1, 16, whole)
