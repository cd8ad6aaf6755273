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

This module watches; the replays and the report are ``replay.StepReplay``, the half of ``Watcher`` it inherits.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dtypecheck.nantrace import native
from dtypecheck.nantrace.frames import FrameFinder
from dtypecheck.nantrace.ops import tensor_list
from dtypecheck.nantrace.report import NanTraceReport, ScaleCollapse, SkippedStep
from dtypecheck.nantrace.tracer import StopTracing, TraceOptions, Tracer
from dtypecheck.nantrace.training import scale_of, scaler_found_inf, untraced
from dtypecheck.nantrace.watch.held import HeldModules
from dtypecheck.nantrace.watch.replay import Detected, StepReplay, keep_grad
from dtypecheck.nantrace.watch.state import (
    BufferSnapshot,
    Flag,
    ModelCall,
    OptimizerSnapshot,
    RngState,
    all_finite,
    call_of,
    read_flags,
)
from dtypecheck.nantrace.watch.workers import WorkerReplay

if TYPE_CHECKING:
    from torch import nn


def _no_node() -> None:
    return None


def _compiled_autograd() -> bool:
    """Compiled autograd is on (``torch._dynamo``'s): it asks every hook to compile itself, which only the Python
    hooks do (the C++ one then sits the compiled backward out, and a replay finds no gradient to send). Its runtime
    flag, a module global: ``torch._dynamo.config``'s own reads cost four Python calls a step."""
    compiled = sys.modules.get("torch._dynamo.compiled_autograd")
    return compiled is not None and bool(getattr(compiled, "compiled_autograd_enabled", False))


