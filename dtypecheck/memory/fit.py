"""``--fit``: does each row fit a device, and what is the largest batch (and sequence length) that does.

The peak is re-estimated at other shapes from new fake traces (nothing is allocated). Three shapes (1, 2, 3) give
the growth; when it is the same step each time the limit follows in closed form, when its second difference is
constant (attention scores, quadratic in the sequence) from the quadratic; either is checked by estimating the
limit and the next value. Anything else, or a failed check, is settled by bisection on fresh estimates.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dtypecheck.errors import InputError
from dtypecheck.memory.devices import DeviceBudget
from dtypecheck.memory.estimate import EstimateOptions, Row, TraceCache, _compute_dtype, estimate_row, plan_rows
from dtypecheck.memory.report import Fit, MemoryEstimate, MemoryReport
from dtypecheck.memory.scaling import scale
from dtypecheck.memory.side_by_side import available_workers, can_fork, side_by_side
from dtypecheck.memory.tracing import (
    ActivationProfile,
    ExtrapolatedProfile,
    Profile,
    TraceDeadlineError,
    trace_deadline,
)
from dtypecheck.memory_words import Mode
from dtypecheck.progress import ProgressCallback, no_progress

if TYPE_CHECKING:
    from dtypecheck.memory.subject import Subject

SEARCH_LIMIT = 2**24
"""No batch or sequence length beyond this is searched (a peak that barely grows would otherwise run away): a limit
found there is reported as at least this. The batch's cap is raised to ``BATCH_HEADROOM`` times the batch given
where that is more."""
BATCH_HEADROOM = 16


def batch_limit(batch: int | None) -> int:
    """The largest batch searched: ``SEARCH_LIMIT``, or well above the batch the model was given."""
    return max(SEARCH_LIMIT, BATCH_HEADROOM * (batch or 1))


DEFAULT_FIT_TIMEOUT = 60.0
"""Seconds the search may take before it reports the best bounds found so far."""


class FitTimeoutError(Exception):
    """The search ran out of time; ``best`` is the largest value known to fit."""

    def __init__(self, best: int) -> None:
        super().__init__(best)
        self.best = best


class _Shapes:
    """The row totals at any (batch, seq), traced once per shape and shared by every row.

    Every shape reuses the shallow copies of a deep model that the estimate itself built, so that a new shape costs
    only its traces.
    """

    def __init__(
        self,
        subject: Subject,
        options: EstimateOptions,
        progress: ProgressCallback,
        deadline: float | None,
        base: TraceCache | None = None,
        workers: int = 1,
    ) -> None:
        self.subject = subject
        self.workers = workers
        """Processes the traces of one check may be shared among (``side_by_side``)."""
        self.options = options
        self.progress = progress
        self.deadline = deadline
        self.base = base
        self.cache: dict[tuple[object, ...], TraceCache] = {}
        """Per (batch, seq, True) the plain traces; per (batch, seq, False, block counts) the probes."""
        self.memo = base.memo if base is not None else {}
        """Every block count's trace at every shape, shared by the caches of all shapes and both kinds."""
        self.traced = 0
        """Traces taken by the search (what its time goes on)."""
        if base is not None:
            self.cache[(subject.batch_size, subject.seq_len, True)] = base

    def _traces(
        self, batch: int | None, seq: int | None, *, plain: bool, linear_from: dict[bool, int | None] | None = None
    ) -> TraceCache:
        """The traces at (batch, seq): ``plain``, as an estimate at that shape would take them (a deep model's
        steps per block checked again there: a T5's agree at 512 tokens and not at 1,024); else a probe for the
        model, extrapolated from the block counts ``linear_from`` names (by default those the estimate's own
        traces were checked from), one trace fewer. Either way the shallow modules of the estimate are reused, not
        rebuilt."""
        counts = linear_from if linear_from is not None else self.base.linear_from if self.base else {}
        key: tuple[object, ...] = (batch, seq, True)
        if not plain and key not in self.cache:
            key = (batch, seq, False, tuple(sorted(counts.items())))
        if key not in self.cache:
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise FitTimeoutError(0)
            self.progress(len(self.cache), len(self.cache) + 1, f"fitting: batch {batch}, seq {seq}")
            shaped = self.subject.reshaped(batch, seq)
            # Traced whole like the estimate's own when it was (--by-module, --plot), so that the shapes compare.
            whole = self.base is not None and self.base.attribute
            traces = TraceCache(shaped, self.options.checkpointing, no_progress, total=1, attribute=whole)
            traces.memo = self.memo
            if self.base is not None:
                traces.shallow = {n: t.reshaped(batch, seq) for n, t in self.base.shallow.items()}
                if not plain:
                    traces.linear_from = dict(counts)
            self.cache[key] = traces
        return self.cache[key]

    def profile(
        self,
        row: Row,
        batch: int | None,
        seq: int | None,
        *,
        plain: bool = True,
        linear_from: dict[bool, int | None] | None = None,
    ) -> Profile | None:
        traces = self._traces(batch, seq, plain=plain, linear_from=linear_from)
        before = len(self.memo)
        with trace_deadline(self.deadline):
            try:
                profile = traces.get(row)
            except TraceDeadlineError:
                raise FitTimeoutError(0) from None
            finally:
                self.traced += len(self.memo) - before
        if self.base is not None:
            # A block count first built at this shape (a later start checked) is the same module at every shape.
            own = (self.subject.batch_size, self.subject.seq_len)
            for count, shallow in traces.shallow.items():
                self.base.shallow.setdefault(count, shallow.reshaped(*own))
        return profile

    def prefetch(
        self,
        row: Row,
        shapes: Sequence[tuple[int | None, int | None]],
        *,
        plain: bool = True,
        linear_from: dict[bool, int | None] | None = None,
    ) -> None:
        """Take the traces the row's profiles at ``shapes`` start with side by side, so that ``profile`` finds them
        taken (the same traces, by the same code, in forked copies of this process); nothing with one worker."""
        if self.workers <= 1 or not can_fork(self.subject.user_file is not None):
            return
        keys: list[tuple[object, ...]] = []
        tasks: list[Callable[[], ActivationProfile]] = []
        weights: list[float] = []
        for batch, seq in dict.fromkeys(shapes):
            for key, task, count in self._traces(batch, seq, plain=plain, linear_from=linear_from).planned(row):
                if key not in keys:
                    keys.append(key)
                    tasks.append(task)
                    weights.append(count)
        if len(tasks) < 2:
            return
        with trace_deadline(self.deadline):
            results = side_by_side(tasks, weights, self.workers, self.deadline)
        for key, profile in zip(keys, results, strict=True):
            if profile is not None and key not in self.memo:
                self.memo[key] = profile
                self.traced += 1

    def estimate(self, row: Row, batch: int | None, seq: int | None, profile: Profile | None, *, kv: bool) -> int:
        """The row's total at (batch, seq) with the pass ``profile``; ``kv``: a decoder's inference holds the KV
        cache of its ``seq`` tokens."""
        options = self.options
        if kv and row.mode == Mode.inference and self.subject.decoder is not None:
            # A decoder generating ``seq`` tokens holds their keys and values: the cache grows with the sequence.
            options = dataclasses.replace(options, context=max(options.context or 0, seq or 0))
        return estimate_row(self.subject.reshaped(batch, seq), row, options, profile).bytes.total

    def total(self, row: Row, batch: int | None, seq: int | None, *, kv_for_seq: bool = False) -> int:
        return self.estimate(row, batch, seq, self.profile(row, batch, seq), kv=kv_for_seq)

    def dimension(self, row: Row, *, along_seq: bool) -> _Dimension:
        """The row's total as a function of the batch (at the row's sequence) or of the sequence (at its batch)."""
        batch, seq = self.subject.batch_size, self.subject.seq_len

        def shape(x: int) -> tuple[int | None, int | None]:
            return (batch, x) if along_seq else (x, seq)

        def real(x: int) -> int:
            self.prefetch(row, [shape(x)])
            return self.total(row, *shape(x), kv_for_seq=along_seq)

        def prefetch(xs: Sequence[int]) -> None:
            self.prefetch(row, [shape(x) for x in xs])

        def modeled(start: int, degree: int) -> Callable[[int], int] | None:
            scaled = None
            # Probes first, from the block counts the plain traces at ``start`` were checked from where there are
            # some (a refit where a check found other counts: T5's first block differs at 15,000 tokens and not at
            # 512), else from the estimate's own; where a plain trace among them extrapolated from other block
            # counts, all plain (a plain trace cannot mend probes that agree on their block counts: it traces the
            # same ones).
            anchor = self.cache.get((*shape(start), True))
            kind = row.mode == Mode.training
            counts = None
            if anchor is not None and self.base is not None and kind in anchor.linear_from:
                counts = {**self.base.linear_from, kind: anchor.linear_from[kind]}
            for plain in (False, True):
                shapes = [shape(start + i) for i in range(degree + 1)]
                self.prefetch(row, shapes, plain=plain, linear_from=counts)
                profiles = [self.profile(row, *at, plain=plain, linear_from=counts) for at in shapes]
                if any(p is None for p in profiles):
                    return None
                scaled = scale([p for p in profiles if p is not None], start)
                if scaled is not None or len({_extrapolated_from(p) for p in profiles}) == 1:
                    break
            if scaled is None:
                return None
            if not scaled.grows:
                return _constant
            return lambda x: self.estimate(row, *shape(x), scaled.at(x), kv=along_seq)

        return _Dimension(real, modeled, 2 if along_seq else 1, prefetch)


