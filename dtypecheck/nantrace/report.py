"""The frozen results of ``nan-trace``: events, their history, and the report (docs/contract.md ``nan-trace``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from dtypecheck.display import ShowsAsHtml
from dtypecheck.findings import CHECK_LEVEL, Level, worst

EventKind = Literal["nan", "inf", "near_overflow", "underflow"]
Phase = Literal["forward", "backward", "other"]
Cause = Literal["range_overflow", "invalid_math", "input", "collective"]
Consequence = Literal[
    "loss",
    "parameter",
    "optimizer_state",
    "output",
    "unmasked",
    "scale_collapse",
    "exception",
    "masked",
    "skipped_step",
]
"""What became of a non-finite value. Failures: it reached the ``loss`` (the tensor ``backward()`` was called
on), was written into a ``parameter`` or an ``optimizer_state``, was still held when the run ended (``output``),
died without anything turning it finite (``unmasked``), its step was one of too many in a row that
``GradScaler`` skipped (``scale_collapse``), or it was in flight when the traced code raised (``exception``: the
report's ``exception`` says what was raised, and where). Notes: torch or the user's code turned it finite (``masked``:
``where``, ``masked_fill``, ``nan_to_num``...) or ``GradScaler`` skipped the step it was in (``skipped_step``)."""


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
    """1-based training step the op ran in (see ``NanTraceReport.steps`` for the rule)."""
    op_index: int
    """0-based position of the op among all traced ops."""
    history: tuple[HistoryEntry, ...] = ()
    """The last ``--history`` checked ops before this one (empty for warnings and notes)."""
    level: Level = "fail"
    """``fail`` for a non-finite producer whose value mattered, ``warn`` for a warning, ``ok`` for a note (a
    non-finite value torch or ``GradScaler`` handled)."""
    consequence: Consequence | None = None
    """For ``nan``/``inf``: what became of the value (null for warnings)."""
    rank: int | None = None
    """The process (``RANK``) it happened in, in a distributed run; else None."""
    worker: int | None = None
    """The DataLoader worker (its id) that made the value, in ``Dataset.__getitem__``, a transform or
    ``collate_fn``; None when it was made in the main process."""
    batch: int | None = None
    """With ``worker``: the 0-based place of the batch it went into (worker ``w``'s k-th batch is
    ``k * num_workers + w``: the DataLoader hands batches to its workers in turn)."""
    arrival: Location | None = None
    """With ``worker``: the main process's line that consumed the batch (where it was first seen non-finite)."""


@dataclass(frozen=True)
class DefaultDtypeChange:
    """One call the traced code made that changed ``torch.get_default_dtype()``."""

    old: str
    new: str
    call: str
    """``torch.set_default_dtype`` or ``torch.set_default_tensor_type``; ``unknown`` when the change was seen only
    when tracing ended (made through a reference to the function taken before tracing began)."""
    location: Location | None


@dataclass(frozen=True)
class DefaultDtype:
    """The default floating dtype when tracing began and ended, and every change in between."""

    start: str
    end: str
    changes: tuple[DefaultDtypeChange, ...] = ()


@dataclass(frozen=True)
class TensorArg:
    """One tensor an op (or a module) was given, with where its dtype came from."""

    name: str
    """The argument's name in the aten schema (``mat1``, ``self``) or in the module call (``input``)."""
    dtype: str
    shape: tuple[int, ...]
    parameter: str | None
    """The module parameter or buffer it is (or views), dotted from the model, e.g. ``fc.weight``; else None."""
    created: Location | None
    """The user's line where this dtype entered: the op that made the tensor (or the tensor it was computed from)
    in this dtype from nothing or from another dtype (``torch.tensor``, ``from_numpy``, ``.double()``); None
    when unknown (made before tracing began)."""
    created_by: str | None
    """The aten op at ``created`` (``aten.lift_fresh.default`` for torch.tensor/from_numpy, ``aten._to_copy``
    for ``.to``/``.double()``)."""


@dataclass(frozen=True)
class Promotion:
    """The first op where float64 entered a lower-precision program: it doubles memory and time from there on."""

    LEVEL: ClassVar[Level] = "warn"
    """A promotion is a warning-level finding (not written into the document: every promotion has it)."""
    op: str
    phase: Phase
    module: str | None
    dtype: str
    """The op's output dtype (``float64``)."""
    dominant: str
    """The program's float dtype: the majority of the model's parameters, else the first float op's."""
    inputs: tuple[TensorArg, ...]
    location: Location | None
    """The line of the promoting op."""
    created: Location | None
    """The line that created the float64 input (see ``TensorArg.created``)."""
    step: int
    op_index: int


@dataclass(frozen=True)
class DtypeError:
    """Why the traced code died of a dtype mismatch, and the cast that fixes it."""

    exception: str
    """``RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half``."""
    op: str | None
    """The aten op that raised, or None when it raised before reaching an op (``conv2d``'s own checks)."""
    module: str | None
    module_type: str | None
    location: Location | None
    """The user's line that called the op (or the module)."""
    inputs: tuple[TensorArg, ...]
    expected: str | None
    """The dtype the odd inputs should have: the module's parameters', else the program's."""
    odd: tuple[str, ...]
    """Names (from ``inputs``) of the tensors whose dtype differs from ``expected``."""
    fix: str
    traceback: str
    """The traced code's own traceback (its frames only)."""


@dataclass(frozen=True)
class RaisedException:
    """The exception that ended the traced code after a non-finite value was found (``binary_cross_entropy`` or
    ``multinomial`` refusing a NaN, an index out of range, the user's own ``assert torch.isfinite(loss)``)."""

    type: str
    """The exception's class, e.g. ``RuntimeError`` (qualified by its module when not a builtin)."""
    message: str
    """Its first line."""
    location: Location | None
    """The user's own line it was raised from (the innermost frame outside torch and the standard library)."""


@dataclass(frozen=True)
class SkippedStep:
    """A step ``GradScaler`` skipped because its gradients held inf/NaN: by design, not a failure."""

    step: int
    scale_before: float
    scale_after: float
    first: Event | None
    """The first non-finite producer in that step (a note), when one was traced."""
    kind: Literal["skipped_step"] = "skipped_step"
    level: Level = "ok"
    rank: int | None = None


@dataclass(frozen=True)
class ScaleCollapse:
    """``GradScaler`` shrank its scale on ``steps`` consecutive steps: the gradients are non-finite at any scale."""

    steps: int
    first_step: int
    last_step: int
    scale_before: float
    """The scale before the first of those steps."""
    scale_after: float
    limit: int
    """``--max-skipped-steps``: how many consecutive skipped steps are a collapse."""
    kind: Literal["scale_collapse"] = "scale_collapse"
    level: Level = "fail"
    rank: int | None = None

    @classmethod
    def of_streak(cls, streak: Sequence[SkippedStep], *, limit: int, rank: int | None) -> ScaleCollapse:
        """The collapse that ``streak`` (consecutive skipped steps, at least one) amounts to."""
        return cls(
            steps=len(streak),
            first_step=streak[0].step,
            last_step=streak[-1].step,
            scale_before=streak[0].scale_before,
            scale_after=streak[-1].scale_after,
            limit=limit,
            rank=rank,
        )


@dataclass(frozen=True)
class NanTraceReport(ShowsAsHtml):
    """Everything ``nan-trace`` found in one traced run."""

    SCHEMA: ClassVar[str] = "dtypecheck.nantrace/1"

    status: Literal["clean", "nonfinite", "error"]
    """``error``: the traced code died of a dtype mismatch (``dtype_error``); the CLI exits 3."""
    first: Event | None
    """The first non-finite producer, or None when the run was clean."""
    warnings: tuple[Event, ...]
    ops: int
    """Ops traced."""
    steps: int
    """Steps completed: optimizer steps (a step ``GradScaler`` skipped counts), or backward passes in code that
    never ran a ``torch.optim`` optimizer step (in factory mode: steps run)."""
    events: tuple[Event, ...] = ()
    """Every non-finite producer whose value mattered (just ``first`` unless ``keep_going``)."""
    source: str | None = None
    """The script or factory traced; None from the Python API."""
    autocast: str | None = None
    device: str | None = None
    stopped_early: bool = False
    """Tracing stopped the run at the first event (the default; ``--keep-going`` runs to the end)."""
    notes: tuple[str, ...] = field(default=())
    """Things the user should know about how the run was traced (e.g. torch.compile ran eagerly)."""
    default_dtype: DefaultDtype | None = None
    promotions: tuple[Promotion, ...] = ()
    """The first float64 promotion in a lower-precision program (at most one): a warning-level finding."""
    dtype_error: DtypeError | None = None
    handled: tuple[Event, ...] = ()
    """Non-finite producers whose value was handled (level ``ok``): masked downstream, or in a skipped step."""
    skipped_steps: tuple[SkippedStep, ...] = ()
    scale_collapse: ScaleCollapse | None = None
    world_size: int | None = None
    """Processes in a distributed run (each traced, the report merged); None for one process."""
    ranks: tuple[RankSummary, ...] = ()
    """One line per process of a distributed run."""
    exception: RaisedException | None = None
    """The traced code raised after a non-finite producer was found: the run still reports it (exit 1), with the
    exception as its consequence. None when it ended normally (or raised with nothing non-finite: exit 3)."""
    watch: WatchSummary | None = None
    """``--watch``: what the cheap per-step checks saw and which step was replayed; None for a full trace."""

    @property
    def level(self) -> Level:
        levels: list[Level] = [e.level for e in (*self.events, *self.warnings)]
        levels += [p.LEVEL for p in self.promotions]
        if self.scale_collapse is not None:
            levels.append(self.scale_collapse.level)
        if self.status == "nonfinite":
            levels.append(CHECK_LEVEL["nonfinite"])
        return worst(levels)


@dataclass(frozen=True)
class RankSummary:
    """What one process of a distributed run found."""

    rank: int
    status: str
    """``clean``, ``nonfinite``, ``error``, or ``missing`` (no report arrived from it in time)."""
    ops: int
    steps: int


@dataclass(frozen=True)
class WatchSummary:
    """Watch mode (``--watch``): cheap finiteness checks each step, full tracing only of the step that failed."""

    steps_checked: int
    """Steps whose loss, gradients and optimizer update were checked."""
    detected: Literal["loss", "gradients", "optimizer_step", "scale_collapse", "held_tensors"] | None
    """What the cheap check first found non-finite; None for a clean run. ``held_tensors``: a module's parameter
    or buffer that no optimizer updates (an EMA copy, a running statistic), checked as each step begins."""
    detected_step: int | None
    replayed_step: int | None
    """The step re-run from its saved starting state under full tracing; None when none was (or could be)."""
    exact: bool | None
    """The replay reproduced the step (same non-finite gradients or update); None without a replay."""
    reason: str | None
    """Why the step could not be replayed exactly, in words; None when it was."""
    traced_from_step: int | None
    """The first step traced fully after a step that could not be replayed; None when none was."""
    snapshot_bytes: int
    """The most bytes the per-step snapshot held (RNG states, changed buffers, the model output's gradient, and
    with ``optimizer_snapshot`` the parameters and optimizer states before the update)."""
    optimizer_snapshot: bool
    """The parameters and optimizer states were copied before each update, so that a NaN born inside the
    optimizer step can be replayed."""
    held_nonfinite: tuple[str, ...] = ()
    """With ``detected`` ``held_tensors``: which (``Class.dotted.name`` of the outermost module holding it)."""


class TraceHandle:
    """What ``trace()`` yields: ``report`` is filled in when the block ends."""

    def __init__(self) -> None:
        self._report: NanTraceReport | None = None

    @property
    def report(self) -> NanTraceReport:
        if self._report is None:
            raise RuntimeError("the trace is still running; read .report after the with-block")
        return self._report

    def _repr_html_(self) -> str:
        """In a notebook, the handle a ``with trace(...) as traced:`` cell ends on shows the report."""
        if self._report is None:
            return "<p>dtypecheck: the trace is still running.</p>"
        return self._report._repr_html_()