class Watcher(StepReplay):
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
        self._loss_flags: list[Flag] = []
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
        self.arguments_nonfinite = False
        """The replayed step's model calls were handed a non-finite tensor: born before them, in the data."""
        self.reason: str | None = None
        self.traced_from: int | None = None
        self.snapshot_bytes = 0
        self.skipped: list[SkippedStep] = []
        self._streak: list[SkippedStep] = []
        self.scale_collapse: ScaleCollapse | None = None
        self._held = HeldModules()
        self._updated: dict[int, frozenset[int]] = {}
        """By optimizer: the ``id`` of every parameter it updates (checked after its update, not as held)."""
        self._skip: frozenset[int] = frozenset()
        """All of them: one set, rebuilt only when an optimizer is first seen."""
        self.held_nonfinite: tuple[str, ...] = ()
        self._handles: list[Any] = []
        self._module_handles: list[Any] = []
        self._restore: list[tuple[Any, str, Any]] = []
        self._frames: FrameFinder
        self._grad_enabled: Callable[[], bool]
        self._current_node: Callable[[], object]
        self._keep: Callable[[Any], Any] | None
        """The C++ gradient keeper (``native.keep_grad``), or None: the Python pre-hook ``keep_grad``."""
        quiet = dataclasses.replace(self.options, stop_run=False, keep_going=False)
        self._workers = WorkerReplay(lambda: Tracer(quiet))

    # -- installing --------------------------------------------------------------------------------------------
    def __enter__(self) -> Watcher:
        import torch
        import torch.optim.optimizer as optimizer_module
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._frames = FrameFinder()
        self._grad_enabled = torch.is_grad_enabled
        self._current_node = getattr(torch._C, "_current_autograd_node", _no_node)
        self._keep = getattr(native.load(), "keep_grad", None)
        # Until the first step ends every module is seen, to learn which are called outermost; then only those.
        self._module_handles = [
            register_module_forward_pre_hook(self._global_enter),
            register_module_forward_hook(self._exit, always_call=True),
        ]
        self._handles.extend(self._buffers.install(self._patch))
        self._patch(torch.autograd, "backward", self._wrap_backward)
        self._held.install(self._patch, self._model)
        self._workers.install()
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
                if not self.done:
                    self._check_held()
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
        self._workers.remove()
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
            self._module_handles.append(root.register_forward_pre_hook(self._enter, with_kwargs=True))
            self._module_handles.append(root.register_forward_hook(self._exit, always_call=True))
        self._learning = False

    def interrupt(self) -> None:
        """Another rank failed (the distributed session's thread): end the watched code at its next landmark."""
        self._interrupted = True
        if self._fallback is not None:
            self._fallback.interrupt()

    def _landmark(self, *, judging: bool = False) -> bool:
        """Every hook but the optimizer's post hook starts here: whether the watch should look at all.

        Tracers are entered and left only here: one registers an optimizer post hook, and torch iterates those
        hooks as a live dict view, so adding or removing one from inside a post hook would break the loop.

        Another rank's failure ends the watched code here, but not before the step that already ran is judged
        (``judging``: the check before an update; a backward-only step is judged first here): its values may
        have arrived non-finite from that rank, and this rank's report says so, however late it got here."""
        if self._busy:
            return False
        if self._interrupted and not judging:
            if self._backward_open and not self.optimizer_seen and not self.done:
                self._backward_ended()
            self._interrupted = False
            raise StopTracing
        if self._backward_open or self._tracer is not None or self._fallback_pending or self._fallback is not None:
            self.poll()  # (each step calls here three times: the call to ``poll`` only where it has work)
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

    def _enter(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._busy:
            return
        self._depth += 1
        if self._depth != 1 or not self._landmark() or not self._grad_enabled() or self._current_node() is not None:
            # (a module called while backward runs: activation checkpointing recomputing a forward, not a call)
            return
        if self._learning and not any(module is r for r in self._roots):
            self._roots.append(module)
            self._held.add(module)
        if not self._calls:
            if self._check_held():
                return
            self._rng = RngState.take()
            self._buffers.clear()
            self._snapshotted.clear()
        if id(module) not in self._snapshotted:
            self._snapshotted.add(id(module))
            self._buffers.take(module)
        self._call_open = call_of(module, args, kwargs, self._frames.user_frame())
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
        keep = self._keep if not _compiled_autograd() else None
        for position, tensor in enumerate(tensor_list(output)):
            if not tensor.requires_grad:
                continue
            if keep is not None:
                holder = keep(tensor)
                if holder is not None:
                    call.kept[position] = holder
                continue
            node = tensor.grad_fn
            if node is not None:
                node.register_prehook(functools.partial(keep_grad, call, position, tensor.output_nr))

    # -- backward and the update -------------------------------------------------------------------------------
    def _wrap_backward(self, original: Any) -> Any:
        watch = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            looking = watch._landmark()
            if looking:
                watch._loss_flags.append(all_finite(tensor_list(tensors)))
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
        if not self._landmark(judging=True):  # an interrupt ends the run at the next landmark, after this check
            return
        if id(optimizer) not in self._updated:
            self._updated[id(optimizer)] = frozenset(id(p) for g in optimizer.param_groups for p in g["params"])
            self._skip = frozenset().union(*self._updated.values())
        layout = self._optimizers.layout(optimizer)
        if read_flags([*self._loss_flags, self._optimizers.grads_finite(optimizer, layout)]):
            if self.optimizer_snapshot:
                self._optimizers.take(optimizer, layout)
            self._measure()
            return
        self._detect("loss" if not read_flags(self._loss_flags) else "gradients")
        self._replay_calls()  # leaves the tracer on: the real update runs traced

    def _after_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._busy:
            return
        if self._tracer is not None:
            self._update_done = True  # the tracer's own post hook judges the update after this one
        elif (
            not self.done
            and self._fallback is None
            and not self._fallback_pending
            and not read_flags([self._optimizers.written_finite(optimizer)])
        ):
            # Inside ``step(closure)`` (Lightning) the loss and gradients come after the check before the update:
            # what went non-finite first is told here.
            self._detect(
                "loss"
                if not read_flags(self._loss_flags)
                else ("gradients" if not read_flags([self._optimizers.grads_finite(optimizer)]) else "optimizer_step")
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
            before, found = scale_of(scaler), scaler_found_inf(scaler)
            original(scaler, new_scale)
            after = scale_of(scaler)
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
        tracer = self._tracer
        if tracer is not None:
            # As a full trace's GradScaler skip does: every open producer of the step is the skipped step's, and
            # the collapse fails the first of them (GELU's cube, whose inf tanh then masks), not the first value
            # left unmasked once the replay ends (the cube's gradient in backward).
            with untraced():
                tracer.flush()
                first = tracer.judge.skip_step()
                if first is not None:
                    tracer.judge.fail(tracer.judge.producer_index(first), "scale_collapse")
            self._end_replay(consequence="scale_collapse")
        if self._found is None:
            self._finish(None)  # the collapse is the finding, with or without its producer

    # -- what the run keeps ------------------------------------------------------------------------------------
    def _check_held(self) -> bool:
        """As a step begins (and when the block ends): every module's parameters and buffers that no optimizer
        updates are still finite. What went non-finite between two steps (an EMA update, outside the model calls,
        the loss and the update) cannot be replayed; it is reported, and the following steps are traced fully."""
        skip = self._skip
        flag = self._held.flag(skip)
        if flag is None or flag is True or read_flags([flag]):
            return False
        self.held_nonfinite = tuple(self._held.nonfinite_names(skip))
        self._detect("held_tensors")
        last = f"step {self.step - 1}'s update" if self.step > 1 else "watching began"
        self._give_up(
            f"{', '.join(self.held_nonfinite) or 'a held tensor'} went non-finite between {last} and step "
            f"{self.step}'s first model call: outside the model calls, the loss and the update, which are all "
            "watch mode can replay (run without --watch to name the op)"
        )
        return True

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
        held = self._buffers.nbytes + self._optimizers.nbytes + (self._rng.nbytes if self._rng is not None else 0)
        for call in self._calls:
            held += call.grads_nbytes
        self.snapshot_bytes = max(self.snapshot_bytes, held)

    def _detect(self, what: Detected) -> None:
        self.detected, self.detected_step = what, self.step
        self._measure()