def _extrapolated_from(profile: Profile | None) -> int | None:
    """The smaller block count a deep model's pass was extrapolated from; None for a pass traced whole."""
    return profile.base if isinstance(profile, ExtrapolatedProfile) else None


def _constant(_x: int) -> int:
    raise AssertionError("a model that does not grow is not evaluated")


@dataclass
class _Dimension:
    """One size to search: ``real(x)`` traces at ``x``, ``modeled(start, degree)`` fits the moment-by-moment model
    from traces at ``start .. start + degree`` (None where the graph changed with the size)."""

    real: Callable[[int], int]
    modeled: Callable[[int, int], Callable[[int], int] | None]
    degree: int
    prefetch: Callable[[Sequence[int]], None] = lambda _xs: None
    """Take the traces at these sizes side by side before they are asked for (the check at x and x + 1)."""


def _largest_by(total: Callable[[int], int], usable: int, limit: int) -> int:
    """The largest x in 0..``limit`` with ``total(x) <= usable`` for a nondecreasing ``total`` (0: not even 1)."""
    if total(1) > usable:
        return 0
    return _largest(lambda x: total(x) <= usable, 1, None, limit)


MODEL_ROUNDS = 3
"""How many times the model is refitted from traces next to its last answer before the search falls back to
bisecting real traces (a graph that changes with the size is linear only piece by piece)."""


