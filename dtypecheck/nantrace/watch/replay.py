"""Replaying the step a ``Watcher`` found non-finite: its pieces (re-running a model call and its backward,
renumbering what the tracer found), ``StepReplay`` (the half of the ``Watcher`` that replays a step under the full
tracer, or gives up and traces the following steps) and the report the watch ends with."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

from dtypecheck.nantrace.frames import stand_in
from dtypecheck.nantrace.ops import tensors_in
from dtypecheck.nantrace.report import Event, NanTraceReport, ScaleCollapse, SkippedStep, WatchSummary
from dtypecheck.nantrace.tracer import TraceOptions, Tracer
from dtypecheck.nantrace.training import untraced
from dtypecheck.nantrace.watch.held import NOT_WATCHED
from dtypecheck.nantrace.watch.state import (
    BufferSnapshot,
    ModelCall,
    OptimizerSnapshot,
    RngState,
    all_finite,
    read_flags,
    same_values,
)
from dtypecheck.nantrace.watch.workers import WorkerReplay
from dtypecheck.nantrace.workers import merge_workers

if TYPE_CHECKING:
    import torch
    from torch import nn

CAME_OUT_FINITE = (
    "the replay of the step came out finite (a value born outside the model calls watch mode re-runs, such as "
    "the loss computed from the model's output, a side effect, or a non-deterministic op)"
)


ARRIVED = (
    "born on another rank: this rank's own gradients came out finite in the replay, the step's arrived "
    "non-finite through DDP's gradient all-reduce"
)
BORN_OUTSIDE = (
    "the replayed model output was finite while the gradient the step sent into it was not: the value was born "
    "between the model's output and the loss (outside every module), which watch mode does not re-run, or the "
    "replay took another path than the step (a side effect, a non-deterministic op)"
)


def _inner(module: nn.Module) -> nn.Module:
    """DDP's wrapped module: a replay on one rank must not start collectives the other ranks will not join."""
    from torch.nn.parallel import DistributedDataParallel

    return module.module if isinstance(module, DistributedDataParallel) else module


def _shift(event: Event, offset: int) -> Event:
    return dataclasses.replace(event, step=event.step + offset)


def shifted(report: NanTraceReport, offset: int) -> NanTraceReport:
    """A report traced from step 1 renumbered to start at step ``offset + 1``."""
    return dataclasses.replace(
        report,
        first=_shift(report.first, offset) if report.first is not None else None,
        events=tuple(_shift(e, offset) for e in report.events),
        warnings=tuple(_shift(e, offset) for e in report.warnings),
        handled=tuple(_shift(e, offset) for e in report.handled),
    )


@contextlib.contextmanager
def post_hooks_apart() -> Iterator[None]:
    """Let a tracer add and remove its optimizer post hook from inside a post hook: torch is iterating the live
    dict of global post hooks, so the tracer registers into a copy that stands in for it meanwhile."""
    import torch.optim.optimizer as optimizer_module

    running = optimizer_module._global_optimizer_post_hooks
    optimizer_module._global_optimizer_post_hooks = collections.OrderedDict(running)
    try:
        yield
    finally:
        optimizer_module._global_optimizer_post_hooks = running


BORN_IN_THE_DATA = (
    "the model's inputs were already non-finite when it was called: the value was born before the call (in the "
    "data, or code between loading it and the model), which watch mode does not re-run; the model's first op "
    "that read it is reported (run without --watch to name the line that made it)"
)


LOSS_OUTSIDE = (
    "the step's loss went non-finite while every replayed model output was finite: it was born in the loss "
    "computed outside the model calls, which watch mode does not re-run; the first non-finite value inside them is "
    "reported (run without --watch to name the loss's own op)"
)


