"""The table's worst-first order: level, then the plain targets (a float16 failure outranks an e4m3-only one),
then how large a fraction of the tensor's values is affected; fractions are shown beside the counts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from dtypecheck.dtypes import lookup
from dtypecheck.scan.report import severity
from dtypecheck.scan.run import scan_checkpoint

N = 10_000


def _base(seed: int) -> torch.Tensor:
    """Values in [0.05, 1): normal in every target (no float16 subnormal, no e4m3 overflow)."""
    return torch.rand(N, generator=torch.Generator().manual_seed(seed)) * 0.95 + 0.05


def _checkpoint(tmp_path: Path) -> str:
    fp16_overflow = _base(1)
    fp16_overflow[7] = 7e4  # one value past float16's 65504: fails float16 (and e4m3)
    e4m3_many = _base(2)
    e4m3_many[: N // 2] = 1000.0  # half past e4m3's 448 (unscaled): fails e4m3 only
    e4m3_few = _base(3)
    e4m3_few[:10] = 1000.0
    subnormal_few = _base(4)
    subnormal_few[:200] = 1e-6  # float16 subnormal: warn (2% of the values, above the 1% that harms)
    underflow_many = _base(5)
    underflow_many[: 3 * N // 10] = 1e-9  # flushed by float16: warn, on 30% of the values
    tensors = {
        "a.e4m3_many": e4m3_many,
        "b.ok": _base(6),
        "c.subnormal_few": subnormal_few,
        "d.e4m3_few": e4m3_few,
        "e.underflow_many": underflow_many,
        "z.fp16_overflow": fp16_overflow,
    }
    path = tmp_path / "ranked.safetensors"
    save_file(tensors, str(path))
    return str(path)


EXPECTED = ["z.fp16_overflow", "a.e4m3_many", "d.e4m3_few", "e.underflow_many", "c.subnormal_few", "b.ok"]


def test_failing_float16_ranks_above_failing_only_e4m3(tmp_path: Path) -> None:
    report = scan_checkpoint(_checkpoint(tmp_path), [lookup(t) for t in ("fp16", "bf16", "e4m3")])
    by_name = {t.name: t for t in report.tensors}
    assert [by_name[n].level for n in EXPECTED] == ["fail", "fail", "fail", "warn", "warn", "ok"]
    # the old order (most failing values first) put the float16 failure third, behind 5000 and 10 e4m3 overflows
    assert [t.name for t in sorted(report.tensors, key=severity)] == EXPECTED
    assert by_name["e.underflow_many"].casts["float16"].fraction == {
        "overflow": 0.0,
        "underflow": 0.3,
        "subnormal": 0.0,
    }


def test_table_rows_follow_the_order_and_show_fractions(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("scan-model", _checkpoint(tmp_path), "--target", "fp16,bf16,e4m3", "--all")
    assert result.exit_code == 1
    rows = [line.split()[0] for line in result.stdout.splitlines() if line.split()[:1] and line.split()[0] in EXPECTED]
    assert rows == EXPECTED
    assert "3000 unf 30%" in result.stdout  # 3000 of 10,000 values
    assert "200 sub 2%" in result.stdout
    assert "1 ovf 0.01%" in result.stdout
