"""Aliases counted once in every total (issue 21.7): tied weights in a torch.save state dict, LSTM flat weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dtypecheck.dtypes import lookup
from dtypecheck.scan.run import scan_checkpoint


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied, as language models tie their embedding and output layers
        self.norm = torch.nn.LayerNorm(4)


def test_a_tied_weight_counts_once(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _Tied()
    with torch.no_grad():
        model.embed.weight[0, :3] = torch.tensor([7e4, -1e5, 2e-8])  # 2 overflow and 1 flush in float16
    path = tmp_path / "tied.pt"
    torch.save(model.state_dict(), path)
    report = scan_checkpoint(str(path), [lookup("fp16")])
    rows = {t.name: t for t in report.tensors}
    assert rows["head.weight"].alias_of == "embed.weight"
    assert rows["embed.weight"].alias_of is None
    distinct = list(model.parameters())  # parameters() lists a tied weight once
    assert report.summary.tensors == len(distinct) == 3
    assert report.summary.aliases == 1
    assert report.summary.numel == sum(p.numel() for p in distinct)
    assert report.summary.bytes == sum(p.numel() * p.element_size() for p in distinct)
    assert report.summary.census["float32"].numel == report.summary.numel
    assert report.summary.ok + report.summary.warn + report.summary.fail == 3
    embed = model.embed.weight.detach().numpy()
    with np.errstate(over="ignore"):
        cast = embed.astype(np.float16)
    [verdict] = report.summary.verdicts
    assert verdict.overflow == int(np.count_nonzero(np.isinf(cast))) == 2
    assert verdict.underflow == int(np.count_nonzero((embed != 0) & (cast == 0))) == 1
    assert dict(verdict.tensors) == {"ok": 2, "warn": 0, "fail": 1}


def test_an_lstm_pickled_whole_counts_its_flat_weights_once(tmp_path: Path, cli: Callable[..., Any]) -> None:
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(16, 32, num_layers=2)
    path = tmp_path / "lstm.pt"
    torch.save(lstm, path)
    doc = cli("scan-model", str(path), "--format", "json").json()
    params = list(lstm.parameters())
    flat = [t for t in doc["tensors"] if t["name"].startswith("_flat_weights.")]
    assert len(flat) == len(params)
    assert {t["alias_of"] for t in flat} == {name for name, _ in lstm.named_parameters()}
    summary = doc["summary"]
    assert summary["numel"] == sum(p.numel() for p in params) == 14848
    assert summary["bytes"] == 4 * 14848
    assert (summary["tensors"], summary["aliases"]) == (len(params), len(params))
    assert summary["census"] == {"float32": {"tensors": len(params), "numel": 14848, "bytes": 4 * 14848}}
    table = cli("scan-model", str(path)).stdout
    assert "8 name(s) view another tensor's data (alias_of): counted once" in table
