"""``dtypecheck nan-trace``: name the first op, module and line that produced NaN/Inf, and what came close before.

The Python API: ``with dtypecheck.trace() as t: ...`` around a training step, then ``t.report``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from dtypecheck.nantrace.report import Event, HistoryEntry, Location, NanTraceReport, ValueCounts

if TYPE_CHECKING:
    from torch import nn


class TraceHandle:
    """What ``trace()`` yields: ``report`` is filled in when the block ends."""

    def __init__(self) -> None:
        self._report: NanTraceReport | None = None

    @property
    def report(self) -> NanTraceReport:
        if self._report is None:
            raise RuntimeError("the trace is still running; read .report after the with-block")
        return self._report


@contextmanager
def trace(
    model: nn.Module | None = None,
    *,
    keep_going: bool = False,
    history: int = 20,
    warn_frac: float = 0.5,
) -> Iterator[TraceHandle]:
    """Trace every op run inside the block (forward, backward, optimizer step) for NaN and Inf.

    ``model`` is optional: given, module paths are its ``named_modules()`` names; otherwise paths are taken
    relative to the outermost module running. After the first non-finite producer the block runs on unchecked
    unless ``keep_going``.
    """
    from dtypecheck.nantrace.tracer import TraceOptions, Tracer

    names = None if model is None else {id(m): n for n, m in model.named_modules()}
    handle = TraceHandle()
    tracer = Tracer(TraceOptions(keep_going=keep_going, history=history, warn_frac=warn_frac), module_names=names)
    with tracer:
        yield handle
    handle._report = tracer.report()


__all__ = ["Event", "HistoryEntry", "Location", "NanTraceReport", "TraceHandle", "ValueCounts", "trace"]
