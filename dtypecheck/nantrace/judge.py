"""The flush: read back a window of cheap reductions at once, then run every registered op check over each op.

An op is a *producer* when its output holds a NaN and none of its inputs did, or an infinity while its inputs
were all finite. Everything else that is non-finite was passed on (and inherits its producer), re-read (saved
tensors in backward), or meant (``masked_fill(-inf)``, ``full(-inf)``: an infinity written from the user's own
constant). What became of a producer's value (``taint.py``) decides whether it fails or is a note.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dtypecheck.dtypes import spec_of
from dtypecheck.nantrace.checks import Follow, op_checks
from dtypecheck.nantrace.frames import location_of
from dtypecheck.nantrace.ops import has_nonfinite_scalar, iter_tensors, mutated_argument
from dtypecheck.nantrace.records import Checked, OpRecord, readable, version_of
from dtypecheck.nantrace.report import Consequence, Event, EventKind, HistoryEntry, Phase, ValueCounts
from dtypecheck.nantrace.rerun import cause_of, counts_of, output_now_or_rerun
from dtypecheck.nantrace.taint import NOTES, Taint

if TYPE_CHECKING:
    import torch

NODE_KEY = "dtypecheck_nantrace"
"""Key in an autograd node's ``metadata``: (forward frame, module) of the op that created it."""

_UNKNOWN_COUNTS = ValueCounts(None, None, None, None, None)
_DETAILED = 64
"""Producers examined in detail (counts, float64 re-run); later ones (a scaler skipping many steps) are cheaper."""
_COLLECTIVES = ("c10d.", "_c10d_functional.", "c10d_functional.")


def _materialise(checks: list[Checked]) -> None:
    """One device-to-host transfer per dtype for the whole window, instead of one sync per op."""
    import torch

    by_dtype: dict[torch.dtype, list[Checked]] = {}
    for checked in checks:
        if checked.lo is not None:
            by_dtype.setdefault(checked.lo.dtype, []).append(checked)
    for group in by_dtype.values():
        values = torch.stack([t for c in group for t in (c.lo, c.hi) if t is not None]).tolist()
        for i, checked in enumerate(group):
            checked.settle(values[2 * i], values[2 * i + 1])
    smalls = [c for c in checks if c.small is not None]
    if smalls:
        for checked, count in zip(smalls, torch.stack([c.small for c in smalls]).tolist(), strict=True):  # type: ignore[misc]
            checked.small_count = int(count)


_LIFTS = frozenset({"aten.lift_fresh.default", "aten.lift_fresh_copy.default"})
"""The ops ``torch.tensor`` and ``from_numpy`` hand a Python constant or NumPy array through."""


