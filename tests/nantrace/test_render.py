"""The ``nan-trace`` table: a golden file from a report built by hand (no paths or timings that vary)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from dtypecheck.nantrace.report import Event, HistoryEntry, Location, NanTraceReport, ValueCounts
from dtypecheck.render import OutputFormat, render

FP16_MAX = 65504.0


def _report() -> NanTraceReport:
    line = Location("/work/train.py", 41, "forward", "h = self.fc(x)")
    history = tuple(
        HistoryEntry("aten.addmm.default", "forward", f"layers.{i}.fc", "float16", v, FP16_MAX, v / FP16_MAX, line)
        for i, v in enumerate((1200.0, 9000.0, 41000.0))
    )
    first = Event(
        kind="inf",
        phase="forward",
        op="aten.addmm.default",
        grad_fn="AddmmBackward0",
        module="layers.3.fc",
        dtype="float16",
        location=line,
        counts=ValueCounts(0, 32, 0, 0, 0),
        absmax=float("inf"),
        limit=FP16_MAX,
        cause="range_overflow",
        step=2,
        op_index=517,
        history=history,
    )
    warning = Event(
        kind="near_overflow",
        phase="forward",
        op="aten.addmm.default",
        grad_fn="AddmmBackward0",
        module="layers.2.fc",
        dtype="float16",
        location=line,
        counts=ValueCounts(0, 0, 0, 0, 0),
        absmax=41000.0,
        limit=FP16_MAX,
        cause=None,
        step=2,
        op_index=480,
    )
    return NanTraceReport(
        status="nonfinite",
        first=first,
        warnings=(warning,),
        ops=640,
        steps=1,
        events=(first,),
        source="/work/train.py",
        autocast="float16",
        device="cpu",
        stopped_early=True,
        notes=("torch.compile was called 1 time(s) and ran eagerly under tracing",),
    )


def test_nantrace_table_golden(golden: Callable[[str, str], None]) -> None:
    golden("nantrace_table.txt", render(_report(), OutputFormat.table, width=120))


def test_clean_table_says_so() -> None:
    report = NanTraceReport(status="clean", first=None, warnings=(), ops=1234, steps=3)
    assert render(report, OutputFormat.table, width=100).strip() == "clean: no NaN or Inf in 1,234 ops over 3 step(s)"
    assert report.level == "ok"


def _long_history_report() -> NanTraceReport:
    line = Location("/work/project/training/train_language_model.py", 213, "forward", "y = x.pow(2)")
    names = ("aten.pow.Tensor_Scalar", "aten.native_layer_norm.default", "aten._log_softmax_backward_data.default")
    history = tuple(
        HistoryEntry(name, "backward", "encoder.layers.11.attention", "float16", 1.5, FP16_MAX, 1.5 / FP16_MAX, line)
        for name in names
    )
    report = _report()
    assert report.first is not None
    first = dataclasses.replace(report.first, history=history)
    return dataclasses.replace(_report(), first=first, events=(first,), warnings=())


@pytest.mark.parametrize("width", [60, 80, 100, 160])
def test_every_op_name_and_line_stays_whole_at_any_width(width: int) -> None:
    """At 80 columns the history table folded op names and lines inside words (``aten.pow.T`` / ``ensor_Scal`` /
    ``ar``, ``nanscript.`` / ``py:11``): it drops its outer border and moves the shared dtype to its title, and
    below that becomes one block per op."""
    text = render(_long_history_report(), OutputFormat.table, width=width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    for name in ("aten.pow.Tensor_Scalar", "aten.native_layer_norm.default", "aten._log_softmax_backward_data.default"):
        assert any(name in line for line in lines), (width, name)
    assert sum("train_language_model.py:213" in line for line in lines) >= 3  # every row's line, whole
    assert sum("encoder.layers.11.attention" in line for line in lines) >= 3
