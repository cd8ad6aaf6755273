"""A fixed sample of 40 transformers model types of every family (decoders, encoders, encoder-decoders, vision,
audio, state-space models, mixtures of experts, and CLIP, a vision-language type built as its image classifier since its
config names no architecture), built from their config class's
defaults shrunk to a tiny size (as ``benchmarks/memory_config_sweep.py --size tiny`` does) and estimated for float32
inference and an AdamW training step: each within 5% of PyTorch's MemTracker on one real step of the same model
(issue 28.1).

One test per type, so that xdist spreads them; each at 1 block and 32 tokens, to stay fast."""

from __future__ import annotations

import warnings

import pytest

transformers = pytest.importorskip("transformers")

FAMILIES = {
    "decoder": (
        "gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "falcon", "gpt_neox", "opt", "bloom",
        "olmo", "starcoder2", "cohere",
    ),
    "encoder": (
        "bert", "roberta", "albert", "distilbert", "electra", "deberta-v2", "xlm-roberta", "layoutlm", "modernbert",
    ),
    "encoder-decoder": ("t5", "bart", "mbart", "blenderbot", "mt5"),
    "vision": ("vit", "deit", "resnet", "mobilenet_v2"),
    "audio": ("whisper", "speech_to_text"),
    "state-space": ("mamba", "falcon_mamba"),
    "mixture of experts": ("mixtral", "qwen2_moe", "olmoe"),
    "vision-language": ("clip",),
}  # fmt: skip
SAMPLE = tuple(model_type for types in FAMILIES.values() for model_type in types)
TOLERANCE = 0.05


def test_the_sample_covers_40_types_of_8_families():
    assert len(SAMPLE) == len(set(SAMPLE)) == 40
    assert all(FAMILIES.values())
    assert len(FAMILIES) == 8


@pytest.mark.parametrize("model_type", SAMPLE)
def test_a_tiny_default_config_is_within_5_percent_of_memtracker(tmp_path, model_type):
    from benchmarks.memory_config_sweep import shrunk
    from dtypecheck.dtypes import lookup
    from dtypecheck.memory import EstimateOptions, estimate_memory

    transformers.logging.set_verbosity_error()
    shrunk(transformers.CONFIG_MAPPING[model_type]()).to_json_file(str(tmp_path / "config.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = estimate_memory(str(tmp_path), EstimateOptions(dtypes=(lookup("float32"),)), seq_len=32, measure=True)
    errors = {m.mode: m.error for m in report.measurements}
    assert list(errors) == ["inference", "training"]
    assert all(m.peak_bytes > 0 for m in report.measurements)
    assert max(abs(e) for e in errors.values()) <= TOLERANCE, errors
