"""The flush: read back a window of cheap reductions at once, then judge each op in order.

An op is a *producer* when its output holds a NaN and none of its inputs did, or an infinity while its inputs
were all finite. Everything else that is non-finite was passed on, re-read (saved tensors in backward), or
meant (``masked_fill(-inf)``, ``full(-inf)``: an infinity written from the user's own constant).
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dtypecheck.dtypes import spec_of
from dtypecheck.nantrace.frames import location_of
from dtypecheck.nantrace.ops import has_nonfinite_scalar, iter_tensors, mutated_argument
from dtypecheck.nantrace.records import Checked, OpRecord
from dtypecheck.nantrace.report import Event, EventKind, HistoryEntry, Phase, ValueCounts
from dtypecheck.nantrace.rerun import cause_of, counts_of, output_now_or_rerun, underflows_in_float32

if TYPE_CHECKING:
    import torch

NODE_KEY = "dtypecheck_nantrace"
"""Key in an autograd node's ``metadata``: (forward frame, module) of the op that created it."""

_UNKNOWN_COUNTS = ValueCounts(None, None, None, None, None)


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
            lo, hi = values[2 * i], values[2 * i + 1]
            checked.has_nan = math.isnan(lo) or math.isnan(hi)
            checked.has_inf = lo == float("-inf") or hi == float("inf")
            checked.absmax = float("nan") if checked.has_nan else max(-lo, hi)
    smalls = [c for c in checks if c.small is not None]
    if smalls:
        for checked, count in zip(smalls, torch.stack([c.small for c in smalls]).tolist(), strict=True):  # type: ignore[misc]
            checked.small_count = int(count)


def _has_scalar_at_least(record: OpRecord, magnitude: float) -> bool:
    values = (*record.args, *record.kwargs.values())
    return any(isinstance(v, float) and abs(v) >= magnitude for v in values)


def _storage_of(tensor: torch.Tensor) -> tuple[int, weakref.ref[torch.UntypedStorage]]:
    """(address, weak reference) of the memory a tensor views.

    Keyed by storage rather than by tensor: backward reads saved outputs through new tensor objects over the
    same memory, and the weak reference follows the memory (not a Python object), so a freed and reused
    address is never mistaken for the old tensor.
    """
    storage = tensor.untyped_storage()
    return int(storage.data_ptr()), weakref.ref(storage)


