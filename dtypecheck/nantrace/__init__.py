"""``dtypecheck nan-trace``: name the first op, module and line that produced NaN/Inf, and what came close before.

The Python API: ``with dtypecheck.trace() as t: ...`` around a training step, then ``t.report``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from dtypecheck.nantrace.options import TraceOptions
from dtypecheck.nantrace.report import (
    DefaultDtype,
    DefaultDtypeChange,
    DtypeError,
    Event,
    HistoryEntry,
    Location,
    NanTraceReport,
    Promotion,
    RaisedException,
    RankSummary,
    ScaleCollapse,
    SkippedStep,
    TensorArg,
    TraceHandle,
    ValueCounts,
)

if TYPE_CHECKING:
    from torch import nn


@contextmanager
def trace(
    model: nn.Module | None = None,
    *,
    keep_going: bool = TraceOptions.keep_going,
    history: int = TraceOptions.history,
    warn_frac: float = TraceOptions.warn_frac,
    max_skipped_steps: int = TraceOptions.max_skipped_steps,
    watch: bool = False,
) -> Iterator[TraceHandle]:
    """Trace every op run inside the block (forward, backward, optimizer step) for NaN and Inf.

    ``model`` is optional: given, module paths are its ``named_modules()`` names and its parameters' dtype is the
    program's; otherwise paths are taken relative to the outermost module running. After the first non-finite
    producer the block runs on unchecked unless ``keep_going``.

    A non-finite value fails only when it matters (reaches the loss, a parameter, an optimizer state, or is still
    held or unmasked when the block ends); masked values and GradScaler's skipped steps are notes, and
    ``max_skipped_steps`` skipped in a row are a collapse.

    The report also holds the default dtype and its changes, the first float64 promotion, and, when the block
    raised a dtype mismatch, its explanation (``report.dtype_error``); the exception is then re-raised as it was.

    ``watch=True`` runs the block at near-plain speed: each step only the loss, the gradients and the update are
    checked, and the first step that goes non-finite is replayed under full tracing (``report.watch`` says how).
    """
    import traceback

    from dtypecheck.nantrace.tracer import Tracer

    if watch:
        if keep_going:
            raise ValueError("watch=True and keep_going=True cannot be combined: watch replays the first failing step")
        from dtypecheck.nantrace.watch import watched

        with watched(model, history=history, warn_frac=warn_frac, max_skipped_steps=max_skipped_steps) as handle:
            yield handle
        return
    names = None if model is None else {id(m): n for n, m in model.named_modules()}
    handle = TraceHandle()
    tracer = Tracer(
        TraceOptions(keep_going=keep_going, history=history, warn_frac=warn_frac, max_skipped_steps=max_skipped_steps),
        module_names=names,
        model=model,
    )
    try:
        with tracer:
            yield handle
    except Exception as exc:
        handle._report = tracer.report(failure=exc, failure_traceback="".join(traceback.format_exception(exc)))
        raise
    handle._report = tracer.report()


__all__ = [
    "DefaultDtype",
    "DefaultDtypeChange",
    "DtypeError",
    "Event",
    "HistoryEntry",
    "Location",
    "NanTraceReport",
    "Promotion",
    "RaisedException",
    "RankSummary",
    "ScaleCollapse",
    "SkippedStep",
    "TensorArg",
    "TraceHandle",
    "TraceOptions",
    "ValueCounts",
    "trace",
]
