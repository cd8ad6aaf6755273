"""The scan report's ordering and check counts read the one rule table in dtypecheck.findings."""

from __future__ import annotations

from dtypecheck.scan.report import CastCounts, Float8CastCounts, TensorScan, severity, tensor_checks


def _tensor(name: str, cast: CastCounts, level: str = "warn", nan: int = 0) -> TensorScan:
    return TensorScan(
        name,
        "float32",
        (8,),
        8,
        32,
        0.0,
        1.0,
        1.0,
        1.0,
        nan,
        0,
        0,
        0,
        0,
        {"float8_e4m3fn": cast},
        level,  # type: ignore[arg-type]
    )


def test_scaled_underflow_counts_toward_the_worst_first_order() -> None:
    # Both warn; 5 values lost even after scaling outrank 1 subnormal (the old order ignored scaled_underflow).
    scaled = _tensor("a.scaled", Float8CastCounts(0, 0, 0, "warn", 5))
    subnormal = _tensor("b.subnormal", Float8CastCounts(0, 0, 1, "warn", 0))
    assert [t.name for t in sorted([subnormal, scaled], key=severity)] == ["a.scaled", "b.subnormal"]


def test_level_outranks_counts() -> None:
    failing = _tensor("z.fail", CastCounts(1, 0, 0, "fail"), "fail")
    many_warnings = _tensor("a.warn", CastCounts(0, 100, 100, "warn"))
    assert [t.name for t in sorted([many_warnings, failing], key=severity)] == ["z.fail", "a.warn"]


def test_tensor_checks_lists_every_nonzero_check() -> None:
    tensor = _tensor("t", Float8CastCounts(2, 0, 3, "fail", 4), "fail", nan=1)
    assert list(tensor_checks(tensor)) == [
        (None, "nonfinite", 1),
        ("float8_e4m3fn", "overflow", 2),
        ("float8_e4m3fn", "subnormal", 3),
        ("float8_e4m3fn", "scaled_underflow", 4),
    ]
