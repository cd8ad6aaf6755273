"""The dtype census and the mixed-dtype findings, on hand-built tensor summaries."""

from __future__ import annotations

from dataclasses import dataclass

from dtypecheck.scan.consistency import census, consistency_findings, is_optimizer_state, majority_float_dtype


@dataclass(frozen=True)
class T:
    name: str
    dtype: str
    numel: int
    bytes: int
    min: float | int | None = 0.0
    max: float | int | None = 1.0


def _model() -> list[T]:
    return [
        T("encoder.weight", "float32", 1000, 4000),
        T("encoder.bias", "float32", 10, 40),
        T("head.weight", "float64", 20, 160),
        T("bn.running_var", "float16", 10, 20, 0.0, 40000.0),
        T("bn.num_batches_tracked", "int64", 1, 8, 3_000_000_000, 3_000_000_000),
        T("optimizer.state.0.exp_avg_sq", "float16", 1000, 2000),
        T("optimizer.state.0.exp_avg", "bfloat16", 1000, 2000),
    ]


def test_census_sums_per_dtype_largest_bytes_first() -> None:
    rows = census(_model())
    assert [(r.dtype, r.tensors, r.numel, r.bytes) for r in rows] == [
        ("float32", 2, 1010, 4040),
        ("float16", 2, 1010, 2020),
        ("bfloat16", 1, 1000, 2000),
        ("float64", 1, 20, 160),
        ("int64", 1, 1, 8),
    ]


def test_majority_ignores_optimizer_state() -> None:
    assert majority_float_dtype(_model()) == "float32"
    assert is_optimizer_state("optimizer.state.3.exp_avg_sq")
    assert is_optimizer_state("optimizer_states.0.state.1.momentum_buffer")
    assert not is_optimizer_state("model.layers.0.self_attn.q_proj.weight")


def test_findings_name_the_odd_tensors() -> None:
    found = {f.pattern: f for f in consistency_findings(_model())}
    assert set(found) == {"minority-dtype", "optimizer-precision", "norm-buffer-range", "integer-narrowing"}
    assert found["minority-dtype"].tensors == ("head.weight",)
    assert "doubles memory" in found["minority-dtype"].detail
    assert found["optimizer-precision"].tensors == ("optimizer.state.0.exp_avg_sq", "optimizer.state.0.exp_avg")
    # 40000 is past half of float16's 65504: the running variance is about to overflow.
    assert found["norm-buffer-range"].tensors == ("bn.running_var",)
    assert found["integer-narrowing"].tensors == ("bn.num_batches_tracked",)
    assert all(f.level == "warn" and f.kind == "dtype-consistency" for f in found.values())


def test_a_consistent_model_has_no_findings() -> None:
    model = [
        T("a.weight", "float32", 10, 40),
        T("bn.running_var", "float32", 4, 16, 0.1, 3.0),
        T("step", "int64", 1, 8),
    ]
    assert consistency_findings(model) == []
