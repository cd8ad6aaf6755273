"""The training loop's landmarks, watched while tracing: ``backward()`` (the loss), the optimizer step (parameters,
optimizer states, the end of a step) and ``GradScaler`` (skipped steps, a collapsing scale).

Steps are numbered from 1: step n is the n-th training iteration and ends with its optimizer step
(``optimizer.step()``, or the step a ``GradScaler`` skips), so everything from the end of step n-1 up to and
including step n's optimizer step (zero_grad, loading the batch, forward, backward) is step n: what a loop
printing ``enumerate(loader, start=1)`` shows (``step == n - 1`` in a loop counting from 0). Code that never builds
a ``torch.optim`` optimizer ends a step when ``backward()`` returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from dtypecheck.nantrace.ops import iter_tensors

if TYPE_CHECKING:
    from dtypecheck.nantrace.hooks import TracerHooks


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Run dtypecheck's own ops from a hook without tracing them (the dispatch mode is off inside it)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def scale_of(scaler: Any) -> float | None:
    """The scaler's current scale (None before its first ``scale()``)."""
    scale = getattr(scaler, "_scale", None)
    return None if scale is None else float(scale.item())


def scaler_found_inf(scaler: Any) -> bool | None:
    """Whether the scaler's last ``unscale_``/``step`` found inf/NaN gradients (None when it did not look)."""
    states = getattr(scaler, "_per_optimizer_states", None) or {}
    found = [v for state in states.values() for v in (state.get("found_inf_per_device") or {}).values()]
    if not found:
        return None
    return any(float(v.item()) > 0 for v in found)


class TrainingWatch:
    """Wraps ``torch.autograd.backward``, ``Optimizer.__init__``, ``GradScaler.scale``/``update`` and registers a
    global optimizer step hook for the duration of the trace; ``remove()`` puts everything back."""

    def __init__(self, tracer: TracerHooks) -> None:
        self.tracer = tracer
        self.scaler_active = False
        """A GradScaler scaled a loss: a non-finite loss may be a step it is about to skip."""
        self.optimizer_seen = False
        self.optimizer_steps = 0
        self.backward_passes = 0
        self._backward_ended = False
        self.backward_from_loss = True
        """``backward()`` is called on the loss: what it is called on reached the loss. False for watch mode's
        replay of a step whose loss stayed finite, which runs backward from the model's outputs instead."""
        self._restore: list[tuple[Any, str, Any]] = []
        self._handles: list[Any] = []

    # -- installing --------------------------------------------------------------------------------------------
    def _patch(self, owner: Any, name: str, make: Any) -> None:
        original = getattr(owner, name)
        self._restore.append((owner, name, original))
        setattr(owner, name, make(original))

    def install(self) -> None:
        import torch
        import torch.optim.optimizer as optimizer_module

        watch = self

        def wrap_backward(original: Any) -> Any:
            def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
                watch.before_backward(tensors)
                result = original(tensors, *args, **kwargs)
                watch.after_backward()
                return result

            return backward

        def wrap_optimizer_init(original: Any) -> Any:
            def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
                watch.optimizer_seen = True
                original(optimizer, *args, **kwargs)

            return init

        self._patch(torch.autograd, "backward", wrap_backward)
        self._patch(torch.optim.Optimizer, "__init__", wrap_optimizer_init)
        self._handles.append(optimizer_module.register_optimizer_step_post_hook(self.after_optimizer_step))
        scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler_class is not None:
            self._patch_scaler(scaler_class)

    def _patch_scaler(self, scaler_class: type) -> None:
        watch = self

        def wrap_scale(original: Any) -> Any:
            def scale(scaler: Any, outputs: Any) -> Any:
                if getattr(scaler, "_enabled", False):
                    watch.scaler_active = watch.tracer.judge.scaled_backward = True
                return original(scaler, outputs)

            return scale

        def wrap_update(original: Any) -> Any:
            def update(scaler: Any, new_scale: Any = None) -> None:
                if not getattr(scaler, "_enabled", False):
                    return original(scaler, new_scale)  # type: ignore[no-any-return]
                with untraced():
                    before, found = scale_of(scaler), scaler_found_inf(scaler)
                original(scaler, new_scale)
                with untraced():
                    after = scale_of(scaler)
                if before is not None and after is not None:
                    skipped = found if found is not None else after < before
                    watch.tracer.scaler_updated(skipped, before, after)
                return None

            return update

        self._patch(scaler_class, "scale", wrap_scale)
        self._patch(scaler_class, "update", wrap_update)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    # -- landmarks ---------------------------------------------------------------------------------------------
    def before_backward(self, tensors: Any) -> None:
        tracer = self.tracer
        if not tracer.stopped:
            with untraced() if tracer.landmark_runs_ops() else contextlib.nullcontext():
                tracer.flush()
                for loss in iter_tensors(tensors) if self.backward_from_loss else ():
                    tracer.judge.reached_loss(loss, defer=self.scaler_active)
            tracer.stop_if_failed()
        self.backward_passes += 1
        self._backward_ended = False

    def after_backward(self) -> None:
        if not self.optimizer_seen:
            self._backward_ended = True
            self.tracer.step_ended()

    def after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        import torch

        tracer = self.tracer
        # An optimizer built before tracing began is seen at its first step: a backward may have closed it.
        closed = not self.optimizer_seen and self._backward_ended
        self.optimizer_seen = True
        if not tracer.stopped:
            judge = tracer.judge
            with untraced() if tracer.landmark_runs_ops() else contextlib.nullcontext():
                tracer.flush()
                # Nothing non-finite is being followed (a clean run): no parameter or state can hold a producer's
                # value, and asking each of them was a tenth of a small model's traced step.
                groups = optimizer.param_groups if judge.taint.storages else ()
                for group in groups:
                    for parameter in group["params"]:
                        judge.reached(parameter, "parameter")
                        for value in optimizer.state.get(parameter, {}).values():
                            if isinstance(value, torch.Tensor) and value.is_floating_point():
                                judge.reached(value, "optimizer_state")
                judge.settle(final=False)
        self.step_ended(already=closed)
        tracer.stop_if_failed()

    def step_ended(self, *, already: bool = False) -> None:
        self.optimizer_steps += 1
        if not already:
            self.tracer.step_ended()

    @property
    def steps(self) -> int:
        """Steps completed (the module docstring's rule)."""
        return self.optimizer_steps if self.optimizer_seen else self.backward_passes
