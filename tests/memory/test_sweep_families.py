"""Fixes of the real-size config sweep's failures by family (issue 28.1): GLM-4V's rope sections fitted to its
rotary width, each checked at tiny size against MemTracker."""

from __future__ import annotations

import pytest

from dtypecheck.dtypes import lookup
from dtypecheck.errors import InputError
from dtypecheck.memory import EstimateOptions, estimate_memory

transformers = pytest.importorskip("transformers")

FP32 = EstimateOptions(dtypes=(lookup("float32"),))
TEXT = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 2, "vocab_size": 128,
}  # fmt: skip


def _within_5_percent_of_memtracker(tmp_path, config, seq_len=16) -> None:
    config.to_json_file(str(tmp_path / "config.json"))
    report = estimate_memory(str(tmp_path), FP32, measure=True, seq_len=seq_len)
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    assert max(abs(m.error) for m in report.measurements) <= 0.05, report.measurements


def test_the_sweep_fits_glm4v_rope_sections_to_its_rotary_width(tmp_path):
    from benchmarks.memory_config_sweep import rope_sections_fit

    # 16-wide heads rotate 8 frequencies, which the code's default sections [8, 12, 12] (32) do not split.
    config = transformers.Glm4vTextConfig(**TEXT)
    config.to_json_file(str(tmp_path / "config.json"))
    with pytest.raises(InputError) as failed:
        estimate_memory(str(tmp_path), FP32)
    assert rope_sections_fit(config, failed.value.message())
    assert config.rope_parameters["mrope_section"] == [2, 3, 3]
    _within_5_percent_of_memtracker(tmp_path, config)


def test_the_sweep_leaves_other_failures_alone():
    from benchmarks.memory_config_sweep import rope_sections_fit

    config = transformers.Glm4vTextConfig(**TEXT)
    message = "cannot trace: aten.view.default in module 'connector': RuntimeError: shape '[1, 7]' is invalid"
    assert not rope_sections_fit(config, message)
    assert "mrope_section" not in config.rope_parameters
