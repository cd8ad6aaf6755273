"""Watch mode: run at near-plain speed with a few fused checks per step, and trace only the step that failed.

Each step, the loss handed to ``backward()`` and the gradients the optimizer is about to apply are checked with one
on-device reduction per (device, dtype) and one read-back (as ``GradScaler`` checks gradients), and after the update
the parameters and optimizer states it wrote are checked the same way. Nothing else runs per op.

When a check fails, the step is replayed from the state ``state.py`` saved as it began, under the full tracer
(``Tracer``): a loss or gradient gone non-finite re-runs the step's model calls and their backward before the
update (the parameters are still those the step began with), then lets the real update run traced, so that the
report reads as a full trace's (first producer, op, module, line, phase, step, cause, history, consequence). A NaN
born in the update itself is replayed from the optimizer snapshot. A step that cannot be replayed exactly (an
overwritten batch, a value born between the model's output and the loss, a replay that came out finite) is said
so in ``WatchSummary.reason``, and the following steps are traced fully instead.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from dtypecheck.nantrace.ops import tensors_in
from dtypecheck.nantrace.report import NanTraceReport, ScaleCollapse, SkippedStep, WatchSummary
from dtypecheck.nantrace.tracer import StopTracing, TraceOptions, Tracer
from dtypecheck.nantrace.training import _found_inf, _scale_of, untraced
from dtypecheck.nantrace.watch.replay import (
    ARRIVED,
    BORN_OUTSIDE,
    CAME_OUT_FINITE,
    keep_grad,
    post_hooks_apart,
    replay_call,
    shifted,
)
from dtypecheck.nantrace.watch.state import (
    BufferSnapshot,
    ModelCall,
    OptimizerSnapshot,
    RngState,
    all_finite,
    call_of,
    finite_values,
    read_flags,
    same_values,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

Detected = Literal["loss", "gradients", "optimizer_step", "scale_collapse"]


class Watcher:
    """``with Watcher(options) as w:`` watches the block; ``w.report()`` afterwards.

    ``on_found`` is called (from inside the hook that found it) once the report is complete: the CLI raises
    ``StopTracing`` there to end the script, a framework callback asks its trainer to stop. Without it the block
    runs on unchecked after the first finding, as ``dtypecheck.trace()`` does.
    """

    def __init__(
        self,
        options: TraceOptions | None = None,
        *,
        model: nn.Module | None = None,
        optimizer_snapshot: bool = True,
        on_found: Callable[[], None] | None = None,
    ) -> None:
        self.options = options or TraceOptions()
        self.optimizer_snapshot = optimizer_snapshot
        self._model = model
        self._on_found = on_found
        self.step = 1
        """The step running now (1-based, as the tracer counts)."""
        self.optimizer_seen = False
        self._busy = False
        """Replaying: the watch's own hooks stand aside."""
        self.done = False
        """Found (or handed over to full tracing): no more cheap checks."""
        self._interrupted = False
        self._depth = 0
        self._learning = True
        self._roots: list[nn.Module] = []
        self._calls: list[ModelCall] = []
        self._call_open: ModelCall | None = None
        self._rng: RngState | None = None
        self._buffers = BufferSnapshot()
        self._optimizers = OptimizerSnapshot(copies=optimizer_snapshot)
        self._snapshotted: set[int] = set()
        self._loss_flags: list[torch.Tensor | None] = []
        self._tracer: Tracer | None = None
        self._offset = 0
        self._fallback: Tracer | None = None
        self._fallback_pending = False
        self._backward_open = False
        """``backward()`` returned and no optimizer has been seen: the step may end there."""
        self._update_done = False
        """The replayed step's update ran (traced): its tracer is left at the next landmark."""
        self._found: NanTraceReport | None = None
        self.detected: Detected | None = None
        self.detected_step: int | None = None
        self.replayed_step: int | None = None
        self.exact: bool | None = None
        self.reason: str | None = None
        self.traced_from: int | None = None
        self.snapshot_bytes = 0
        self.skipped: list[SkippedStep] = []
        self._streak: list[SkippedStep] = []
        self.scale_collapse: ScaleCollapse | None = None
        self._handles: list[Any] = []
        self._module_handles: list[Any] = []
        self._restore: list[tuple[Any, str, Any]] = []

    # -- installing --------------------------------------------------------------------------------------------
    def __enter__(self) -> Watcher:
        import torch
        import torch.optim.optimizer as optimizer_module
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        # Until the first step ends every module is seen, to learn which are called outermost; then only those.
        self._module_handles = [
            register_module_forward_pre_hook(self._global_enter),
            register_module_forward_hook(self._exit, always_call=True),
        ]
        self._patch(torch.autograd, "backward", self._wrap_backward)
        self._patch(torch.optim.Optimizer, "__init__", self._wrap_optimizer_init)
        self._handles.append(optimizer_module.register_optimizer_step_pre_hook(self._before_update))
        self._handles.append(optimizer_module.register_optimizer_step_post_hook(self._after_update))
        scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler_class is not None:
            self._patch(scaler_class, "update", self._wrap_scaler_update)
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if not self._busy and not exc_info[0]:
                self.poll()
            if self._tracer is not None:  # the block ended inside (or just after) a replayed step
                self._end_replay()
            if self._fallback is not None:
                self._end_fallback()
        finally:
            self._remove()

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        self._restore.append((owner, name, original))
        setattr(owner, name, make(original))

    def _remove(self) -> None:
        for handle in (*self._handles, *self._module_handles):
            handle.remove()
        self._handles.clear()
        self._module_handles.clear()
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    def _stop_learning(self) -> None:
        for handle in self._module_handles:
            handle.remove()
        self._module_handles = []
        for root in self._roots:
            self._module_handles.append(root.register_forward_pre_hook(self._root_enter, with_kwargs=True))
            self._module_handles.append(root.register_forward_hook(self._exit, always_call=True))
        self._learning = False

    def interrupt(self) -> None:
        """Another rank failed (the distributed session's thread): end the watched code at its next landmark."""
        self._interrupted = True
        if self._fallback is not None:
            self._fallback.interrupt()

    def _landmark(self) -> bool:
        """Every hook but the optimizer's post hook starts here: whether the watch should look at all.

        Tracers are entered and left only here: one registers an optimizer post hook, and torch iterates those
        hooks as a live dict view, so adding or removing one from inside a post hook would break the loop."""
        if self._busy:
            return False
        if self._interrupted:
            self._interrupted = False
            raise StopTracing
        self.poll()
        return not self.done

    def poll(self) -> None:
        """Finish what a step left open (a replayed step's tracer, the start or end of full tracing). Framework
        callbacks call it at a step's end, outside the optimizer's hooks, so that the report is complete then."""
        if self._busy:
            return
        if self._backward_open and not self.optimizer_seen and not self.done:
            self._backward_ended()
        if self._tracer is not None and self._update_done:
            self._end_replay()
        if self._fallback_pending:
            self._fallback_pending = False
            self._start_fallback()
        if self._fallback is not None and self._fallback.stopped:
            self._end_fallback()

    # -- the model's calls -------------------------------------------------------------------------------------
    def _global_enter(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        # Global hooks are not given keyword arguments: they are the calling frame's (Module._call_impl's).
        frame = sys._getframe(1)
        kwargs = frame.f_locals.get("kwargs") if frame.f_code.co_name == "_call_impl" else None
        self._enter(module, args, kwargs if isinstance(kwargs, dict) else {})

    def _root_enter(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._enter(module, args, kwargs)

    def _enter(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import torch

        if self._busy:
            return
        self._depth += 1
        if self._depth != 1 or not self._landmark() or not torch.is_grad_enabled():
            return
        if self._learning and not any(module is r for r in self._roots):
            self._roots.append(module)
        if not self._calls:
            self._rng = RngState.take()
            self._buffers.clear()
            self._snapshotted.clear()
        if id(module) not in self._snapshotted:
            self._snapshotted.add(id(module))
            self._buffers.take(module)
        self._call_open = call_of(module, args, kwargs)
        self._calls.append(self._call_open)

    def _exit(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._busy:
            return
        self._depth = max(self._depth - 1, 0)
        if self._depth:
            return
        call, self._call_open = self._call_open, None
        if call is None or call.module is not module:
            return
        for position, tensor in enumerate(tensors_in(output)):
            if tensor.requires_grad and tensor.grad_fn is not None:
                tensor.register_hook(functools.partial(keep_grad, call, position))  # type: ignore[no-untyped-call]

    # -- backward and the update -------------------------------------------------------------------------------
    def _wrap_backward(self, original: Any) -> Any:
        watch = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            looking = watch._landmark()
            if looking:
                watch._loss_flags.append(finite_values(list(tensors_in(tensors))))
            result = original(tensors, *args, **kwargs)
            if looking and not watch.optimizer_seen:
                # The step ends here unless an optimizer built before watching began steps next: decided at the
                # next landmark, when the gradients and the unchanged parameters are still there.
                watch._backward_open = True
            return result

        return backward

    def _wrap_optimizer_init(self, original: Any) -> Any:
        watch = self

        def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            watch.optimizer_seen = True
            original(optimizer, *args, **kwargs)

        return init

    def _backward_ended(self) -> None:
        """Code with no ``torch.optim`` optimizer: a step ends when ``backward()`` returns."""
        self._backward_open = False
        grads = [p.grad for root in self._roots for p in root.parameters() if p.grad is not None]
        if not read_flags([*self._loss_flags, all_finite(grads)]):
            self._detect("loss" if not read_flags(self._loss_flags) else "gradients")
            self._replay_calls()
            if self._tracer is not None:
                self._end_replay()
        self._step_ended()

    def _before_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._busy:
            return
        self.optimizer_seen = True
        self._backward_open = False
        if not self._landmark():
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if read_flags([*self._loss_flags, all_finite(grads)]):
            if self.optimizer_snapshot:
                self._optimizers.take(optimizer)
            self._measure()
            return
        self._detect("loss" if not read_flags(self._loss_flags) else "gradients")
        self._replay_calls()  # leaves the tracer on: the real update runs traced

    def _after_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._busy:
            return
        if self._tracer is not None:
            self._update_done = True  # the tracer's own post hook judges the update after this one
        elif not self.done and self._fallback is None and not self._fallback_pending:
            written = self._optimizers.written(optimizer)
            if not read_flags([all_finite(written)]):
                # Inside ``step(closure)`` (Lightning) the loss and gradients come after the check before the
                # update: what went non-finite first is told here.
                parameters = [p for group in optimizer.param_groups for p in group["params"]]
                grads = [p.grad for p in parameters if p.grad is not None]
                self._detect(
                    "loss"
                    if not read_flags(self._loss_flags)
                    else ("gradients" if not read_flags([all_finite(grads)]) else "optimizer_step")
                )
                self._replay_update(optimizer, args, kwargs)
        self._step_ended()
        if self._tracer is not None and not self._update_done:
            self._end_replay(entered=False)  # the update's own replay, already left inside ``post_hooks_apart``

    def _wrap_scaler_update(self, original: Any) -> Any:
        watch = self

        def update(scaler: Any, new_scale: Any = None) -> None:
            if not getattr(scaler, "_enabled", False) or not watch._landmark():
                return original(scaler, new_scale)  # type: ignore[no-any-return]
            before, found = _scale_of(scaler), _found_inf(scaler)
            original(scaler, new_scale)
            after = _scale_of(scaler)
            if before is None or after is None or not (found if found is not None else after < before):
                watch._streak.clear()
                return None
            # A skipped step is GradScaler doing its job: a note. Only a collapsing scale is replayed.
            note = SkippedStep(watch.step, before, after, None, rank=watch.options.rank)
            watch.skipped.append(note)
            watch._streak.append(note)
            try:
                if len(watch._streak) >= watch.options.max_skipped_steps:
                    watch._collapsed()
            finally:
                watch._step_ended()  # also when the finding ends the run from here: the skipped step is complete
            return None

        return update

    def _collapsed(self) -> None:
        self.scale_collapse = ScaleCollapse.of_streak(
            self._streak, limit=self.options.max_skipped_steps, rank=self.options.rank
        )
        self._detect("scale_collapse")
        self._replay_calls()
        if self._tracer is not None:
            self._end_replay(consequence="scale_collapse")
        if self._found is None:
            self._finish(None)  # the collapse is the finding, with or without its producer

    # -- steps -------------------------------------------------------------------------------------------------
    def _step_ended(self) -> None:
        if self._learning and self._roots:
            self._stop_learning()
        self._buffers.step_ended()
        self._calls = []
        self._call_open = None
        self._loss_flags = []
        self._rng = None
        self.step += 1

    def _measure(self) -> None:
        held = self._buffers.nbytes + (self._rng.nbytes if self._rng is not None else 0)
        held += sum(g.nbytes for call in self._calls for g in call.grads.values())
        held += self._optimizers.nbytes
        self.snapshot_bytes = max(self.snapshot_bytes, held)

    def _detect(self, what: Detected) -> None:
        self.detected, self.detected_step = what, self.step
        self._measure()

    # -- replays -----------------------------------------------------------------------------------------------
    def _new_tracer(self) -> Tracer:
        model = self._model if self._model is not None else (self._roots[0] if self._roots else None)
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
        buffers_exact = self._buffers.put_back()
        try:
            self._rng.put_back()
            for parameter in parameters:
                parameter.grad = None
            with torch.enable_grad():
                tracer.__enter__()
                try:
                    outside = [replay_call(call) for call in self._calls]
                except BaseException:
                    tracer.__exit__(None, None, None)
                    raise
        finally:
            now.put_back()
            self._busy = False
        self._tracer = tracer
        self.replayed_step = self.step
        with untraced():  # the tracer is on: dtypecheck's own bookkeeping is not the step's
            failed_replay = self._judge_replay(parameters, original, buffers_exact, outside, tracer)
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
        if not same and not distributed:
            for parameter, old in zip(parameters, original, strict=True):
                parameter.grad = old  # the run goes on with the gradients it computed itself
        replayed = [p.grad for p in parameters if p.grad is not None]
        if any(outside):
            failed_replay = BORN_OUTSIDE
        elif read_flags([finite_values(replayed)]) and not tracer.judge.events:
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
        written += [v for p in written for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
        result = [t.detach().clone() for t in written]
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
        finally:
            now.put_back()
            self._busy = False
        self.replayed_step = self.step
        again = [p for group in optimizer.param_groups for p in group["params"]]
        again += [v for p in again for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
        self.exact = len(again) == len(result) and all(same_values(a, b) for a, b in zip(again, result, strict=True))
        if not self.exact:
            self.reason = "the replayed update wrote different values (a non-deterministic optimizer)"
        self._tracer = tracer

    def _end_replay(self, *, entered: bool = True, consequence: str | None = None) -> None:
        tracer, self._tracer = self._tracer, None
        self._update_done = False
        assert tracer is not None
        if entered:
            tracer.__exit__(None, None, None)
        report = tracer.report()
        if report.first is None:
            self.exact = False
            self._give_up(CAME_OUT_FINITE, replayed=True)
            return
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
        report = tracer.report()
        self._finish(shifted(report, self._offset) if report.first is not None else None, traced=report)

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
        )

    def notes(self) -> tuple[str, ...]:
        if self.detected is None:
            skipped = f"; GradScaler skipped {len(self.skipped)} (notes)" if self.skipped else ""
            checked = f"watch mode: {self.step - 1} step(s) checked (loss, gradients, update), none non-finite"
            return (checked + skipped,)
        if self.detected == "scale_collapse":
            said = f"watch mode: GradScaler's scale collapsed at step {self.detected_step}"
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
        nonfinite = base.first is not None or self.scale_collapse is not None
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
