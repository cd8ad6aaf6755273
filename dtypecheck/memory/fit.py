"""``--fit``: does each row fit a device, and what is the largest batch (and sequence length) that does.

The peak is re-estimated at other shapes from new fake traces (nothing is allocated). Three shapes (1, 2, 3) give
the growth; when it is the same step each time the limit follows in closed form, when its second difference is
constant (attention scores, quadratic in the sequence) from the quadratic; either is checked by estimating the
limit and the next value. Anything else, or a failed check, is settled by bisection on fresh estimates.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dtypecheck.errors import InputError
from dtypecheck.memory.devices import DeviceBudget
from dtypecheck.memory.estimate import EstimateOptions, Row, TraceCache, _compute_dtype, estimate_row, plan_rows
from dtypecheck.memory.names import Mode
from dtypecheck.memory.report import Fit, MemoryEstimate, MemoryReport
from dtypecheck.memory.tracing import TraceDeadlineError, trace_deadline
from dtypecheck.progress import ProgressCallback, no_progress

if TYPE_CHECKING:
    from dtypecheck.memory.subject import Subject

SEARCH_LIMIT = 2**24
"""No batch or sequence length beyond this is searched (a peak that barely grows would otherwise run away): a limit
found there is reported as at least this."""
DEFAULT_FIT_TIMEOUT = 60.0
"""Seconds the search may take before it reports the best bounds found so far."""


class FitTimeoutError(Exception):
    """The search ran out of time; ``best`` is the largest value known to fit."""

    def __init__(self, best: int) -> None:
        super().__init__(best)
        self.best = best


class _Shapes:
    """The row totals at any (batch, seq), traced once per shape and shared by every row."""

    def __init__(
        self, subject: Subject, options: EstimateOptions, progress: ProgressCallback, deadline: float | None
    ) -> None:
        self.subject = subject
        self.options = options
        self.progress = progress
        self.deadline = deadline
        self.cache: dict[tuple[int | None, int | None], tuple[Subject, TraceCache]] = {}

    def total(self, row: Row, batch: int | None, seq: int | None, *, kv_for_seq: bool = False) -> int:
        key = (batch, seq)
        if key not in self.cache:
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise FitTimeoutError(0)
            self.progress(len(self.cache), len(self.cache) + 1, f"fitting: batch {batch}, seq {seq}")
            shaped = self.subject.reshaped(batch, seq)
            self.cache[key] = (shaped, TraceCache(shaped, self.options.checkpointing, no_progress, total=1))
        shaped, profiles = self.cache[key]
        options = self.options
        with trace_deadline(self.deadline):
            try:
                return self._total(shaped, profiles, row, seq, options, kv_for_seq=kv_for_seq)
            except TraceDeadlineError:
                raise FitTimeoutError(0) from None

    @staticmethod
    def _total(
        shaped: Subject, profiles: TraceCache, row: Row, seq: int | None, options: EstimateOptions, *, kv_for_seq: bool
    ) -> int:
        if kv_for_seq and row.mode == Mode.inference and shaped.decoder is not None:
            # A decoder generating ``seq`` tokens holds their keys and values: the cache grows with the sequence.
            options = dataclasses.replace(options, context=max(options.context or 0, seq or 0))
        return estimate_row(shaped, row, options, profiles.get(row)).bytes.total

    def total_at_batch(self, row: Row, seq: int | None, batch: int) -> int:
        return self.total(row, batch, seq)

    def total_at_seq(self, row: Row, batch: int | None, seq: int) -> int:
        return self.total(row, batch, seq, kv_for_seq=True)


def _largest(fits: Callable[[int], bool], low: int, high: int | None, limit: int) -> int:
    """The largest x <= ``limit`` with ``fits(x)``, given ``fits(low)`` and (when known) not ``fits(high)``."""
    try:
        if high is None:
            high = max(2 * low, 2)
            while high <= limit and fits(high):
                low, high = high, 2 * high
            if high > limit:
                if fits(limit):
                    return limit
                high = limit
        while high - low > 1:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
    except FitTimeoutError:
        raise FitTimeoutError(low) from None
    return low


def largest_fitting(total: Callable[[int], int], usable: int, limit: int = SEARCH_LIMIT) -> tuple[int | None, str]:
    """The largest x in 1..``limit`` with ``total(x) <= usable`` (0 when even 1 does not fit; None when the total
    does not grow with x), and how it was found. Raises ``FitTimeoutError`` with the best bound found so far."""
    t1 = total(1)
    if t1 > usable:
        return 0, "direct"
    if limit == 1:
        return 1, "direct"
    try:
        t2 = total(2)
        t3 = total(3) if limit >= 3 else 2 * t2 - t1
    except FitTimeoutError:
        raise FitTimeoutError(1) from None
    d1, d2 = t2 - t1, t3 - 2 * t2 + t1
    if d1 <= 0 and d2 <= 0:
        return None, "constant"

    def model(x: int) -> int:
        return t1 + d1 * (x - 1) + d2 * (x - 1) * (x - 2) // 2

    method = "linear" if d2 == 0 else "quadratic"
    if d2 == 0:
        guess = 1 + (usable - t1) // d1
    elif d2 > 0:
        guess = _largest(lambda x: model(x) <= usable, 1, None, limit)
    else:
        guess, method = 0, "bisection"
    guess = min(guess, limit)
    known_fit = max([x for x, t in ((1, t1), (2, t2), (3, t3)) if x <= limit and t <= usable])
    try:
        if guess >= 1 and total(guess) <= usable and (guess == limit or total(guess + 1) > usable):
            return guess, method
        return _largest(lambda x: total(x) <= usable, known_fit, None, limit), "bisection"
    except FitTimeoutError as exc:
        raise FitTimeoutError(max(exc.best, known_fit)) from None


@dataclass(frozen=True)
class _Search:
    value: int | None
    method: str
    bound: str | None
    """Why ``value`` is a lower bound or a cap (see ``Fit``), or None when it is the answer."""


def _search(total: Callable[[int], int], usable: int, limit: int, limit_name: str | None, known: int) -> _Search:
    """``largest_fitting`` with its bounds named; ``known`` is a value already known to fit (the row's own)."""
    try:
        value, method = largest_fitting(total, usable, limit)
    except FitTimeoutError as exc:
        return _Search(max(exc.best, known), "timeout", "timeout")
    if value is not None and value >= limit:
        return _Search(limit, method, limit_name or "search-limit")
    return _Search(value, method, None)


def _fits_own_seq(subject: Subject, row: Row, estimate: MemoryEstimate, usable: int) -> bool:
    """Whether the row fits at its own sequence length as the sequence search counts it: a decoder's inference
    holds the KV cache of that many tokens (more than the row's own ``--context`` may have counted)."""
    seq = subject.seq_len or 0
    total = estimate.bytes.total
    if row.mode == Mode.inference and subject.decoder is not None:
        context = max(estimate.context or 0, seq)
        held = subject.decoder.kv_elements(context) * (subject.batch_size or 1) * _compute_dtype(row).bits // 8
        total += held - estimate.bytes.kv_cache
    return total <= usable


def fit_report(
    subject: Subject,
    options: EstimateOptions,
    report: MemoryReport,
    budget: DeviceBudget,
    progress: ProgressCallback = no_progress,
    timeout: float | None = DEFAULT_FIT_TIMEOUT,
) -> MemoryReport:
    """``report`` with each row's ``fit`` on ``budget``; the search stops after ``timeout`` seconds with the
    best bounds found so far, marked as such."""
    rows, _ = plan_rows(options)
    deadline = None if timeout is None else time.monotonic() + timeout
    shapes = _Shapes(subject, options, progress, deadline)
    usable = budget.usable_bytes
    batch, seq = subject.batch_size, subject.seq_len
    seq_limit = subject.seq_limit
    fitted = []
    notes: list[str] = []
    for row, estimate in zip(rows, report.estimates, strict=True):
        by_batch: _Search | None = None
        by_seq: _Search | None = None
        own_fits = estimate.bytes.total <= usable
        if subject.traceable is not None:
            try:
                at_batch = functools.partial(shapes.total_at_batch, row, seq)
                by_batch = _search(at_batch, usable, SEARCH_LIMIT, None, (batch or 1) if own_fits else 0)
            except InputError as exc:
                # A model that runs only at its own batch (a fixed reshape, a batch-sized buffer).
                fixed = batch or 1
                note = f"the model does not run at other batch sizes than {fixed}: batch not searched ({exc})"
                if note not in notes:
                    notes.append(note)
                fits_own = estimate.bytes.total <= usable
                by_batch = _Search(fixed if fits_own else 0, "fixed", "fixed-batch")
            if seq is not None:
                limit = seq_limit.tokens if seq_limit else SEARCH_LIMIT
                name = seq_limit.name if seq_limit else None
                at_seq = functools.partial(shapes.total_at_seq, row, batch)
                by_seq = _search(
                    at_seq, usable, limit, name, seq if _fits_own_seq(subject, row, estimate, usable) else 0
                )
        searches = [s for s in (by_batch, by_seq) if s is not None]
        fit = Fit(
            device=budget.name,
            capacity_bytes=budget.capacity_bytes,
            reserve_bytes=budget.reserve_bytes,
            usable_bytes=usable,
            fits=estimate.bytes.total <= usable,
            max_batch_size=by_batch.value if by_batch else None,
            max_seq_len=by_seq.value if by_seq else None,
            search="/".join(s.method for s in searches) or "direct",
            max_batch_size_bound=by_batch.bound if by_batch else None,
            max_seq_len_bound=by_seq.bound if by_seq else None,
        )
        fitted.append(dataclasses.replace(estimate, fit=fit))
    if any(s == "timeout" for f in fitted if f.fit for s in (f.fit.max_batch_size_bound, f.fit.max_seq_len_bound)):
        notes.append(
            f"the fit search stopped after {timeout:g} s: limits marked '>=' are the largest found to fit so far"
        )
    model = report.model
    if notes:
        model = dataclasses.replace(model, notes=(*model.notes, *notes))
    return dataclasses.replace(report, model=model, estimates=tuple(fitted))