class Judge:
    """Keeps what must outlive a window: the history, where non-finite values went, events and warnings."""

    def __init__(
        self,
        *,
        history: int,
        warn_frac: float,
        keep_going: bool,
        owner_of: Callable[[torch.Tensor], str | None] = lambda tensor: None,
        rank: int | None = None,
    ) -> None:
        self.owner_of = owner_of
        """Names the module whose parameter an op outside every forward wrote (the optimizer step)."""
        self.warn_frac = warn_frac
        self.keep_going = keep_going
        self.rank = rank
        self.history: deque[tuple[Any, ...]] = deque(maxlen=max(history, 0))
        self.events: list[Event] = []
        """Failures: producers whose value mattered."""
        self.handled: list[Event] = []
        """Notes: producers whose value was masked or whose step GradScaler skipped."""
        self.warnings: list[Event] = []
        self.taint = Taint()
        self.scaled_backward = False
        """A GradScaler scales the loss: gradients near the dtype's max are its doing, not a climb."""
        self.untraced_inputs: set[int] = set()
        """``op_index`` of each producer that read a non-finite value no traced op produced (data that arrived from
        a DataLoader worker, a constant made before tracing, or what such a value passed through): when a worker
        found where that data went non-finite, its producer is the root (``workers.merge_workers``)."""
        self._read_untraced = False
        self._warned: set[tuple[str, str | None]] = set()
        self._checks = list(op_checks())

    # -- inputs ------------------------------------------------------------------------------------------------
    def _inputs_state(self, record: OpRecord, look: bool) -> tuple[bool, bool, list[torch.Tensor], list[int]]:
        """(an input held NaN, an input held inf, inputs holding NaN from outside everything traced, producers).

        ``look``: examine inputs no traced op made (data, constants made before tracing) on the device; only
        worth a sync when the output is non-finite.
        """
        import torch

        nan_in = inf_in = False
        external: list[torch.Tensor] = []
        origins: list[int] = []
        for checked in record.pre:
            if checked.nonfinite:
                known = self.taint.known(checked.tensor)
                if known is not None and known[2] is not None:
                    origins.append(known[2])
                else:
                    self._read_untraced = True
                    if known is None and checked.has_nan:
                        external.append(checked.tensor)
                nan_in |= checked.has_nan
                inf_in |= checked.has_inf
        if not self.taint.storages and not look:
            return nan_in, inf_in, external, origins
        for tensor, version in record.inputs:
            known = self.taint.known(tensor)
            if known is None and look and version_of(tensor) == version and tensor.numel() and readable(tensor):
                with torch.no_grad():
                    has_nan = bool(torch.isnan(tensor).any())
                    has_inf = bool(torch.isinf(tensor).any())
                recent = self._recent_producer(record)
                if (has_nan or has_inf) and recent is not None:
                    # Backward passed it on through an op too cheap to record (relu's backward): it descends
                    # from the producer this backward pass already found.
                    self.taint.mark(tensor, has_nan, has_inf, recent)
                elif has_nan or has_inf:
                    # Not an output of any traced op judged so far: it came in with the data or, outside the
                    # forward of a distributed run, through a collective that is not an op (DDP's reducer).
                    if has_nan or self._arrived(record):
                        external.append(tensor)
                    self.taint.mark(tensor, has_nan, has_inf, None)
                    recent = None
                known = (has_nan, has_inf, recent)
            if known is not None:
                nan_in |= known[0]
                inf_in |= known[1]
                if known[2] is not None:
                    origins.append(known[2])
                elif known[0] or known[1]:
                    self._read_untraced = True
        return nan_in, inf_in, external, origins

    def _arrived(self, record: OpRecord) -> bool:
        return self.rank is not None and record.phase != "forward"

    def _recent_producer(self, record: OpRecord) -> int | None:
        """In backward: the last producer, when it was found in this step's backward too."""
        if record.node is None or not self.taint.producers:
            return None
        last = self.taint.producers[-1].event
        return len(self.taint.producers) - 1 if last.phase == "backward" and last.step == record.step else None

    # -- the flush ---------------------------------------------------------------------------------------------
    def judge_window(
        self, window: list[OpRecord], native: Callable[[int, int, int], list[tuple[Any, ...]]] | None = None
    ) -> None:
        """``native``: the history lines of the window's ops that the C++ path ran and found clean
        (``entries(after, before, last)``: those between two op indices, only the last ``last``), put into the
        history in op order between the records judged here."""
        _materialise([c for r in window for c in (*r.pre, *r.checked)])
        after = -1
        for record in window:
            # What ran after the first failure is not "before the failure": stop judging unless keep-going.
            if not self.stopped:
                if native is not None:
                    self.history.extend(native(after, record.index, self.history.maxlen or 0))
                    after = record.index
                self.tag_forward_node(record)
                if record.checked:
                    self._judge(record)
                elif self.taint.storages and record.result is not None:
                    self._pass_on(record)
            record.release()
        if native is not None and not self.stopped:
            self.history.extend(native(after, -1, self.history.maxlen or 0))

    @property
    def stopped(self) -> bool:
        return bool(self.events) and not self.keep_going

    def tag_forward_node(self, record: OpRecord) -> None:
        """Settle a record's phase and, for a forward op, put its line and module on the autograd node its output
        got (backward ops are named by it). Done once: at the next op (``Tracer._tag_pending``), before anything
        can replace that node (an in-place op on the output gives it the in-place op's), else at the flush."""
        import torch

        if record.tagged:
            return
        record.tagged = True
        if record.node is not None:
            record.phase = "backward"
            record.grad_fn = record.node.name()
            origin = record.node.metadata.get(NODE_KEY)
            if origin is not None:
                record.frame, record.module = origin
            return
        grad_fn = _grad_fn_of(record.result, record.grad_enabled) if isinstance(record.result, torch.Tensor) else None
        if grad_fn is not None and record.grad_enabled:
            metadata: dict[str, Any] = grad_fn.metadata
            metadata[NODE_KEY] = (record.frame, record.module)
            record.grad_fn = grad_fn.name()
        record.phase = "forward" if record.module is not None or grad_fn is not None else "other"

    def _judge(self, record: OpRecord) -> None:
        nonfinite = any(c.nonfinite for c in record.checked)
        for check in self._checks:
            for verdict in check.on_op(record, self, nonfinite):
                if isinstance(verdict, Follow):
                    self.follow_nonfinite(record, nonfinite)
                else:
                    self.warning(record, verdict.kind, verdict.position)
        for checked in record.checked:
            # A summary, not the record: the history must not keep outputs alive.
            summary = (record.info.name, record.phase, record.module, record.frame, checked.tensor.dtype)
            self.history.append((*summary, checked.absmax))

    def _pass_on(self, record: OpRecord) -> None:
        """An unchecked op (a view, clone, relu) hands its input's producer on to a new storage."""
        import torch

        for value in (*record.args, *record.kwargs.values()):
            if isinstance(value, torch.Tensor):
                known = self.taint.known(value)
                if known is not None and record.result is not None and record.result.is_floating_point():
                    self.taint.mark(record.result, *known)
                    return

    def follow_nonfinite(self, record: OpRecord, nonfinite: bool) -> None:
        """The ``nonfinite`` check: find producers, follow their values, note where they are masked."""
        if not nonfinite:
            if self.taint.storages or record.pre:
                for masked in self._inputs_state(record, look=False)[3]:
                    self.taint.producers[masked].masked = True
            if self.taint.storages:  # nothing to clear in a clean run (the common case: skip the storage lookups)
                for checked in record.checked:
                    self.taint.clear(checked.tensor)
            return
        out_nan = any(c.has_nan for c in record.checked)
        out_inf = any(c.has_inf for c in record.checked)
        self._read_untraced = False
        nan_in, inf_in, external_nan, origins = self._inputs_state(record, look=True)
        kind: EventKind | None = None
        nonfinite_input = False
        if record.info.name.startswith(_COLLECTIVES) and not (nan_in or inf_in):
            # Arrived from another process: born there, not in the collective (that process reports its birth).
            kind, nonfinite_input = ("nan" if out_nan else "inf"), True
        elif out_nan and not nan_in:
            kind = "nan"
        elif out_inf and not out_nan and not (nan_in or inf_in):
            # The user's own infinite constant, or a creation op (full, scalar_tensor) that read no tensor. A
            # ``torch.tensor(float("inf"))`` reaches lift_fresh as a tensor that lift_fresh hands back itself, often
            # overwritten before the flush (a quantisation observer's running min starts at +inf): its check here
            # is what the user wrote, never a value tracing saw born.
            reads_nothing = not record.inputs and not record.pre
            constant = has_nonfinite_scalar(record.args, record.kwargs) or record.info.name in _LIFTS
            kind = None if constant or reads_nothing else "inf"
        elif external_nan:
            kind, nonfinite_input = ("nan" if out_nan else "inf"), True
        origin: int | None = origins[0] if origins else None
        if kind is not None:
            event = self._event(record, kind, nonfinite_input)
            origin = self.taint.add(event, tuple(dict.fromkeys(origins)))
            if self._read_untraced and not origins:
                self.untraced_inputs.add(event.op_index)
            for tensor in external_nan:
                known = self.taint.known(tensor)
                self.taint.mark(tensor, True, known is not None and known[1], origin)
        for checked in record.checked:
            if checked.nonfinite:
                self.taint.mark(checked.tensor, checked.has_nan, checked.has_inf, origin)
            else:
                self.taint.clear(checked.tensor)

    # -- consequences ------------------------------------------------------------------------------------------
    def fail(self, origin: int, consequence: Consequence) -> bool:
        """``origin``'s value mattered: it and the producers it descends from become failures."""
        failed = False
        for index in self.taint.lineage(origin):
            if self.stopped:
                break
            event = self.taint.resolve(index, consequence)
            if event is not None:
                self.handled = [e for e in self.handled if e.op_index != event.op_index]
                self.events.append(event)
                failed = True
        return failed

    def note(self, origin: int, consequence: Consequence) -> Event | None:
        """``origin``'s value was handled; listed when it is a root (not a NaN made from another's infinities)."""
        event = self.taint.resolve(origin, consequence)
        if event is not None and not self.taint.producers[origin].parents:
            self.handled.append(event)
        return event

    def producer_index(self, event: Event) -> int:
        return next(i for i, p in enumerate(self.taint.producers) if p.event.op_index == event.op_index)

    def origin_of(self, tensor: torch.Tensor) -> int | None:
        known = self.taint.known(tensor)
        return known[2] if known is not None else None

    def reached(self, tensor: torch.Tensor, consequence: Consequence) -> bool:
        """A sink: ``tensor`` (a parameter, an optimizer state) holds a producer's value."""
        origin = self.origin_of(tensor)
        return origin is not None and self.fail(origin, consequence)

    def reached_loss(self, loss: torch.Tensor, *, defer: bool) -> bool:
        """``backward()`` was called on ``loss``; ``defer`` while a GradScaler may still skip the step."""
        origin = self.origin_of(loss)
        if origin is None:
            return False
        if not defer:
            return self.fail(origin, "loss")
        for index in self.taint.lineage(origin):
            self.taint.producers[index].reached_loss = True
        return False

    def settle(self, *, final: bool, raised: bool = False) -> bool:
        """Decide every open producer that can be decided now (at a step's end; ``final``: the run's; ``raised``:
        the traced code died of an exception, which every value still in flight and not masked then fails with)."""
        live = self.taint.live_origins()
        failed = False
        # Decisive ones first: a value held or at the loss fails the producers it descends from with that reason.
        pending = self.taint.pending()
        pending.sort(key=lambda o: not (self.taint.producers[o].reached_loss or o in live))
        for origin in pending:
            producer = self.taint.producers[origin]
            if producer.resolved is not None:  # failed with a descendant meanwhile
                continue
            if producer.reached_loss:
                failed |= self.fail(origin, "loss")
            elif raised and not producer.masked:
                failed |= self.fail(origin, "exception")
            elif origin in live:
                if final:
                    failed |= self.fail(origin, "output")
            elif producer.masked:
                self.note(origin, "masked")
            else:
                failed |= self.fail(origin, "unmasked")
        return failed

    def skip_step(self) -> Event | None:
        """GradScaler skipped the step: every open producer is a note; the first of them, if any."""
        first = None
        for origin in self.taint.pending():
            event = self.note(origin, "skipped_step")
            first = first or event
        return first

    # -- warnings ----------------------------------------------------------------------------------------------
    def already_warned(self, kind: str, module: str | None) -> bool:
        return (kind, module) in self._warned

    def warning(self, record: OpRecord, kind: EventKind, position: int) -> None:
        key = (kind, record.module)
        if key in self._warned:
            return
        self._warned.add(key)
        event = self._event(record, kind, False, position=position, with_history=False)
        self.warnings.append(event)

    # -- events ------------------------------------------------------------------------------------------------
    def _event(
        self,
        record: OpRecord,
        kind: EventKind,
        nonfinite_input: bool,
        *,
        position: int | None = None,
        with_history: bool = True,
    ) -> Event:
        if position is None:
            position = next(i for i, c in enumerate(record.checked) if (c.has_nan if kind == "nan" else c.has_inf))
        checked = record.checked[position]
        dtype = checked.tensor.dtype
        detailed = kind not in ("nan", "inf") or len(self.taint.producers) < _DETAILED
        output = output_now_or_rerun(record, position) if detailed else None
        counts, absmax = counts_of(output) if output is not None else (_UNKNOWN_COUNTS, checked.absmax)
        cause = None
        if kind in ("nan", "inf"):
            collective = nonfinite_input and (record.info.name.startswith(_COLLECTIVES) or self._arrived(record))
            cause = "collective" if collective else (cause_of(record, kind, nonfinite_input) if detailed else None)
        phase: Phase = record.phase  # type: ignore[assignment]
        module = record.module
        if module is None and phase == "other":
            module = self.owner_of(checked.tensor)
        return Event(
            kind=kind,
            phase=phase,
            op=record.info.name,
            grad_fn=record.grad_fn,
            module=module,
            dtype=str(dtype).removeprefix("torch."),
            location=location_of(record.frame),
            counts=counts,
            absmax=absmax,
            limit=spec_of(dtype).fmt.max,
            cause=cause,
            step=record.step,
            op_index=record.index,
            history=self._history_entries() if with_history else (),
            level="fail" if kind in ("nan", "inf") else "warn",
            rank=self.rank,
        )

    def _history_entries(self) -> tuple[HistoryEntry, ...]:
        entries = []
        for op, phase, module, frame, dtype, absmax in self.history:
            limit = spec_of(dtype).fmt.max
            entries.append(
                HistoryEntry(
                    op=op,
                    phase=phase,
                    module=module,
                    dtype=str(dtype).removeprefix("torch."),
                    absmax=absmax,
                    limit=limit,
                    ratio=absmax / limit,
                    location=location_of(frame),
                )
            )
        return tuple(entries)


def _grad_fn_of(tensor: torch.Tensor, grad_enabled: bool) -> Any:
    """``tensor.grad_fn``, read at the next op or at the flush, without ever failing the user's code.

    Reading a view's ``grad_fn`` regenerates it when its base changed in place since; for a view made in no_grad
    mode (``Embedding(padding_idx=...)`` zeroing ``weight[0]``) autograd forbids that and raises "A view was
    created in no_grad mode...". Such a view has no ``grad_fn`` of its own (None), and plain code never asks."""
    if not grad_enabled and tensor._is_view():
        return None
    try:
        return tensor.grad_fn
    except RuntimeError:  # any other view autograd refuses to regenerate: no node to tag, not a crash
        return None


def written_tensors(record: OpRecord, out: Any) -> list[torch.Tensor]:
    """What an op produced: its returned tensors, or what it wrote when it returns nothing (``_foreach_*_``)."""
    tensors = list(iter_tensors(out))
    if not tensors:
        for where in record.info.written:
            tensors += iter_tensors(mutated_argument(record.args, record.kwargs, where))
    return tensors


__all__ = ["NODE_KEY", "NOTES", "Judge", "written_tensors"]
