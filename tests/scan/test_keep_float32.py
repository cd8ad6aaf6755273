"""The summary's "keep these in float32" list: tensors no requested 16-bit or narrower target holds."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from dtypecheck.dtypes import lookup
from dtypecheck.scan.run import scan_checkpoint


def _checkpoint(tmp_path: Path) -> tuple[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(256, 64, generator=g) * 0.02,  # every target holds it
        "norm.weight": torch.full((64,), 1e-9),  # flushed by float16, kept by bfloat16
        "emb.weight": torch.randn(100, 64, generator=g) * 1e5,  # overflows float16, fine in bfloat16
        # overflows float16; 1e-42 is below half of bfloat16's smallest subnormal (2**-133 ~ 9.2e-41): flushed
        "odd": torch.cat([torch.full((32,), 1e-42), torch.full((32,), 1e5)]),
        "odd_bf16": torch.cat([torch.full((32,), 1e-30), torch.full((32,), 1e5)]).to(torch.bfloat16),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    return str(path), tensors


def _scan(path: str, targets: str, **options: Any) -> Any:
    return scan_checkpoint(path, [lookup(t) for t in targets.split(",")], workers=2, **options)


def test_only_tensors_no_target_holds(tmp_path: Path) -> None:
    path, _ = _checkpoint(tmp_path)
    keep = _scan(path, "fp16,bf16").summary.keep_float32
    # 32 of 64 nonzero values flushed by bfloat16; 32 overflow float16. The bfloat16 tensor is no candidate.
    assert [(k.tensor, k.reason) for k in keep] == [
        ("odd", "float16: 32 value(s) overflow; bfloat16: 50% of nonzero values flushed to zero")
    ]
    # Asked only about float16, the norm (all flushed) and the embedding (overflows) join.
    only_fp16 = {k.tensor: k.reason for k in _scan(path, "fp16").summary.keep_float32}
    assert only_fp16["norm.weight"] == "float16: 100% of nonzero values flushed to zero"
    assert set(only_fp16) == {"odd", "norm.weight", "emb.weight"}
    # No target narrower than 32 bits was asked about: nothing to say.
    assert _scan(path, "float32,int8").summary.keep_float32 == ()


def test_sqnr_threshold_with_precision(tmp_path: Path) -> None:
    path, tensors = _checkpoint(tmp_path)
    report = _scan(path, "fp16,bf16", precision=True, keep_float32_sqnr_db=60.0)
    by_name = {k.tensor: k.reason for k in report.summary.keep_float32}
    emb = tensors["emb.weight"].numpy()
    overflow = int(np.count_nonzero(np.abs(emb) >= 65520))  # float16's overflow tie (inclusive: 65504 is odd)
    sqnr = {t.name: t.casts["bfloat16"].sqnr_db for t in report.tensors}["emb.weight"]
    assert 50 < sqnr < 60  # bfloat16's 8 significant bits: ~55 dB on Gaussian values
    assert by_name["emb.weight"] == f"float16: {overflow} value(s) overflow; bfloat16: SQNR {sqnr:.1f} dB < 60 dB"
    assert "w" not in by_name  # float16 keeps ~73 dB
    assert "emb.weight" not in {k.tensor for k in _scan(path, "fp16,bf16", precision=True).summary.keep_float32}


def test_scaled_targets_judge_what_scaling_leaves(tmp_path: Path) -> None:
    x = torch.full((4, 32), 1e-3)
    x[0, 0] = 1e6  # per-tensor scaling to e4m3's 448 flushes every other value (1e-3 * 448 / 1e6 < 2**-10)
    path = tmp_path / "o.safetensors"
    save_file({"outlier": x, "plain": torch.full((4, 32), 1e-3)}, str(path))
    keep = _scan(str(path), "e4m3").summary.keep_float32
    assert [(k.tensor, k.reason) for k in keep] == [
        ("outlier", "float8_e4m3fn: 1 value(s) overflow")  # unscaled 1e6 > 448 fails first
    ]
    x[0, 0] = 400.0  # no overflow now; scaling by 448/400 still leaves 1e-3 * 1.12 above e4m3's flush edge
    x[1, 1] = 1e-9  # ... but this one is flushed: 1 of 128 nonzero values is below the 1% rule
    save_file({"outlier": x}, str(path))
    assert _scan(str(path), "e4m3").summary.keep_float32 == ()


def test_cli_panel_option_and_config(cli: Callable[..., Any], tmp_path: Path) -> None:
    path, _ = _checkpoint(tmp_path)
    table = cli("scan-model", path, "--target", "fp16,bf16", "--precision", "--keep-float32-sqnr", "60")
    assert table.exit_code == 1
    assert "keep in float32 (3)" in table.stdout  # odd, and at 60 dB the embedding and the norm
    assert re.search(r"odd +float16: 32 value\(s\) overflow; bfloat16: 50% of nonzero values", table.stdout)
    doc = cli("scan-model", path, "--target", "fp16,bf16", "--format", "json").json()
    assert doc["summary"]["keep_float32"] == [
        {"tensor": "odd", "reason": "float16: 32 value(s) overflow; bfloat16: 50% of nonzero values flushed to zero"}
    ]
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.dtypecheck.scan-model]\nkeep-float32-sqnr-db = 60\n")
    configured = cli("scan-model", path, "-t", "fp16,bf16", "--precision", "--config", str(config), "--format", "json")
    listed = {k["tensor"] for k in configured.json()["summary"]["keep_float32"]}
    assert listed == {"emb.weight", "odd", "norm.weight"}
    config.write_text('[tool.dtypecheck.scan-model]\nkeep-float32-sqnr-db = "loud"\n')
    bad = cli("scan-model", path, "--config", str(config))
    assert bad.exit_code == 2
    assert bad.stderr.startswith("error: ")
    assert "keep-float32-sqnr-db" in bad.stderr
    negative = cli("scan-model", path, "--keep-float32-sqnr", "-3")
    assert negative.exit_code == 2
