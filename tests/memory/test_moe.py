"""Mixture of experts (issue 22.1, 22.6): data-dependent dispatch traced under balanced routing, against
MemTracker's peak of a real CPU step; an op whose size depends on unknown values is one error line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtypecheck.dtypes import lookup
from dtypecheck.memory import EstimateOptions, estimate_memory
from dtypecheck.memory_words import Mode

MOE = '''
import torch
import torch.nn.functional as F
from torch import nn


class Top2Block(nn.Module):
    """Mixtral-style top-2 routing: topk, one-hot mask, torch.where dispatch, boolean skip, index_add_ combine."""

    def __init__(self, hidden=64, inner=128, experts=8, k=2):
        super().__init__()
        self.k, self.n = k, experts
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden, inner, bias=False), nn.SiLU(), nn.Linear(inner, hidden, bias=False))
            for _ in range(experts)
        )

    def forward(self, x):
        b, t, h = x.shape
        x = x.view(-1, h)
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(probs, self.k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        mask = F.one_hot(chosen, self.n).permute(2, 1, 0)
        hit = torch.bincount(chosen.flatten(), minlength=self.n)
        for e, expert in enumerate(self.experts):
            if hit[e] == 0:
                continue
            slot, token = torch.where(mask[e])
            y = expert(x[token]) * weights[token, slot, None]
            out.index_add_(0, token, y)
        return out.view(b, t, h)


class MoeLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(256, 64)
        self.blocks = nn.ModuleList(Top2Block() for _ in range(2))
        self.head = nn.Linear(64, 256, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def moe():
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (4, 64))
    return MoeLM(), ids, lambda logits, ids: F.cross_entropy(logits.flatten(0, 1), ids.flatten())


class Threshold(nn.Module):
    """The positions of the activations above a value: how many is known only from the values (`y[y > 0]`
    would take the mask as all true; `nonzero` has no such rule)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        y = self.proj(x)
        return torch.nonzero(y > 0).float().sum()


class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Threshold()

    def forward(self, x):
        return self.inner(x)


def threshold():
    return Wrapper(), torch.randn(2, 8)
