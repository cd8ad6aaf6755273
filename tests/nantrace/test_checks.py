"""The nan-trace check registry: every kind the report writes belongs to one registered check with a findings
level, and the report's level comes from those levels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import pytest

from dtypecheck.findings import LEVELS, Level
from dtypecheck.nantrace.checks import CHECKS, check_of, level_of, op_checks, register
from dtypecheck.nantrace.report import (
    Event,
    EventKind,
    NanTraceReport,
    ScaleCollapse,
    SkippedStep,
    ValueCounts,
)
from dtypecheck.render import OutputFormat, render


def test_every_kind_the_report_writes_has_one_registered_check() -> None:
    kinds = [*get_args(EventKind), "skipped_step", "scale_collapse", "float64_promotion", "dtype_mismatch"]
    assert sorted(k for check in CHECKS.values() for k in check.kinds) == sorted(kinds)
    for kind in kinds:
        assert level_of(kind) in LEVELS
    # docs/contract.md "Levels": NaN/Inf fail, underflow warns; a skipped step is a note.
    assert [level_of(k) for k in ("nan", "inf", "underflow", "near_overflow", "skipped_step", "scale_collapse")] == [
        "fail",
        "fail",
        "warn",
        "warn",
        "ok",
        "fail",
    ]
    assert [c.name for c in op_checks()] == ["nonfinite", "near_overflow", "underflow"]
    assert check_of("nan") is check_of("inf")


def test_a_kind_cannot_be_registered_twice() -> None:
    @dataclass(frozen=True)
    class Twice:
        name: str = "also_nan"
        kinds: tuple[str, ...] = ("nan",)
        level: Level = "warn"
        title: str = "x"
        rule: str | None = "DTC201"

    with pytest.raises(ValueError, match="registered twice"):
        register(Twice())
    assert "also_nan" not in CHECKS


def _event(level: Level, consequence: str | None) -> Event:
    return Event(
        kind="inf",
        phase="backward",
        op="aten.mm.default",
        grad_fn="MmBackward0",
        module="fc",
        dtype="float16",
        location=None,
        counts=ValueCounts(0, 1, 0, 0, 0),
        absmax=float("inf"),
        limit=65504.0,
        cause="range_overflow",
        step=2,
        op_index=7,
        level=level,
        consequence=consequence,  # type: ignore[arg-type]
    )


def test_notes_and_skipped_steps_alone_are_ok_and_a_collapse_fails() -> None:
    note = _event("ok", "skipped_step")
    skipped = SkippedStep(step=2, scale_before=65536.0, scale_after=32768.0, first=note)
    report = NanTraceReport("clean", None, (), ops=10, steps=3, handled=(note,), skipped_steps=(skipped,))
    assert report.level == "ok"
    text = render(report, OutputFormat.table, width=120)
    assert "GradScaler skipped 1 step(s) (scale before -> after): 2 (65536 -> 32768)" in text
    assert "clean: no NaN or Inf that mattered in 10 ops over 3 step(s) (1 handled: notes above)" in text
    collapse = ScaleCollapse(steps=3, first_step=2, last_step=4, scale_before=65536.0, scale_after=8192.0, limit=3)
    failed = NanTraceReport("nonfinite", None, (), ops=10, steps=4, scale_collapse=collapse)
    assert failed.level == "fail"
    text = render(failed, OutputFormat.table, width=120)
    assert "GradScaler's scale collapsed: 3 steps skipped in a row (steps 2-4, scale 65536 -> 8192" in text
