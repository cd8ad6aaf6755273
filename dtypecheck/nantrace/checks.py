"""The nan-trace checks: each one registered object that knows its kinds, its level and, for per-op checks, how
to judge one op.

Like torch's flop counter registers one formula per op, each check registers itself here with ``@register``;
the judge runs every registered ``on_op`` over each checked op at the flush and acts on the verdicts it returns
(a check never calls back into the judge: it reads a ``CheckContext`` and answers). Each kind's level and title
are here; the records carry their own level, so the report never asks this registry. A new per-op check is one
class in this file (and its kind in ``report.EventKind`` when it emits events); its level comes from
``dtypecheck.findings``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias, runtime_checkable

from dtypecheck.dtypes import FloatFormat, spec_of
from dtypecheck.findings import CHECK_LEVEL, Level
from dtypecheck.nantrace.report import EventKind, Promotion, ScaleCollapse, SkippedStep

if TYPE_CHECKING:
    import torch

    from dtypecheck.nantrace.records import OpRecord


class CheckContext(Protocol):
    """What a per-op check may read of the judge's state (the judge implements it)."""

    @property
    def warn_frac(self) -> float:
        """``near_overflow`` when an op's absmax reaches this fraction of its dtype's max."""

    @property
    def scaled_backward(self) -> bool:
        """A GradScaler scales the loss: gradients near the dtype's max are its doing."""

    def already_warned(self, kind: str, module: str | None) -> bool:
        """A warning of ``kind`` was already given for ``module`` (one per module)."""


@dataclass(frozen=True)
class Follow:
    """Verdict: follow this op's non-finite outputs to their producer (and clear what it made finite)."""


@dataclass(frozen=True)
class Warn:
    """Verdict: warn with ``kind`` about the op's output at ``position``."""

    kind: EventKind
    position: int


Verdict: TypeAlias = Follow | Warn


@runtime_checkable
class Check(Protocol):
    """One nan-trace check."""

    @property
    def name(self) -> str:
        """Registry key, e.g. ``nonfinite``."""

    @property
    def kinds(self) -> tuple[str, ...]:
        """The ``kind`` values it writes into the report (an event's, a skipped step's...)."""

    @property
    def level(self) -> Level:
        """How bad what it finds is (``findings.Level``)."""

    @property
    def title(self) -> str:
        """What the table calls it."""

    @property
    def rule(self) -> str | None:
        """Its SARIF rule id (``findings.RULES``); None only for a level-``ok`` note, which is never a result."""


class OpCheck(Check, Protocol):
    """A check run at the flush over every checked op, in op order."""

    def on_op(self, record: OpRecord, context: CheckContext, nonfinite: bool) -> tuple[Verdict, ...]:
        """Judge one op; ``nonfinite``: one of its outputs holds NaN or inf. What the judge should do about it."""


CHECKS: Final[dict[str, Check]] = {}
"""Every registered check, by name, in registration order."""
_BY_KIND: dict[str, Check] = {}


def register(check: Check) -> Check:
    """Add ``check`` to the registry (its kinds must be new)."""
    clash = [kind for kind in check.kinds if kind in _BY_KIND]
    if check.name in CHECKS or clash:
        raise ValueError(f"nan-trace check {check.name!r} is registered twice (kinds {clash})")
    CHECKS[check.name] = check
    for kind in check.kinds:
        _BY_KIND[kind] = check
    return check


def check_of(kind: str) -> Check:
    """The check that writes ``kind``."""
    return _BY_KIND[kind]


def level_of(kind: str) -> Level:
    return _BY_KIND[kind].level


def op_checks() -> Iterator[OpCheck]:
    """The registered checks that judge each op, in registration order."""
    for check in CHECKS.values():
        if isinstance(check, _OpCheckBase):
            yield check


class _OpCheckBase:
    def on_op(
        self, record: OpRecord, context: CheckContext, nonfinite: bool
    ) -> tuple[Verdict, ...]:  # pragma: no cover - abstract
        raise NotImplementedError


_FOLLOW: tuple[Verdict, ...] = (Follow(),)


