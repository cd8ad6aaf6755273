"""``--fit``: does each row fit a device, and what is the largest batch (and sequence length) that does.

The peak is re-estimated at other shapes from new fake traces (nothing is allocated). Three shapes (1, 2, 3) give
the growth; when it is the same step each time the limit follows in closed form, when its second difference is
constant (attention scores, quadratic in the sequence) from the quadratic; either is checked by estimating the
limit and the next value. Anything else, or a failed check, is settled by bisection on fresh estimates.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from dtypecheck.memory.devices import DeviceBudget
from dtypecheck.memory.estimate import EstimateOptions, Row, TraceCache, estimate_row, plan_rows
from dtypecheck.memory.report import Fit, MemoryReport
from dtypecheck.progress import ProgressCallback, no_progress

if TYPE_CHECKING:
    from dtypecheck.memory.subject import Subject

SEARCH_LIMIT = 2**24
"""No batch or sequence length beyond this is searched (a peak that barely grows would otherwise run away)."""


class _Shapes:
    """The row totals at any (batch, seq), traced once per shape and shared by every row."""

    def __init__(self, subject: Subject, options: EstimateOptions, progress: ProgressCallback) -> None:
        self.subject = subject
        self.options = options
        self.progress = progress
        self.cache: dict[tuple[int | None, int | None], tuple[Subject, TraceCache]] = {}

    def total(self, row: Row, batch: int | None, seq: int | None) -> int:
        key = (batch, seq)
        if key not in self.cache:
            self.progress(len(self.cache), len(self.cache) + 1, f"fitting: batch {batch}, seq {seq}")
            shaped = self.subject.reshaped(batch, seq)
            self.cache[key] = (shaped, TraceCache(shaped, self.options.checkpointing, no_progress, total=1))
        shaped, profiles = self.cache[key]
        return estimate_row(shaped, row, self.options, profiles.get(row)).bytes.total

    def total_at_batch(self, row: Row, seq: int | None, batch: int) -> int:
        return self.total(row, batch, seq)

    def total_at_seq(self, row: Row, batch: int | None, seq: int) -> int:
        return self.total(row, batch, seq)


def _largest(fits: Callable[[int], bool], low: int, high: int | None) -> int:
    """The largest x with ``fits(x)``, given ``fits(low)`` and (when known) not ``fits(high)``."""
    if high is None:
        high = max(2 * low, 2)
        while high <= SEARCH_LIMIT and fits(high):
            low, high = high, 2 * high
        if high > SEARCH_LIMIT:
            return SEARCH_LIMIT if fits(SEARCH_LIMIT) else _largest(fits, low, SEARCH_LIMIT)
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def largest_fitting(total: Callable[[int], int], usable: int) -> tuple[int | None, str]:
    """The largest x >= 1 with ``total(x) <= usable`` (0 when even 1 does not fit; None when the total does not
    grow with x), and how it was found."""
    t1, t2, t3 = total(1), total(2), total(3)
    if t1 > usable:
        return 0, "direct"
    d1, d2 = t2 - t1, t3 - 2 * t2 + t1
    if d1 <= 0 and d2 <= 0:
        return None, "constant"

    def model(x: int) -> int:
        return t1 + d1 * (x - 1) + d2 * (x - 1) * (x - 2) // 2

    method = "linear" if d2 == 0 else "quadratic"
    if d2 == 0:
        guess = 1 + (usable - t1) // d1
    elif d2 > 0:
        guess = _largest(lambda x: model(x) <= usable, 1, None)
    else:
        guess, method = 0, "bisection"
    guess = min(guess, SEARCH_LIMIT)
    if guess >= 1 and total(guess) <= usable and (guess == SEARCH_LIMIT or total(guess + 1) > usable):
        return guess, method
    known_fit = max([x for x in (1, 2, 3) if total(x) <= usable])
    return _largest(lambda x: total(x) <= usable, known_fit, None), "bisection"


def fit_report(
    subject: Subject,
    options: EstimateOptions,
    report: MemoryReport,
    budget: DeviceBudget,
    progress: ProgressCallback = no_progress,
) -> MemoryReport:
    """``report`` with each row's ``fit`` on ``budget``."""
    rows, _ = plan_rows(options)
    shapes = _Shapes(subject, options, progress)
    usable = budget.usable_bytes
    batch, seq = subject.batch_size, subject.seq_len
    fitted = []
    for row, estimate in zip(rows, report.estimates, strict=True):
        max_batch: int | None = None
        max_seq: int | None = None
        methods = []
        if subject.traceable is not None:
            max_batch, method = largest_fitting(functools.partial(shapes.total_at_batch, row, seq), usable)
            methods.append(method)
            if seq is not None:
                max_seq, method = largest_fitting(functools.partial(shapes.total_at_seq, row, batch), usable)
                methods.append(method)
        fit = Fit(
            device=budget.name,
            capacity_bytes=budget.capacity_bytes,
            reserve_bytes=budget.reserve_bytes,
            usable_bytes=usable,
            fits=estimate.bytes.total <= usable,
            max_batch_size=max_batch,
            max_seq_len=max_seq,
            search="/".join(methods) or "direct",
        )
        fitted.append(dataclasses.replace(estimate, fit=fit))
    return dataclasses.replace(report, estimates=tuple(fitted))