'''


@pytest.fixture
def moe_file(tmp_path):
    path = tmp_path / "moe.py"
    path.write_text(MOE, encoding="utf-8")
    return str(path)


FP32 = EstimateOptions(dtypes=(lookup("float32"),))


def test_top2_block_equals_a_measured_cpu_step(moe_file):
    report = estimate_memory(f"{moe_file}:moe", FP32, measure=True)
    assert [m.mode for m in report.measurements] == [Mode.inference, Mode.training]
    for measured in report.measurements:
        # MemTracker's peak of the real step: balanced routing allocates what the real router's does in total.
        assert measured.referee == "MemTracker"
        assert abs(measured.error) < 0.05
    assert any("balanced: each token's top-2 of 8 experts" in note for note in report.model.notes)


def _write(path: Path, config: object) -> Path:
    path.mkdir()
    config.to_json_file(str(path / "config.json"))  # type: ignore[attr-defined]
    return path


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_hf_moe_from_a_tiny_config_is_within_5_percent_of_memtracker(tmp_path, family):
    transformers = pytest.importorskip("transformers")
    common = {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 512,
    }
    if family == "mixtral":
        config = transformers.MixtralConfig(num_local_experts=4, architectures=["MixtralForCausalLM"], **common)
    else:
        config = transformers.Qwen2MoeConfig(
            num_experts=4,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=128,
            architectures=["Qwen2MoeForCausalLM"],
            **common,
        )
    folder = _write(tmp_path / family, config)
    report = estimate_memory(str(folder), FP32, seq_len=128, measure=True)
    assert len(report.measurements) == 2
    for measured in report.measurements:
        assert abs(measured.error) < 0.05, (measured.mode, measured.error)
    assert any("balanced" in note for note in report.model.notes)


def test_unknown_data_dependent_size_is_one_error_line_naming_op_and_module(cli, moe_file):
    result = cli("estimate-memory", f"{moe_file}:threshold", "-d", "fp32", "-m", "inference")
    assert result.exit_code == 3
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"error: {moe_file}:threshold: cannot trace an inference pass in float32: aten.nonzero.default in module "
        "'inner': its output size depends on tensor values the trace does not know"
    ]


def test_the_traceback_only_with_traceback(moe_file):
    from dtypecheck.cli import main
    from dtypecheck.errors import InputError

    with pytest.raises(InputError, match=r"aten\.nonzero\.default in module 'inner'"):
        main(["estimate-memory", f"{moe_file}:threshold", "-d", "fp32", "-m", "inference", "--traceback"])


def test_json_notes_say_balanced(cli, moe_file):
    doc = json.loads(cli("estimate-memory", f"{moe_file}:moe", "-d", "fp32", "-f", "json").stdout)
    assert doc["model"]["notes"][-1].startswith("data-dependent routing traced as balanced")


LAYERDROP = """
import torch
from torch import nn


class LayerDrop(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            if self.training and torch.rand([]) < 0.0:  # LayerDrop with p = 0: every layer runs
                continue
            x = layer(x)
        return x


def layerdrop():
    return LayerDrop(), torch.randn(2, 8)
"""


def _measured_factory(tmp_path: Path, source: str, factory: str):
    """The float32 estimate of ``factory`` in a script of ``source``, measured against MemTracker."""
    path = tmp_path / f"{factory}.py"
    path.write_text(source, encoding="utf-8")
    return estimate_memory(f"{path}:{factory}", FP32, measure=True)


def test_a_random_scalar_deciding_the_step_is_drawn_for_real(tmp_path):
    report = _measured_factory(tmp_path, LAYERDROP, "layerdrop")
    training = report.measurements[-1]
    assert training.mode == Mode.training
    assert abs(training.error) < 0.05


FINITENESS_CHECKS = """
import torch
from torch import nn


class Clamped(nn.Module):
    # RT-DETR's encoder layer: clamp only when a value went non-finite, as the check reads the values.
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        h = self.fc(x)
        if not torch.isfinite(h).all():
            h = h.clamp(-1e4, 1e4)
        if torch.isinf(h).any() or torch.isnan(h).any():
            h = h * 0
        return h


def clamped():
    return Clamped(), torch.randn(4, 64)
"""


def test_a_finiteness_check_is_answered_as_a_healthy_run_and_said_so(tmp_path):
    report = _measured_factory(tmp_path, FINITENESS_CHECKS, "clamped")
    assert [m.mode for m in report.measurements] == [Mode.inference, Mode.training]
    for measured in report.measurements:
        assert abs(measured.error) < 0.05, (measured.mode, measured.error)  # the real step: no clamp taken
    notes = [n for n in report.model.notes if "finiteness check" in n]
    assert notes == [
        "3 finiteness check(s) of values the trace does not know (torch.isfinite(x).all() and the like) taken as a "
        "healthy run answers them: every value finite"
    ]


def test_bart_in_float16_estimates_past_its_inf_clamp(tmp_path):
    # BART's encoder layer: ``if hidden_states.dtype == torch.float16 and (torch.isinf(h).any() or ...)``: the
    # check stopped every float16 estimate of the BART family at its first layer.
    transformers = pytest.importorskip("transformers")
    config = transformers.BartConfig(
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        vocab_size=1000,
        architectures=["BartForConditionalGeneration"],
    )
    folder = _write(tmp_path / "bart", config)
    report = estimate_memory(str(folder), EstimateOptions(dtypes=(lookup("float16"),)), seq_len=32, measure=True)
    assert [m.mode for m in report.measurements] == [Mode.inference, Mode.training]
    for measured in report.measurements:
        assert abs(measured.error) < 0.05, (measured.mode, measured.error)
    assert any("finiteness check" in note for note in report.model.notes)
