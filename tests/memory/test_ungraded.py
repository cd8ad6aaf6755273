"""Parameters the traced step gives no gradient (a head the loss does not read) hold no gradient and no optimizer
state: torch's optimizers skip a parameter whose ``.grad`` is None. LXMERT's tiny training step was +9.9% and
SigLIP2's +8.6% against MemTracker while every parameter was counted."""

from __future__ import annotations

import dataclasses

import pytest

from dtypecheck.dtypes import lookup
from dtypecheck.memory import EstimateOptions, estimate_memory
from dtypecheck.memory.scaling import ScaledProfile, scale
from dtypecheck.memory.tracing import ActivationProfile, ExtrapolatedProfile, linear_profiles
from dtypecheck.memory_words import Mode, Strategy

FP32 = EstimateOptions(dtypes=(lookup("float32"),), modes=(Mode.training,))

HEADLESS = """
import torch
from torch import nn


class Headless(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 100)  # never called

    def forward(self, x):
        return self.body(x)


def headless():
    torch.manual_seed(0)
    return Headless(), torch.randn(4, 8)
"""


@pytest.fixture
def headless(tmp_path):
    path = tmp_path / "headless.py"
    path.write_text(HEADLESS, encoding="utf-8")
    return f"{path}:headless"


def test_a_head_the_loss_never_reaches_gets_no_gradient_and_no_adamw_state(headless):
    report = estimate_memory(headless, FP32, measure=True)
    (row,) = report.estimates
    body = 8 * 8 + 8  # the head's 8 x 100 + 100 values get nothing
    assert row.bytes.parameters == 4 * (body + 8 * 100 + 100)
    assert row.bytes.gradients == 4 * body
    # AdamW: exp_avg and exp_avg_sq per value, a float32 step per tensor, for the body's weight and bias alone
    assert row.bytes.optimizer_states == 2 * 4 * body + 2 * 4
    (measured,) = report.measurements
    assert measured.error == 0.0, measured
    (note,) = [n for n in report.model.notes if "no gradient" in n]
    assert note.startswith(f"{8 * 100 + 100:,} of {body + 8 * 100 + 100:,} trainable parameters get no gradient")
    assert "does not reach head)" in note


