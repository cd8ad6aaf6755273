"""The frozen results of ``nan-trace``: events, their history, and the report (CONTRACT.md ``nan-trace``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

EventKind = Literal["nan", "inf", "near_overflow", "underflow"]
Phase = Literal["forward", "backward", "other"]
Cause = Literal["range_overflow", "invalid_math", "input"]


@dataclass(frozen=True)
class Location:
    """The user's own source line that called the op (for a backward op: the forward line that created it)."""

    file: str
    line: int
    function: str
    code: str
    """The source text of the line, stripped; empty when the file cannot be read."""


@dataclass(frozen=True)
class ValueCounts:
    """Value classes in the op's output; ``None`` where the output could no longer be examined."""

    nan: int | None
    posinf: int | None
    neginf: int | None
    zeros: int | None
    subnormal: int | None
    """Nonzero values below the dtype's smallest normal."""


@dataclass(frozen=True)
class HistoryEntry:
    """One checked op before an event, so the user sees the climb towards the limit."""

    op: str
    phase: Phase
    module: str | None
    dtype: str
    absmax: float
    """Largest magnitude in the output (NaN when the output held a NaN)."""
    limit: float
    """The dtype's largest finite value."""
    ratio: float
    """``absmax / limit``."""
    location: Location | None


@dataclass(frozen=True)
class Event:
    """A finding: a non-finite producer (``nan``, ``inf``) or a warning (``near_overflow``, ``underflow``)."""

    kind: EventKind
    phase: Phase
    op: str
    """The aten overload, e.g. ``aten.log.default``."""
    grad_fn: str | None
    """The autograd node: the one running (backward) or the one the op created (forward)."""
    module: str | None
    """Dotted path of the innermost module inside the model ("" is the model itself), or None outside modules."""
    dtype: str
    location: Location | None
    counts: ValueCounts
    absmax: float | None
    """Largest magnitude in the output, NaNs left out (inf when it holds an infinity)."""
    limit: float | None
    """The dtype's largest finite value."""
    cause: Cause | None
    """From re-running the op in float64: ``range_overflow`` (finite there, beyond the dtype), ``invalid_math``
    (non-finite even there from finite inputs) or ``input`` (came in with the data or a constant)."""
    step: int
    """1-based training step: backward passes completed before this op, plus one."""
    op_index: int
    """0-based position of the op among all traced ops."""
    history: tuple[HistoryEntry, ...] = ()
    """The last ``--history`` checked ops before this one (empty for warnings)."""


@dataclass(frozen=True)
class NanTraceReport:
    """Everything ``nan-trace`` found in one traced run."""

    SCHEMA: ClassVar[str] = "dtypecheck.nantrace/1"

    status: Literal["clean", "nonfinite"]
    first: Event | None
    """The first non-finite producer, or None when the run was clean."""
    warnings: tuple[Event, ...]
    ops: int
    """Ops traced."""
    steps: int
    """Backward passes seen (in factory mode: steps run)."""
    events: tuple[Event, ...] = ()
    """Every non-finite producer found (just ``first`` unless ``keep_going``)."""
    source: str | None = None
    """The script or factory traced; None from the Python API."""
    autocast: str | None = None
    device: str | None = None
    stopped_early: bool = False
    """Tracing stopped the run at the first event (the default; ``--keep-going`` runs to the end)."""
    notes: tuple[str, ...] = field(default=())
    """Things the user should know about how the run was traced (e.g. torch.compile ran eagerly)."""

    @property
    def level(self) -> Literal["ok", "warn", "fail"]:
        if self.status == "nonfinite":
            return "fail"
        return "warn" if self.warnings else "ok"
