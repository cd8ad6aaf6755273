"""Factories and configs the estimate-memory CLI tests share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FACTORIES = """
import torch
from torch import nn


def with_inputs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(100, 32), nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 100))
    return model, torch.randint(0, 100, (4, 12))


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 8)), torch.randn(16, 32)


def no_inputs():
    return nn.Linear(16, 16)


def raises():
    return helper()


def helper():
    raise ValueError("boom in user code")


def wrong():
    return 42


not_callable = 3


class Positional(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.pos = nn.Parameter(torch.zeros(64, 16))
        self.fc = nn.Linear(16, 4)

    def forward(self, ids, scale=1.0):
        positions = torch.arange(ids.shape[1])  # made on the CPU inside forward, no device given
        return self.fc((self.emb(ids) + self.pos[positions]) * scale)


def on_meta_with_kwargs():
    with torch.device("meta"):
        model = Positional()
    return model, {"ids": torch.randint(0, 100, (2, 10)), "scale": 0.5}


def tuple_inputs():
    torch.manual_seed(0)
    return Positional(), (torch.randint(0, 100, (2, 10)), 0.5)


class Whitened(nn.Module):
    # Factors the batch's 16 x 16 Gram matrix, of rank 4: real values are not positive-definite, which a trace,
    # seeing no values, cannot know.

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return torch.linalg.cholesky(h @ h.T)


def fails_for_real():
    torch.manual_seed(0)
    return Whitened(), torch.randn(16, 4)
"""

DECODER = {
    "model_type": "dtypecheck-decoder",
    "vocab_size": 256,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}


def write_factories(folder: Path) -> str:
    path = folder / "models.py"
    path.write_text(FACTORIES, encoding="utf-8")
    return str(path)


def write_decoder_config(folder: Path) -> Path:
    target = folder / "decoder"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(DECODER), encoding="utf-8")
    return target


def fp32_options() -> Any:
    """Float32 rows only (inference and an AdamW training step)."""
    from dtypecheck.dtypes import lookup
    from dtypecheck.memory import EstimateOptions

    return EstimateOptions(dtypes=(lookup("float32"),))


TINY_TEXT = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 2, "vocab_size": 128,
}  # fmt: skip
"""A tiny text model's config fields (one layer, two heads): the sweep tests' text towers."""


def within_5_percent_of_memtracker(tmp_path: Path, config: object, seq_len: int = 16) -> None:
    """``config`` (a transformers config) estimated from its config.json in float32 is within 5% of MemTracker's
    measured step, inference and training."""
    from dtypecheck.memory import estimate_memory

    config.to_json_file(str(tmp_path / "config.json"))  # type: ignore[attr-defined]
    report = estimate_memory(str(tmp_path), fp32_options(), measure=True, seq_len=seq_len)
    assert [str(m.mode) for m in report.measurements] == ["inference", "training"]
    assert max(abs(m.error) for m in report.measurements) <= 0.05, report.measurements