def test_zero_keeps_states_for_every_parameter_ddp_and_fsdp_only_for_those_stepped(headless):
    everything, body = 8 * 8 + 8 + 8 * 100 + 100, 8 * 8 + 8
    by_strategy: dict[str, tuple[int, int]] = {}
    for strategy in (Strategy.ddp, Strategy.zero1, Strategy.zero2, Strategy.fsdp):
        options = EstimateOptions(dtypes=(lookup("float32"),), modes=(Mode.training,), strategy=strategy, world_size=2)
        (row,) = estimate_memory(headless, options).estimates
        by_strategy[str(strategy)] = (row.bytes.gradients, row.bytes.optimizer_states)
    # DeepSpeed's flat fp32 partitions hold all parameters; DDP's buckets have a slot for each (its second term).
    assert by_strategy["zero1"] == (4 * everything, (2 * 4 * everything + 4 * 4) // 2)
    assert by_strategy["zero2"] == (4 * everything // 2, (2 * 4 * everything + 4 * 4) // 2)
    assert by_strategy["ddp"] == (4 * body + 4 * everything, 2 * 4 * body + 2 * 4)
    assert by_strategy["fsdp"] == (4 * body // 2, (2 * 4 * body + 2 * 4) // 2)


def test_by_module_gives_the_unreached_head_no_gradient_and_still_sums_to_the_totals(cli, headless):
    doc = cli("estimate-memory", headless, "-d", "fp32", "-m", "training", "--by-module", "-f", "json").json()
    rows = {m["module"]: m for m in doc["modules"][0]["modules"]}
    assert (rows["head"]["gradient_bytes"], rows["head"]["optimizer_bytes"]) == (0, 0)
    assert (rows["body"]["gradient_bytes"], rows["body"]["optimizer_bytes"]) == (4 * 72, 2 * 4 * 72 + 8)
    totals = doc["estimates"][0]["bytes"]
    assert sum(m["gradient_bytes"] for m in rows.values()) == totals["gradients"]
    assert sum(m["optimizer_bytes"] for m in rows.values()) == totals["optimizer_states"]


def _ungraded(*names: str) -> ActivationProfile:
    return ActivationProfile(10, ((10, 0),), 1, ungraded=names)


FULL = [f"layers.{i}.{part}" for i in range(6) for part in ("a", "v")] + ["pooler.weight"]


def test_a_deep_models_unreached_parameters_are_grown_per_block_from_the_shallow_traces():
    last_block = ExtrapolatedProfile(
        _ungraded("layers.0.v", "pooler.weight"), _ungraded("layers.1.v", "pooler.weight"), 1, 6
    )
    assert last_block.ungraded_of(FULL) == {"layers.5.v", "pooler.weight"}
    every_block = ExtrapolatedProfile(_ungraded("layers.0.v"), _ungraded("layers.0.v", "layers.1.v"), 1, 6)
    assert every_block.ungraded_of(FULL) == {f"layers.{i}.v" for i in range(6)}
    # Fewer with more blocks, or more than the model holds: not a per-block pattern, so every parameter counts.
    shrinking = ExtrapolatedProfile(_ungraded("layers.0.v", "layers.0.a"), _ungraded("layers.1.v"), 1, 6)
    assert shrinking.ungraded_of(FULL) == frozenset()
    too_many = ExtrapolatedProfile(_ungraded("layers.0.v"), _ungraded("layers.0.v", "layers.1.v", "layers.1.a"), 1, 9)
    assert too_many.ungraded_of(FULL) == frozenset()
    # A whole trace names them itself; names the inventory does not hold are not taken.
    assert _ungraded("layers.2.a", "elsewhere").ungraded_of(FULL) == {"layers.2.a"}


def test_block_counts_whose_unreached_parameters_do_not_grow_evenly_are_not_extrapolated():
    even = [_ungraded(*(f"layers.{i}.v" for i in range(k))) for k in (1, 2, 3)]
    uneven = [_ungraded("layers.0.v"), _ungraded("layers.0.v"), _ungraded("layers.0.v", "layers.1.v", "layers.2.v")]
    assert linear_profiles(even)
    assert not linear_profiles(uneven)


def test_a_bert_config_extrapolated_from_shallow_copies_leaves_out_its_pooler(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.BertConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=2, vocab_size=128,
        max_position_embeddings=64, architectures=["BertModel"],
    ).to_json_file(str(tmp_path / "config.json"))  # fmt: skip
    report = estimate_memory(str(tmp_path), FP32, seq_len=16, measure=True)
    assert any("extrapolated" in note for note in report.model.notes)
    (note,) = [n for n in report.model.notes if "no gradient" in n]
    # BertModel's pooler (a 32 x 32 dense layer and its bias) feeds pooler_output, which the loss over the last
    # hidden state does not read.
    assert note.startswith(f"{32 * 32 + 32:,} of ")
    assert "does not reach pooler)" in note
    (measured,) = report.measurements
    assert measured.error == 0.0, measured


def test_fit_carries_the_unreached_parameters_to_every_size_and_needs_them_equal():
    def traced(k: int, *names: str) -> ActivationProfile:
        return ActivationProfile(10 * k, ((10 * k, k),), 1, timeline=((10 * k, k),), ungraded=names)

    scaled = scale([traced(1, "head.weight"), traced(2, "head.weight")], 1)
    assert isinstance(scaled, ScaledProfile)
    assert scaled.at(7).ungraded == ("head.weight",)
    assert scaled.at(7).peak() == 70 + 7
    assert scale([traced(1, "head.weight"), traced(2)], 1) is None


def test_a_shallow_copy_that_skips_a_module_the_model_runs_is_not_extrapolated_from(tmp_path):
    # MiniCPM-V's tower runs its window-attention merger after block ``insert_layer_id`` (3 of 6 here): copies with
    # 1, 2 and 3 blocks never run it. Extrapolated from them, the step missed the merger and every later block's
    # shorter sequence, and counted no state for the merger: -21.4% against MemTracker.
    transformers = pytest.importorskip("transformers")
    transformers.CONFIG_MAPPING["minicpmv4_7_vision"](
        hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=2, image_size=64, patch_size=8,
        insert_layer_id=3,
    ).to_json_file(str(tmp_path / "config.json"))  # fmt: skip
    report = estimate_memory(str(tmp_path), EstimateOptions(dtypes=(lookup("float32"),)), measure=True)
    assert not [note for note in report.model.notes if "extrapolated" in note or "no gradient" in note]
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    assert max(abs(m.error) for m in report.measurements) <= 0.001


def test_a_module_that_never_ran_in_a_shallow_trace_stops_its_extrapolation():
    ran = [ActivationProfile(10 * k, ((10 * k, 0),), 1) for k in (1, 2, 3)]
    assert linear_profiles(ran)
    assert not linear_profiles([*ran[:2], dataclasses.replace(ran[2], idle=("merger.weight",))])


def test_a_vlm_output_without_logits_takes_its_loss_of_the_language_models_output():
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPooling, CausalLMOutputWithPast
    from transformers.models.instructblip.modeling_instructblip import InstructBlipForConditionalGenerationModelOutput

    from dtypecheck.training_step import primary_output

    vision, text = torch.zeros(1, 3, 8), torch.ones(1, 5, 11)
    output = InstructBlipForConditionalGenerationModelOutput(
        vision_outputs=BaseModelOutputWithPooling(last_hidden_state=vision),
        language_model_outputs=CausalLMOutputWithPast(logits=text),
    )
    assert primary_output(output) is text
    assert primary_output({"vision_outputs": vision, "language_model_outputs": {"logits": text}}) is text


def test_a_tied_embedding_whose_own_module_never_runs_is_not_idle(tmp_path):
    # T5's ``shared`` embedding never runs itself: its weight runs as ``encoder.embed_tokens`` and
    # ``decoder.embed_tokens``. Counted idle, every T5 inference pass was traced whole (--fit's checks at
    # 2,270 and 2,271 sequences of 512 tokens traced all 24 blocks, twice).
    transformers = pytest.importorskip("transformers")
    transformers.T5Config(
        d_model=32, d_kv=8, d_ff=64, num_layers=6, num_heads=4, vocab_size=128,
        architectures=["T5ForConditionalGeneration"],
    ).to_json_file(str(tmp_path / "config.json"))  # fmt: skip
    options = EstimateOptions(dtypes=(lookup("float32"),), modes=(Mode.inference,))
    report = estimate_memory(str(tmp_path), options, seq_len=16, measure=True)
    assert any(note.startswith("activations of 6 identical blocks extrapolated") for note in report.model.notes)
    (measured,) = report.measurements
    assert abs(measured.error) <= 0.001, measured
