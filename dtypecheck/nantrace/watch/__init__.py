"""``nan-trace --watch``: cheap checks every step, full tracing only of the step that went non-finite."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from dtypecheck.nantrace.watch.watcher import Watcher

if TYPE_CHECKING:
    from torch import nn

    from dtypecheck.nantrace.report import TraceHandle


@contextmanager
def watched(
    model: nn.Module | None, *, history: int, warn_frac: float, max_skipped_steps: int
) -> Iterator[TraceHandle]:
    """``dtypecheck.trace(watch=True)``: the block runs watched; the handle's report is filled in at its end."""
    from dtypecheck.nantrace.report import TraceHandle
    from dtypecheck.nantrace.tracer import TraceOptions

    options = TraceOptions(history=history, warn_frac=warn_frac, max_skipped_steps=max_skipped_steps)
    handle = TraceHandle()
    watcher = Watcher(options, model=model)
    try:
        with watcher:
            yield handle
    finally:
        handle._report = watcher.report()


__all__ = ["Watcher", "watched"]
