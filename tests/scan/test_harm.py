"""A level means harm (docs/contract.md "Levels"): a healthy checkpoint's few subnormals are reported, not warned
about; float8 is judged after per-tensor scaling, the way it is used; the README's example config passes a healthy
model. Expected counts come from numpy's own float16 cast and float64 arithmetic, not from the scanner."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from dtypecheck.config import ScanPolicy
from dtypecheck.dtypes import lookup
from dtypecheck.scan import scan_checkpoint
from dtypecheck.scan.report import Float8CastCounts

ROOT = Path(__file__).resolve().parents[2]
FP16_TINY = 2.0**-14  # float16's smallest normal
E4M3_HALF_SUBNORMAL = 2.0**-10  # half float8_e4m3fn's smallest subnormal (2^-9): below it, RNE gives 0


def _healthy(path: Path) -> dict[str, np.ndarray]:
    """A model as initialised for training: N(0, 0.02) weights (GPT-2's init), zero biases, unit norms."""
    rng = np.random.default_rng(7)
    tensors = {
        "embed.weight": rng.normal(0, 0.02, (512, 128)).astype(np.float32),
        "h.0.attn.weight": rng.normal(0, 0.02, (128, 384)).astype(np.float32),
        "h.0.mlp.weight": rng.normal(0, 0.02, (128, 512)).astype(np.float32),
        "h.0.mlp.bias": np.zeros(512, np.float32),
        "h.0.norm.weight": np.ones(128, np.float32),
    }
    save_file(tensors, str(path))
    return tensors


def _fp16_counts(x: np.ndarray) -> tuple[int, int]:
    """(underflow, subnormal) of numpy's float16 cast, which rounds to nearest even."""
    cast = x.astype(np.float16).astype(np.float64)
    nonzero = x != 0
    return int(np.sum(nonzero & (cast == 0))), int(np.sum((cast != 0) & (np.abs(cast) < FP16_TINY)))


def test_a_healthy_checkpoints_subnormals_are_reported_not_warned(tmp_path: Path) -> None:
    tensors = _healthy(tmp_path / "model.safetensors")
    report = scan_checkpoint(str(tmp_path / "model.safetensors"), [lookup("fp16")])
    for tensor in report.tensors:
        underflow, subnormal = _fp16_counts(tensors[tensor.name])
        cast = tensor.casts["float16"]
        assert (cast.underflow, cast.subnormal) == (underflow, subnormal), tensor.name
        assert subnormal <= 0.01 * tensor.numel
        assert underflow <= 0.001 * tensor.numel
        assert (cast.level, tensor.level) == ("ok", "ok"), tensor.name
    total_subnormal = sum(_fp16_counts(x)[1] for x in tensors.values())
    total_underflow = sum(_fp16_counts(x)[0] for x in tensors.values())
    assert total_subnormal > 100  # N(0, 0.02): about 0.24% of the values land below 2^-14
    (verdict,) = report.summary.verdicts
    assert verdict.level == "ok"
    below = f"{total_subnormal:,} values become subnormal"
    if total_underflow:
        below += f", {100 * total_underflow / sum(x.size for x in tensors.values()):.2g}% flush to zero"
    assert verdict.advice == f"safe to cast ({below}: below what harms)"
    assert report.summary.level == "ok"


def test_more_than_a_tenth_of_a_percent_flushed_is_still_a_warning(tmp_path: Path) -> None:
    x = np.ones(1000, np.float32)
    x[:2] = 1e-9  # 2 of 1000 (0.2%) flush to zero in float16
    save_file({"w": x}, str(tmp_path / "m.safetensors"))
    report = scan_checkpoint(str(tmp_path / "m.safetensors"), [lookup("fp16")])
    (tensor,) = report.tensors
    assert (tensor.casts["float16"].underflow, tensor.level) == (2, "warn")
    assert report.summary.verdicts[0].advice == "cast; 0.2% of values flush to zero"


def test_a_projects_own_fraction_replaces_the_rule(tmp_path: Path) -> None:
    tensors = _healthy(tmp_path / "model.safetensors")
    strict = ScanPolicy(max_subnormal_fraction={"float16": 0.0})
    report = scan_checkpoint(str(tmp_path / "model.safetensors"), [lookup("fp16")], policy=strict)
    warned = sorted(t.name for t in report.tensors if t.level == "warn")
    assert warned == sorted(name for name, x in tensors.items() if _fp16_counts(x)[1])


def test_float8_is_judged_after_per_tensor_scaling_and_says_so_first(tmp_path: Path) -> None:
    tensors = _healthy(tmp_path / "model.safetensors")
    report = scan_checkpoint(str(tmp_path / "model.safetensors"), [lookup("e4m3")])
    scaled_total = unscaled_total = 0
    for tensor in report.tensors:
        x = tensors[tensor.name].astype(np.float64)
        nonzero = x != 0
        absmax = np.abs(x).max()
        scaled = int(np.sum(nonzero & (np.abs(x) * (448.0 / absmax) < E4M3_HALF_SUBNORMAL))) if absmax else 0
        unscaled = int(np.sum(nonzero & (np.abs(x) < E4M3_HALF_SUBNORMAL)))
        cast = tensor.casts["float8_e4m3fn"]
        assert isinstance(cast, Float8CastCounts)
        assert (cast.scaled_underflow, cast.underflow) == (scaled, unscaled), tensor.name
        scaled_total += scaled
        unscaled_total += unscaled
        assert cast.level == "ok", tensor.name  # 4% flush unscaled, but nobody casts to fp8 unscaled
    values = sum(x.size for x in tensors.values())
    assert unscaled_total > 0.01 * values
    (verdict,) = report.summary.verdicts
    assert verdict.level == "ok"
    lost = f"{100 * scaled_total / values:.2g}% of values flush" if scaled_total else "nothing flushes"
    assert verdict.advice == (
        f"cast with per-tensor scaling; {lost} to zero after scaling ({100 * unscaled_total / values:.2g}% unscaled)"
    )


@pytest.mark.parametrize("targets", [None, "float16"])
def test_the_readmes_example_config_passes_a_healthy_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli, targets: str | None
) -> None:
    guide = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")  # the README's CI section, moved to the site
    (example,) = re.findall(r"```toml\n(\[tool\.dtypecheck\]\n.*?)```", guide, re.DOTALL)
    (tmp_path / "pyproject.toml").write_text(example, encoding="utf-8")
    _healthy(tmp_path / "model.safetensors")
    monkeypatch.chdir(tmp_path)
    result = cli("scan-model", "model.safetensors", *(["--target", targets] if targets else []))
    assert result.exit_code == 0, result.stdout + result.stderr