def _said(exc: BaseException) -> str:
    """``OverflowError: (34, 'Numerical result out of range')``: the type and the first line of the message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def keep_grad(call: ModelCall, position: int, output_nr: int, grads: tuple[torch.Tensor | None, ...]) -> None:
    """A pre-hook of the node that made the call's output tensor at ``position`` (its ``output_nr``-th output):
    the gradient backward sends into it, summed over backward passes. A node's pre-hook costs half of a tensor
    hook (issue 30.5) and sees the same gradient: the one that flowed into the tensor as the call returned it,
    also when the user changed it in place afterwards."""
    grad = grads[output_nr]
    if grad is None:
        return
    held = call.grads.get(position)
    call.grads[position] = grad if held is None else held + grad


SHARDED = (
    "the model is sharded (FSDP): its calls gather parameters from every rank, so this rank could not re-run them "
    "alone; the following steps were traced fully instead"
)


def _sharded(roots: list[nn.Module]) -> bool:
    """Whether a module under ``roots`` is FSDP's (``fully_shard``'s ``FSDPModule``, or the older wrapper): its
    forward all-gathers and its backward reduce-scatters, collectives a replay on one rank would wait in forever
    (DDP's are left out by running its inner module)."""
    import sys

    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None:
        return False
    kinds = tuple(k for k in (getattr(fsdp, "FSDPModule", None), getattr(fsdp, "FullyShardedDataParallel", None)) if k)
    return bool(kinds) and any(isinstance(module, kinds) for root in roots for module in root.modules())


def replay_call(call: ModelCall) -> bool:
    """One model call again, and backward from its outputs with the gradients they received the first time.

    True when the outputs came out finite but a gradient sent into them was not: born outside the model."""
    import torch
    from torch.utils._pytree import tree_map

    where = call.where  # noqa: F841  (read by the tracer's frame walk: ``frames.stand_in`` below)
    # An argument computed by an earlier call (a block run under activation checkpointing, then the head) belongs to
    # the step's own graph, which its backward has freed: each call is replayed apart, backward from its outputs.
    args, kwargs = tree_map(_cut, (call.args, call.kwargs))
    with call.autocast.applied():
        output = _inner(call.module)(*args, **kwargs)
    tensors = list(tensors_in(output))
    with untraced():
        finite_out = read_flags([all_finite(tensors)])
        grads = call.gradients()
        finite_in = read_flags([all_finite(list(grads.values()))])
    call.output_finite = finite_out
    if finite_out and not finite_in:
        return True
    roots = [(t, grads[i]) for i, t in enumerate(tensors) if i in grads and t.grad_fn is not None]
    # An output computed from another output (HF's loss from its logits) already sends the other its gradient.
    roots = [(t, g) for t, g in roots if not any(o is not t and _depends_on(o, t) for o, _ in roots)]
    if roots:
        torch.autograd.backward([t for t, _ in roots], [g for _, g in roots])
    return False


stand_in(replay_call.__code__, "where")


def _cut(value: Any) -> Any:
    import torch

    return value.detach() if isinstance(value, torch.Tensor) and value.grad_fn is not None else value


def _depends_on(later: torch.Tensor, earlier: torch.Tensor) -> bool:
    """Whether ``later`` was computed from ``earlier`` (its autograd node is reachable from ``later``'s)."""
    target = earlier.grad_fn
    seen: set[int] = set()
    stack = [later.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        if node is target:
            return True
        seen.add(id(node))
        stack.extend(n for n, _ in node.next_functions)
    return False


Detected = Literal["loss", "gradients", "optimizer_step", "scale_collapse", "held_tensors"]


class StepReplay:
    """The ``Watcher``'s replays and its result. The state is the ``Watcher``'s (set in its ``__init__``): the
    watching half fills in what the step did, this half replays it and says what the watch found."""

    options: TraceOptions
    optimizer_snapshot: bool
    step: int
    optimizer_seen: bool
    done: bool
    detected: Detected | None
    detected_step: int | None
    replayed_step: int | None
    exact: bool | None
    reason: str | None
    traced_from: int | None
    snapshot_bytes: int
    skipped: list[SkippedStep]
    scale_collapse: ScaleCollapse | None
    _model: nn.Module | None
    _on_found: Callable[[], None] | None
    _busy: bool
    _roots: list[nn.Module]
    _calls: list[ModelCall]
    _rng: RngState | None
    _buffers: BufferSnapshot
    _optimizers: OptimizerSnapshot
    _tracer: Tracer | None
    _offset: int
    _fallback: Tracer | None
    _fallback_pending: bool
    _update_done: bool
    _found: NanTraceReport | None
    held_nonfinite: tuple[str, ...]
    _workers: WorkerReplay
    arguments_nonfinite: bool

    # -- replays -----------------------------------------------------------------------------------------------
    def _new_tracer(self) -> Tracer:
        model = self._model if self._model is not None else (self._roots[0] if self._roots else None)
        # torch.compile's wrapper: a full trace runs the module it wraps, and names from there.
        model = getattr(model, "_orig_mod", model)
        names = None if model is None else {id(m): n for n, m in model.named_modules()}
        tracer = Tracer(dataclasses.replace(self.options, stop_run=False, keep_going=False), module_names=names)
        # The update's writes are named after the model's parameters even when no forward runs in the replay.
        for root in self._roots:
            tracer.modules._roots.setdefault(id(root), root)
        tracer.training.optimizer_seen = self.optimizer_seen
        self._offset = self.step - 1
        return tracer

    def _why_not_replayable(self) -> str | None:
        if not self._calls:
            return "no model call with gradients on was seen in this step, so there was nothing to re-run"
        if any(not c.arguments_unchanged() for c in self._calls):
            return "the step's inputs were overwritten in place after the model read them"
        if _sharded(self._roots):
            return SHARDED
        return None

    def _replay_calls(self) -> None:
        """Re-run the step's model calls and their backward from the saved state, under a tracer left on."""
        import torch

        reason = self._why_not_replayable()
        if reason is not None or self._rng is None:
            self._give_up(reason or "the step's starting state was not saved")
            return
        parameters = list(dict.fromkeys(p for root in self._roots for p in root.parameters()))
        original = [p.grad for p in parameters]
        now = RngState.take()
        self._busy = True
        tracer = self._new_tracer()
        # The step's loss was finite: the model outputs backward starts from are not it (a NaN a loss ignores,
        # such as a masked position's, goes on into the gradients and the parameters, as in a full trace).
        tracer.training.backward_from_loss = self.detected != "gradients"
        buffers_exact = self._buffers.put_back()
        try:
            self._rng.put_back()
            for parameter in parameters:
                parameter.grad = None
            with torch.enable_grad():
                tracer.__enter__()
                try:
                    outside = [replay_call(call) for call in self._calls]
                except Exception as exc:  # noqa: BLE001  (the replay must never break the run it watches)
                    tracer.__exit__(None, None, None)
                    for parameter, grad in zip(parameters, original, strict=True):
                        parameter.grad = grad  # the step goes on with the gradients it computed itself
                    self._give_up(f"the replay raised {_said(exc)}", replayed=True)
                    return
                except BaseException:
                    tracer.__exit__(None, None, None)
                    raise
        finally:
            now.put_back()
            self._busy = False
        self._tracer = tracer
        self.replayed_step = self.step
        with untraced():  # the tracer is on: dtypecheck's own bookkeeping is not the step's
            try:
                failed_replay = self._judge_replay(parameters, original, buffers_exact, outside, tracer)
            except Exception as exc:  # noqa: BLE001  (judging the replay must never break the run either)
                failed_replay = f"the replay could not be compared with the step ({_said(exc)})"
        if failed_replay is None:
            return
        self._tracer = None
        tracer.__exit__(None, None, None)
        # Born on another rank: tracing this rank's next steps would only meet it again through the all-reduce.
        self._give_up(failed_replay, replayed=True, trace_next=failed_replay is not ARRIVED)

    def _judge_replay(
        self,
        parameters: list[nn.Parameter],
        original: list[torch.Tensor | None],
        buffers_exact: bool,
        outside: list[bool],
        tracer: Tracer,
    ) -> str | None:
        """Whether the replay reproduced the step; the reason to give up on it, else None."""
        from torch.nn.parallel import DistributedDataParallel

        distributed = any(isinstance(r, DistributedDataParallel) for r in self._roots)
        same = all(
            (old is None) == (p.grad is None) and (old is None or p.grad is None or same_values(old, p.grad))
            for old, p in zip(original, parameters, strict=True)
        )
        if distributed:
            # The replay's gradients are this rank's own, the step's were averaged over the ranks.
            self.exact = buffers_exact
            self.reason = None if buffers_exact else "a buffer changed that was not copied"
        else:
            self.exact = same and buffers_exact
            if not same:
                self.reason = (
                    "the replayed gradients differ from the step's (a non-deterministic op, or gradients "
                    "accumulated outside the model calls watch mode saw)"
                )
            elif not buffers_exact:
                self.reason = "a buffer changed that was not copied"
        if self.detected == "loss" and self._calls and all(call.output_finite for call in self._calls):
            self.exact, self.reason = False, LOSS_OUTSIDE
        if not same and not distributed:
            for parameter, old in zip(parameters, original, strict=True):
                parameter.grad = old  # the run goes on with the gradients it computed itself
        # Data, not an earlier call's output (those have a grad_fn: their values were born in the replay too).
        arguments = [t for c in self._calls for t, _ in c.versions if t.is_floating_point() and t.grad_fn is None]
        self.arguments_nonfinite = not read_flags([all_finite(arguments)])
        replayed = [p.grad for p in parameters if p.grad is not None]
        if any(outside):
            failed_replay = BORN_OUTSIDE
        elif read_flags([all_finite(replayed)]) and not tracer.judge.events:
            # Nothing non-finite came out of the model calls.
            arrived = distributed and self.detected == "gradients"
            failed_replay = ARRIVED if arrived else CAME_OUT_FINITE
        else:
            failed_replay = None
        return failed_replay

    def _replay_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Re-run an update that wrote NaN/Inf from the optimizer snapshot taken before it, traced."""
        import torch

        if not self.optimizer_snapshot:
            self._give_up("the NaN was born in the optimizer step, and the optimizer snapshot is off")
            return
        written = [p for group in optimizer.param_groups for p in group["params"]]
        states = [optimizer.state.get(p, {}) for p in written]
        written += [v for state in states for v in state.values() if isinstance(v, torch.Tensor)]
        result = [t.detach().clone() for t in written]
        plain = [(state, key, value) for state in states for key, value in state.items()]
        if not self._optimizers.put_back(optimizer):
            self._give_up("no snapshot of this optimizer was taken before its update")
            return
        tracer = self._new_tracer()
        now = RngState.take()
        if (len(args) > 1 or "closure" in kwargs) and self._rng is not None:
            # The closure re-runs forward and backward: from the step's own RNG state and buffers.
            self._rng.put_back()
            self._buffers.put_back()
        self._busy = True
        try:
            with post_hooks_apart(), tracer:
                optimizer.step(*args[1:], **kwargs)  # the hook is given the optimizer as args[0]
        except Exception as exc:  # noqa: BLE001  (the replay must never break the run it watches)
            # The run goes on from what its own update wrote, not from a half-done replay.
            with torch.no_grad():
                for tensor, value in zip(written, result, strict=True):
                    tensor.copy_(value)
            for state, key, value in plain:
                if not isinstance(value, torch.Tensor):
                    state[key] = value  # a Python step counter: as the run's own update left it
            self._give_up(f"the replayed update raised {_said(exc)}", replayed=True)
            return
        finally:
            now.put_back()
            self._busy = False
        self.replayed_step = self.step
        again = [p for group in optimizer.param_groups for p in group["params"]]
        again += [v for p in again for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
        self.exact = len(again) == len(result) and all(same_values(a, b) for a, b in zip(again, result, strict=True))
        if not self.exact:
            self.reason = "the replayed update wrote different values (a non-deterministic optimizer)"
            if len(again) == len(result):
                with torch.no_grad():  # the run goes on from what its own update wrote, not from the replay's
                    for tensor, value in zip(again, result, strict=True):
                        tensor.copy_(value)
        self._tracer = tracer

    def _end_replay(self, *, entered: bool = True, consequence: str | None = None) -> None:
        tracer, self._tracer = self._tracer, None
        self._update_done = False
        assert tracer is not None
        if entered:
            tracer.__exit__(None, None, None)
        report = self._with_workers(tracer.report(), tracer)
        if report.first is None:
            self.exact = False
            self._give_up(CAME_OUT_FINITE, replayed=True)
            return
        if self.arguments_nonfinite and report.first.worker is None and self.exact:
            self.exact, self.reason = False, BORN_IN_THE_DATA
        if consequence is not None:
            first = dataclasses.replace(report.first, consequence=consequence)  # type: ignore[arg-type]
            report = dataclasses.replace(report, first=first, events=(first, *report.events[1:]))
        self._finish(shifted(report, self._offset))

    def _give_up(self, reason: str, *, replayed: bool = False, trace_next: bool = True) -> None:
        """Say why, and trace the following steps fully instead."""
        self.reason = reason
        self.exact = False if replayed else None
        if not replayed:
            self.replayed_step = None
        self.done = True
        self._fallback_pending = trace_next

    def _start_fallback(self) -> None:
        self.traced_from = self.step
        self._fallback = self._new_tracer()
        self._fallback.__enter__()

    def _end_fallback(self) -> None:
        tracer, self._fallback = self._fallback, None
        assert tracer is not None
        tracer.__exit__(None, None, None)
        report = self._with_workers(tracer.report(), tracer)
        self._finish(shifted(report, self._offset) if report.first is not None else None, traced=report)

    def _with_workers(self, report: NanTraceReport, tracer: Tracer) -> NanTraceReport:
        """The replayed step's producer, when it is data a DataLoader worker made non-finite, named at the worker
        (its batch re-made traced there, ``watch.workers``), as a full trace names it."""
        found = self._workers.collected()
        if report.first is None or not found:
            return report
        events = merge_workers(report.events, found, untraced=tracer.judge.untraced_inputs)
        return dataclasses.replace(report, first=events[0], events=events)

    def _finish(self, found: NanTraceReport | None, *, traced: NanTraceReport | None = None) -> None:
        self._found = found if found is not None else traced
        self.done = True
        if self._on_found is not None and (found is not None or self.scale_collapse is not None):
            self._on_found()

    # -- the result --------------------------------------------------------------------------------------------
    def summary(self) -> WatchSummary:
        return WatchSummary(
            steps_checked=self.step - 1,
            detected=self.detected,
            detected_step=self.detected_step,
            replayed_step=self.replayed_step,
            exact=self.exact,
            reason=self.reason,
            traced_from_step=self.traced_from,
            snapshot_bytes=self.snapshot_bytes,
            optimizer_snapshot=self.optimizer_snapshot,
            held_nonfinite=self.held_nonfinite,
        )

    def notes(self) -> tuple[str, ...]:
        if self.detected is None:
            skipped = f"; GradScaler skipped {len(self.skipped)} (notes)" if self.skipped else ""
            checked = (
                f"watch mode: {self.step - 1} step(s) checked (loss, gradients, update, and every module's "
                "parameters and buffers), none non-finite"
            )
            return (f"watch mode: {NOT_WATCHED}", checked + skipped)
        if self.detected == "scale_collapse":
            said = f"watch mode: GradScaler's scale collapsed at step {self.detected_step}"
        elif self.detected == "held_tensors":
            said = f"watch mode: a tensor the run keeps went non-finite before step {self.detected_step}"
        else:
            said = f"watch mode: step {self.detected_step}'s {self.detected.replace('_', ' ')} went non-finite"
        if self.replayed_step is not None and self.exact:
            return (f"{said}; step {self.replayed_step} was replayed exactly under full tracing",)
        if self.replayed_step is not None and self.exact is None:
            return (f"{said}; step {self.replayed_step} was replayed under full tracing",)
        notes: tuple[str, ...] = (f"{said}; it could not be replayed exactly: {self.reason}",)
        if self.traced_from is not None:
            notes += (f"steps from {self.traced_from} on were traced fully instead",)
        return notes

    def report(self, **extra: Any) -> NanTraceReport:
        found = self._found
        base = found if found is not None else NanTraceReport(status="clean", first=None, warnings=(), ops=0, steps=0)
        # A check that failed is a finding even when no replay or later traced step could name its producer: the
        # run had a non-finite loss, gradient or update, and the reason says why it is unnamed. Not a value that
        # arrived through DDP's all-reduce: the rank of its birth reports it (this rank's report stays clean).
        detected = self.detected is not None and self.reason != ARRIVED
        nonfinite = base.first is not None or self.scale_collapse is not None or detected
        report = dataclasses.replace(
            base,
            status="nonfinite" if nonfinite else base.status,
            steps=self.step - 1,
            stopped_early=nonfinite and self._on_found is not None,
            notes=(*base.notes, *self.notes()),
            skipped_steps=tuple(self.skipped),
            scale_collapse=self.scale_collapse,
            watch=self.summary(),
        )
        return dataclasses.replace(report, **extra) if extra else report
