"""The pieces of a replay: re-running a model call and its backward, and renumbering what the tracer found."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

from dtypecheck.nantrace.ops import tensors_in
from dtypecheck.nantrace.report import Event, NanTraceReport
from dtypecheck.nantrace.training import untraced
from dtypecheck.nantrace.watch.state import ModelCall, finite_values, read_flags

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


def keep_grad(call: ModelCall, position: int, grad: torch.Tensor) -> None:
    held = call.grads.get(position)
    call.grads[position] = grad if held is None else held + grad


def replay_call(call: ModelCall) -> bool:
    """One model call again, and backward from its outputs with the gradients they received the first time.

    True when the outputs came out finite but a gradient sent into them was not: born outside the model."""
    import torch

    with call.autocast.applied():
        output = _inner(call.module)(*call.args, **call.kwargs)
    tensors = list(tensors_in(output))
    with untraced():
        finite_out = read_flags([finite_values(tensors)])
        finite_in = read_flags([finite_values(list(call.grads.values()))])
    if finite_out and not finite_in:
        return True
    roots = [(t, call.grads[i]) for i, t in enumerate(tensors) if i in call.grads and t.grad_fn is not None]
    # An output computed from another output (HF's loss from its logits) already sends the other its gradient.
    roots = [(t, g) for t, g in roots if not any(o is not t and _depends_on(o, t) for o, _ in roots)]
    if roots:
        torch.autograd.backward([t for t, _ in roots], [g for _, g in roots])
    return False


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