@dataclass(frozen=True)
class NonFiniteProducer(_OpCheckBase):
    """An op whose inputs were finite and whose output is not; what became of the value decides its level."""

    name: str = "nonfinite"
    kinds: tuple[str, ...] = ("nan", "inf")
    level: Level = CHECK_LEVEL["nonfinite"]
    title: str = "non-finite value"
    rule: str | None = "DTC201"

    def on_op(self, record: OpRecord, context: CheckContext, nonfinite: bool) -> tuple[Verdict, ...]:
        return _FOLLOW


@functools.cache
def format_of(dtype: torch.dtype) -> FloatFormat:
    """``spec_of(dtype).fmt``, remembered: asked for every checked output at every flush."""
    return spec_of(dtype).fmt


@functools.cache
def max_of(dtype: torch.dtype) -> float:
    """The dtype's largest finite value (``FloatFormat.max`` computes it on each call)."""
    return format_of(dtype).max


def _has_scalar_at_least(record: OpRecord, magnitude: float) -> bool:
    values = (*record.args, *record.kwargs.values())
    return any(isinstance(v, float) and abs(v) >= magnitude for v in values)


@dataclass(frozen=True)
class NearOverflow(_OpCheckBase):
    """A finite output whose largest magnitude reached ``warn_frac`` of its dtype's max (first per module)."""

    name: str = "near_overflow"
    kinds: tuple[str, ...] = ("near_overflow",)
    level: Level = "warn"
    title: str = "near overflow"
    rule: str | None = "DTC202"

    def on_op(self, record: OpRecord, context: CheckContext, nonfinite: bool) -> tuple[Verdict, ...]:
        if nonfinite or (context.scaled_backward and record.phase == "backward"):
            return ()
        verdicts: list[Verdict] = []
        for position, checked in enumerate(record.checked):
            limit = context.warn_frac * max_of(checked.tensor.dtype)
            # A huge constant the user wrote (finfo.min masks) is not a climb towards overflow.
            if checked.absmax >= limit and not _has_scalar_at_least(record, limit):
                verdicts.append(Warn("near_overflow", position))
        return tuple(verdicts) if verdicts else ()


@dataclass(frozen=True)
class Underflow(_OpCheckBase):
    """A half-precision output mostly flushed to zero or subnormal that float32 would have kept."""

    name: str = "underflow"
    kinds: tuple[str, ...] = ("underflow",)
    level: Level = CHECK_LEVEL["underflow"]
    title: str = "half-precision underflow"
    rule: str | None = "DTC203"

    def on_op(self, record: OpRecord, context: CheckContext, nonfinite: bool) -> tuple[Verdict, ...]:
        # Cheapest test first: only half-precision outputs count their small values (small_count 0 elsewhere).
        if nonfinite or not any(c.small_count for c in record.checked):
            return ()
        if context.already_warned("underflow", record.module):
            return ()
        from dtypecheck.nantrace.rerun import underflows_in_float32

        for position, checked in enumerate(record.checked):
            fmt = format_of(checked.tensor.dtype)
            if checked.absmax >= context.warn_frac * max_of(checked.tensor.dtype) or not checked.small_count:
                continue
            if 2 * checked.small_count > checked.tensor.numel():
                found = underflows_in_float32(record, position, fmt.smallest_normal)
                if found is not None and 2 * found[0] > found[1]:
                    return (Warn("underflow", position),)
        return ()


@dataclass(frozen=True)
class Described:
    """A check found outside the per-op flush (at dispatch, when an op raises, at a ``GradScaler`` update); it is
    registered for its kinds, level and title."""

    name: str
    kinds: tuple[str, ...]
    level: Level
    title: str
    rule: str | None


for _check in (
    NonFiniteProducer(),
    NearOverflow(),
    Underflow(),
    # dtypeflow.DtypeFlow finds it as ops run.
    Described(
        "float64_promotion",
        ("float64_promotion",),
        Promotion.LEVEL,
        "float64 enters a lower-precision program",
        "DTC204",
    ),
    # explain.explain: the traced code died of it.
    Described("dtype_mismatch", ("dtype_mismatch",), "fail", "dtype mismatch", "DTC205"),
    # training.TrainingWatch, at each GradScaler.update.
    Described("skipped_step", ("skipped_step",), SkippedStep.level, "step skipped by GradScaler", None),
    # Reported through the last skipped step's first producer (``first``), a DTC201 result.
    Described("scale_collapse", ("scale_collapse",), ScaleCollapse.level, "GradScaler's scale collapsed", "DTC201"),
):
    register(_check)