def modeled_fitting(dimension: _Dimension, usable: int, limit: int, start: int) -> tuple[int | None, str]:
    """The largest x in 1..``limit`` whose real total fits (0: not even 1; None: the total does not grow), from the
    moment-by-moment model of traces at ``start`` and its neighbours, each answer checked by real traces at x and
    x + 1. Raises ``FitTimeoutError`` with the largest value seen to fit."""
    real, degree = dimension.real, dimension.degree
    seen_fit = [0]

    def fits(x: int) -> bool:
        ok = real(x) <= usable
        if ok:
            seen_fit[0] = max(seen_fit[0], x)
        return ok

    tried: set[int] = set()
    try:
        if start >= limit and fits(limit):  # the row's own shape is already at the limit (a config's last position)
            return limit, "direct"
        start = max(1, min(start, limit - degree))
        if start == 1 and not fits(1):  # the row's own shape, already traced: nothing fits, nothing to model
            return 0, "direct"
        while limit > degree + 1 and start not in tried and len(tried) < MODEL_ROUNDS:
            tried.add(start)
            model = dimension.modeled(start, degree)
            if model is None:
                # The graph changed between these sizes (a batch of 1 often runs other kernels): one size on.
                start = min(start + 1, limit - degree)
                continue
            if model is _constant:
                return (None, "constant") if fits(start) else (0, "direct")
            answer = _largest_by(model, usable, limit)
            dimension.prefetch([x for x in (answer, answer + 1) if 1 <= x <= limit] or [1])
            if answer == 0:
                verified = not fits(1)
            elif answer == limit:
                verified = fits(limit)
            else:
                verified = fits(answer) and not fits(answer + 1)
            if verified:
                return answer, "linear" if degree == 1 else "quadratic"
            start = max(1, min(answer, limit - degree))
        return largest_fitting(real, usable, limit)
    except FitTimeoutError as exc:
        raise FitTimeoutError(max(exc.best, seen_fit[0])) from None


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


def _search(dimension: _Dimension, usable: int, limit: int, limit_name: str | None, known: int, start: int) -> _Search:
    """``modeled_fitting`` with its bounds named; ``known`` is a value already known to fit (the row's own)."""
    try:
        value, method = modeled_fitting(dimension, usable, limit, start)
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
    traces: TraceCache | None = None,
    workers: int | None = None,
) -> MemoryReport:
    """``report`` with each row's ``fit`` on ``budget``; the search stops after ``timeout`` seconds with the
    best bounds found so far, marked as such. ``traces`` are the estimate's own (its shape is not traced again).
    ``workers``: processes each check's traces are shared among (None: one per core, ``available_workers``); the
    answers are the same with any number."""
    rows, _ = plan_rows(options)
    deadline = None if timeout is None else time.monotonic() + timeout
    shapes = _Shapes(subject, options, progress, deadline, traces, available_workers() if workers is None else workers)
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
                along_batch = shapes.dimension(row, along_seq=False)
                known = (batch or 1) if own_fits else 0
                by_batch = _search(along_batch, usable, batch_limit(batch), None, known, batch or 1)
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
                along_seq = shapes.dimension(row, along_seq=True)
                known = seq if _fits_own_seq(subject, row, estimate, usable) else 0
                by_seq = _search(along_seq, usable, limit, name, known, seq)
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