class Judge:
    """Keeps what must outlive a window: the history, known non-finite tensors, events and warnings."""

    def __init__(
        self,
        *,
        history: int,
        warn_frac: float,
        keep_going: bool,
        owner_of: Callable[[torch.Tensor], str | None] = lambda tensor: None,
    ) -> None:
        self.owner_of = owner_of
        """Names the module whose parameter an op outside every forward wrote (the optimizer step)."""
        self.warn_frac = warn_frac
        self.keep_going = keep_going
        self.history: deque[tuple[Any, ...]] = deque(maxlen=max(history, 0))
        self.events: list[Event] = []
        self.warnings: list[Event] = []
        self._warned: set[tuple[str, str | None]] = set()
        self._nonfinite: dict[int, tuple[weakref.ref[torch.UntypedStorage], bool, bool]] = {}
        """Storage address -> (storage, has NaN, has inf) for outputs judged non-finite, in op order."""

    # -- bookkeeping -------------------------------------------------------------------------------------------
    def _known(self, tensor: torch.Tensor) -> tuple[bool, bool] | None:
        entry = self._nonfinite.get(int(tensor.untyped_storage().data_ptr()))
        if entry is None or entry[0]() is None:
            return None
        return entry[1], entry[2]

    def _remember(self, checked: Checked) -> None:
        key, storage = _storage_of(checked.tensor)
        if checked.nonfinite:
            self._nonfinite[key] = (storage, checked.has_nan, checked.has_inf)
        else:
            self._nonfinite.pop(key, None)

    def _inputs_state(self, record: OpRecord) -> tuple[bool, bool, bool]:
        """(an input held NaN, an input held inf, a NaN came from outside everything traced so far)."""
        import torch

        nan_in = any(c.has_nan for c in record.pre)
        inf_in = any(c.has_inf for c in record.pre)
        external_nan = False
        for tensor, version in record.inputs:
            known = self._known(tensor)
            if known is None and tensor._version == version and tensor.numel():
                with torch.no_grad():
                    has_nan = bool(torch.isnan(tensor).any())
                    has_inf = bool(torch.isinf(tensor).any())
                if has_nan or has_inf:
                    # Not an output of any traced op judged so far: it came in with the data.
                    external_nan |= has_nan
                    key, storage = _storage_of(tensor)
                    self._nonfinite[key] = (storage, has_nan, has_inf)
                known = (has_nan, has_inf)
            if known is not None:
                nan_in |= known[0]
                inf_in |= known[1]
        return nan_in, inf_in, external_nan

    # -- the flush ---------------------------------------------------------------------------------------------
    def judge_window(self, window: list[OpRecord]) -> None:
        _materialise([c for r in window for c in (*r.pre, *r.checked)])
        done = False
        for record in window:
            if not done:
                self._tag_forward_node(record)
                if record.checked:
                    self._judge(record)
                # What ran after the first event is not "before the failure": stop judging unless keep-going.
                done = bool(self.events) and not self.keep_going
            record.release()

    def _tag_forward_node(self, record: OpRecord) -> None:
        import torch

        if record.node is not None:
            record.phase = "backward"
            record.grad_fn = record.node.name()
            origin = record.node.metadata.get(NODE_KEY)
            if origin is not None:
                record.frame, record.module = origin
            return
        grad_fn = record.result.grad_fn if isinstance(record.result, torch.Tensor) else None
        if grad_fn is not None and record.grad_enabled:
            metadata: dict[str, Any] = grad_fn.metadata  # type: ignore[assignment]
            metadata[NODE_KEY] = (record.frame, record.module)
            record.grad_fn = grad_fn.name()
        record.phase = "forward" if record.module is not None or grad_fn is not None else "other"

    def _judge(self, record: OpRecord) -> None:
        out_nan = any(c.has_nan for c in record.checked)
        out_inf = any(c.has_inf for c in record.checked)
        if out_nan or out_inf or self._nonfinite:
            self._judge_nonfinite(record, out_nan, out_inf)
        if not (out_nan or out_inf):
            self._warn(record)
        for checked in record.checked:
            # A summary, not the record: the history must not keep outputs alive.
            summary = (record.info.name, record.phase, record.module, record.frame, checked.tensor.dtype)
            self.history.append((*summary, checked.absmax))

    def _judge_nonfinite(self, record: OpRecord, out_nan: bool, out_inf: bool) -> None:
        if out_nan or out_inf:
            nan_in, inf_in, external_nan = self._inputs_state(record)
            kind: EventKind | None = None
            nonfinite_input = False
            if out_nan and not nan_in:
                kind = "nan"
            elif out_inf and not out_nan and not (nan_in or inf_in):
                # The user's own infinite constant, or a creation op (full, scalar_tensor) that read no tensor.
                reads_nothing = not record.inputs and not record.pre
                meant = has_nonfinite_scalar(record.args, record.kwargs) or reads_nothing
                kind = None if meant else "inf"
            elif external_nan:
                kind, nonfinite_input = "nan", True
            if kind is not None and (self.keep_going or not self.events):
                self.events.append(self._event(record, kind, nonfinite_input))
        for checked in record.checked:
            self._remember(checked)

    def _warn(self, record: OpRecord) -> None:
        for position, checked in enumerate(record.checked):
            dtype = checked.tensor.dtype
            fmt = spec_of(dtype).fmt
            if checked.absmax >= self.warn_frac * fmt.max:
                # A huge constant the user wrote (finfo.min masks) is not a climb towards overflow.
                if not _has_scalar_at_least(record, self.warn_frac * fmt.max):
                    self._warning(record, "near_overflow", position)
            elif checked.small_count:
                numel = checked.tensor.numel()
                if 2 * checked.small_count > numel and ("underflow", record.module) not in self._warned:
                    found = underflows_in_float32(record, position, fmt.smallest_normal)
                    if found is not None and 2 * found[0] > found[1]:
                        self._warning(record, "underflow", position)

    def _warning(self, record: OpRecord, kind: EventKind, position: int) -> None:
        key = (kind, record.module)
        if key in self._warned:
            return
        self._warned.add(key)
        self.warnings.append(self._event(record, kind, False, position=position, with_history=False))

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
        output = output_now_or_rerun(record, position)
        counts, absmax = counts_of(output) if output is not None else (_UNKNOWN_COUNTS, checked.absmax)
        cause = cause_of(record, kind, nonfinite_input) if kind in ("nan", "inf") else None
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


def written_tensors(record: OpRecord, out: Any) -> list[torch.Tensor]:
    """What an op produced: its returned tensors, or what it wrote when it returns nothing (``_foreach_*_``)."""
    tensors = list(iter_tensors(out))
    if not tensors:
        for where in record.info.written:
            tensors += iter_tensors(mutated_argument(record.args, record.kwargs, where))
    return tensors
