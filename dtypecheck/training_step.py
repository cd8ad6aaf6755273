"""The training step of a ``file.py:factory``, shared by every command that runs one (estimate-memory's trace and
``--measure``, nan-trace's factory mode): how the model is called with its inputs, moving the inputs to a device,
and which loss is taken, with the model's output still referenced until the step ends, as in
``logits = model(x); loss = F.cross_entropy(logits, y)``.

A command runs a step as::

    loss = step_loss(factory.loss_fn, loss_name, factory.file)   # the factory's, the one named, or the default
    inputs = to_device(factory.inputs, device)
    output, value = forward_and_loss(model, inputs, loss, autocast)
    value.backward()

One function, ``forward_and_loss``, is shared by the fake-tensor trace and the real measured step, so both see
exactly the same ops.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtypecheck.choices import StrChoice
from dtypecheck.errors import InputError, ParameterError

if TYPE_CHECKING:
    import torch


class LossName(StrChoice):
    """A loss a step can be told to take of the model's output (``--loss``)."""

    cross_entropy = "cross-entropy"
    mse = "mse"
    sum = "sum"


LossFn = Callable[[Any, Any], "torch.Tensor"]
"""``loss(output, inputs) -> scalar``: ``inputs`` are the example inputs as the factory returned them."""


def as_call(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """How the model is called with ``inputs``: a dict is keyword arguments, a tuple/list positional ones."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, tuple | list):
        return tuple(inputs), {}
    return (inputs,), {}


def to_device(inputs: Any, device: torch.device | str) -> Any:
    """Every tensor of ``inputs`` (nested in tuples, lists and dicts) moved to ``device``; the rest as it is."""
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, inputs)


def primary_output(output: Any) -> torch.Tensor:
    """The tensor a loss is taken of: ``logits`` of a Hugging Face output (or dict), else the first tensor."""
    import torch
    from torch.utils._pytree import tree_flatten

    if isinstance(output, torch.Tensor):
        return output
    logits = output.get("logits") if isinstance(output, dict) else getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    for value in tree_flatten(output)[0]:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    raise InputError(f"the model returned {type(output).__name__} with no floating tensor to take a loss of")


def _differentiable_outputs(output: Any) -> list[torch.Tensor]:
    import torch
    from torch.utils._pytree import tree_flatten

    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    elif isinstance(output, dict):
        output = list(output.values())
    return [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.requires_grad]


def _no_grad_error() -> InputError:
    return InputError("the model's output has no tensor that requires grad, so no backward pass can be traced")


def sum_loss(output: Any, _inputs: Any = None) -> torch.Tensor:
    """The sum of every differentiable floating output."""
    tensors = _differentiable_outputs(output)
    if not tensors:
        raise _no_grad_error()
    total = tensors[0].sum()
    for tensor in tensors[1:]:
        total = total + tensor.sum()
    return total


def model_loss(output: Any, inputs: Any = None) -> torch.Tensor:
    """The model's own ``loss`` when it computed one (a Hugging Face model given ``labels``), else ``sum_loss``."""
    import torch

    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    return sum_loss(output, inputs)


def _class_targets(logits: torch.Tensor, inputs: Any) -> torch.Tensor:
    """The batch's own integer tensor of the targets' shape (a language model's token ids), else zeros."""
    import torch
    from torch.utils._pytree import tree_flatten

    shape = logits.shape[:1] + logits.shape[2:] if logits.dim() >= 4 else logits.shape[:-1]
    for value in tree_flatten(inputs)[0]:
        if isinstance(value, torch.Tensor) and value.dtype == torch.long and value.shape == shape:
            return value
    return torch.zeros(shape, dtype=torch.long, device=logits.device)


def cross_entropy_loss(output: Any, inputs: Any) -> torch.Tensor:
    """``F.cross_entropy`` of the logits: classes on the last dimension (dimension 1 for images, 4-D and up)."""
    import torch.nn.functional as F  # noqa: N812

    logits = primary_output(output)
    targets = _class_targets(logits, inputs)
    if logits.dim() >= 4 or logits.dim() <= 2:
        return F.cross_entropy(logits, targets)
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def mse_loss(output: Any, _inputs: Any) -> torch.Tensor:
    """``F.mse_loss`` of the primary output against a target of its shape (zeros)."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    prediction = primary_output(output)
    return F.mse_loss(prediction, torch.zeros_like(prediction))


NAMED_LOSSES: dict[LossName, LossFn] = {
    LossName.cross_entropy: cross_entropy_loss,
    LossName.mse: mse_loss,
    LossName.sum: sum_loss,
}


def user_loss(loss_fn: Callable[..., Any], user_file: Path) -> LossFn:
    """The factory's ``loss_fn(output, inputs)`` (or ``loss_fn(output)``), its exceptions reported as the user's."""
    from dtypecheck.usercode import call_user

    try:
        parameters = inspect.signature(loss_fn).parameters.values()
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        takes_inputs = len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        takes_inputs = True

    def call(output: Any, inputs: Any) -> torch.Tensor:
        import torch

        loss = call_user(
            lambda: loss_fn(output, inputs) if takes_inputs else loss_fn(output), "loss_fn(output, inputs)", user_file
        )
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise InputError(f"loss_fn returned {type(loss).__name__}; it must return a scalar tensor")
        return loss

    return call


@dataclass(frozen=True)
class StepLoss:
    """Which loss the step takes, and how the report names it."""

    fn: LossFn
    name: str
    """``loss_fn`` (the factory's), ``cross-entropy``, ``mse``, ``sum`` or ``model`` (its own loss, else the sum)."""


DEFAULT_LOSS = StepLoss(model_loss, "model")


def step_loss(loss_fn: Callable[..., Any] | None, loss: LossName | str | None, user_file: Path | None) -> StepLoss:
    """The loss a factory's step takes: its own ``loss_fn``, else the ``loss`` named, else the default."""
    if loss_fn is not None:
        if loss is not None:
            raise ParameterError("the factory returns its own loss_fn; leave out {loss}")
        if user_file is None:
            raise ValueError("a factory's loss_fn needs the factory's file, to report its exceptions")
        return StepLoss(user_loss(loss_fn, user_file), "loss_fn")
    if loss is not None:
        name = LossName(loss)
        return StepLoss(NAMED_LOSSES[name], name.value)
    return DEFAULT_LOSS


def forward_and_loss(
    module: torch.nn.Module, inputs: Any, loss: StepLoss | None, autocast: Any
) -> tuple[Any, torch.Tensor | None]:
    """The forward pass (and, given a loss, the loss) under ``autocast``, as a training loop writes it.

    The caller keeps the output referenced until its step ends: the logits stay alive through backward."""
    args, kwargs = as_call(inputs)
    with autocast:
        output = module(*args, **kwargs)
        value = loss.fn(output, inputs) if loss is not None else None
    if value is not None and not value.requires_grad:
        raise _no_grad_error()
    return output, value
