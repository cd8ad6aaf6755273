"""Hugging Face configs of every kind transformers builds (issue 12), and training checkpoints whose trainer
state is spelled in any of the common ways."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

T5 = {"model_type": "t5", "vocab_size": 96, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4}
VIT = {
    "model_type": "vit",
    "image_size": 32,
    "patch_size": 8,
    "num_channels": 3,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
}
BART = {
    "model_type": "bart",
    "vocab_size": 96,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 64,
}
WHISPER = {
    "model_type": "whisper",
    "vocab_size": 96,
    "num_mel_bins": 16,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_source_positions": 20,
    "max_target_positions": 32,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 1,
}


def _distinct_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


@pytest.mark.parametrize(
    ("config", "auto"),
    [
        (T5, "AutoModelForSeq2SeqLM"),
        (VIT, "AutoModelForImageClassification"),
        (BART, "AutoModelForSeq2SeqLM"),
        (WHISPER, "AutoModelForSpeechSeq2Seq"),
    ],
    ids=["t5", "vit", "bart", "whisper"],
)
def test_encoder_decoder_and_vision_configs(cli, tmp_path, config, auto):
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    result = cli("estimate-memory", str(tmp_path), "-d", "fp32", "--seq-len", "8", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    # Independently: the same head built for real by transformers from the same file.
    built = getattr(transformers, auto).from_config(transformers.AutoConfig.from_pretrained(str(tmp_path)))
    assert doc["model"]["parameters"] == _distinct_parameters(built)
    assert doc["model"]["architecture"] == config["model_type"]
    for row in doc["estimates"]:
        assert row["bytes"]["activations"] > 0


def test_t5_measure_matches_its_estimate(cli, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(T5), encoding="utf-8")
    doc = cli("estimate-memory", str(tmp_path), "-d", "fp32", "--seq-len", "8", "--measure", "-f", "json").json()
    assert [m["mode"] for m in doc["measurements"]] == ["inference", "training"]
    assert all(abs(m["error"]) < 0.01 for m in doc["measurements"])


def test_config_that_cannot_be_traced_exits_3_in_one_line(cli, tmp_path):
    # GPT-J with a rotary dimension larger than its heads: transformers builds it, no forward pass can run.
    config = {"model_type": "gptj", "vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 2, "rotary_dim": 64}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    result = cli("estimate-memory", str(tmp_path), "--seq-len", "8")
    assert result.exit_code == 3
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ")
    assert "cannot trace" in lines[0]
    assert "Traceback" not in result.stderr


def test_config_transformers_cannot_read_exits_3_in_one_line(cli, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-model", "hidden_size": 8}))
    result = cli("estimate-memory", str(tmp_path))
    assert result.exit_code == 3
    assert len(result.stderr.strip().splitlines()) == 1
    assert "transformers cannot read this config" in result.stderr


@pytest.mark.parametrize(
    "key",
    [
        "optimizer",
        "optimizer_state",
        "optimizer_states",
        "optimizer_state_dict",
        "optim",
        "optim_state",
        "opt_state",
        "optimizers",
        "lr_scheduler",
        "scheduler",
        "scaler",
    ],
)
def test_training_checkpoint_trainer_state_of_any_spelling(cli, tmp_path, key):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    path = tmp_path / "train.pt"
    torch.save({"model": model.state_dict(), key: state, "epoch": 3}, path)
    doc = cli("estimate-memory", str(path), "-f", "json", "-d", "fp32").json()
    assert doc["model"]["parameters"] == 16 * 32 + 32 + 32 * 4 + 4


def test_mixture_of_experts_config_in_float32(cli, tmp_path):
    # transformers runs its experts through aten._grouped_mm, whose meta kernel takes bfloat16 only.
    config = {
        "model_type": "mixtral",
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    }
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    result = cli("estimate-memory", str(tmp_path), "-d", "fp32", "--seq-len", "16", "--measure", "-f", "json")
    assert result.exit_code == 0, result.stderr
    # Balanced routing against the real router's imbalance (README: +3.0% for Mixtral in training).
    assert all(abs(m["error"]) < 0.015 for m in result.json()["measurements"])


@pytest.mark.parametrize(
    ("architecture", "head"), [("BertModel", "AutoModel"), ("BertForMaskedLM", "AutoModelForMaskedLM")]
)
def test_the_class_built_follows_architectures_and_is_named(cli, tmp_path, architecture, head):
    bert = {
        "model_type": "bert",
        "vocab_size": 64,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "architectures": [architecture],
    }
    (tmp_path / "config.json").write_text(json.dumps(bert), encoding="utf-8")
    result = cli("estimate-memory", str(tmp_path), "-d", "fp32", "--seq-len", "8", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["model"]["model_class"] == architecture
    built = getattr(transformers, head).from_config(transformers.AutoConfig.from_pretrained(str(tmp_path)))
    assert type(built).__name__ == architecture
    assert doc["model"]["parameters"] == _distinct_parameters(built)
    table = cli("estimate-memory", str(tmp_path), "-d", "fp32", "--seq-len", "8").stdout
    assert f"(config, bert as {architecture})" in table
