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

import contextlib
import inspect
from collections.abc import Callable, Iterator
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
    """The tensor a loss is taken of: ``logits`` of a Hugging Face output (or dict), else its language model's, else the
    first tensor."""
    import torch
    from torch.utils._pytree import tree_flatten

    if isinstance(output, torch.Tensor):
        return output
    logits = output.get("logits") if isinstance(output, dict) else getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    # A vision-language model without a head of its own (InstructBLIP's, BLIP-2's) returns its towers' outputs
    # first and its language model's last: the loss is the text's, through every tower.
    name = "language_model_outputs"
    text = output.get(name) if isinstance(output, dict) else getattr(output, name, None)
    if text is not None:
        return primary_output(text)
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


def _batch_ids(inputs: Any, shape: torch.Size) -> torch.Tensor | None:
    """The batch's own int64 tensor of ``shape`` (a language model's token ids), if it has one."""
    import torch
    from torch.utils._pytree import tree_flatten

    for value in tree_flatten(inputs)[0]:
        if isinstance(value, torch.Tensor) and value.dtype == torch.long and value.shape == shape:
            return value
    return None


def _class_targets(logits: torch.Tensor, inputs: Any, shape: torch.Size) -> torch.Tensor:
    """The batch's own integer tensor of the targets' ``shape``, else zeros."""
    import torch

    ids = _batch_ids(inputs, shape)
    return ids if ids is not None else torch.zeros(shape, dtype=torch.long, device=logits.device)


def cross_entropy_loss(output: Any, inputs: Any) -> torch.Tensor:
    """``F.cross_entropy`` of the logits: classes on the last dimension (dimension 1 for images, 4-D and up)."""
    import torch.nn.functional as F  # noqa: N812

    logits = primary_output(output)
    shape = logits.shape[:1] + logits.shape[2:] if logits.dim() >= 4 else logits.shape[:-1]
    targets = _class_targets(logits, inputs, shape)
    if logits.dim() >= 4 or logits.dim() <= 2:
        return F.cross_entropy(logits, targets)
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


_TARGET_WATCHERS: list[Callable[[torch.Tensor], None]] = []


@contextlib.contextmanager
def watching_targets(watch: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Call ``watch(target)`` on every target ``loss_target`` makes inside (the trace counts it from the step's
    start, as the batch that holds it)."""
    _TARGET_WATCHERS.append(watch)
    try:
        yield
    finally:
        _TARGET_WATCHERS.remove(watch)


def loss_target(prediction: torch.Tensor) -> torch.Tensor:
    """The target of a loss that needs one of the prediction's shape (zeros). A training loop loads it with the
    batch: it is alive from before the forward pass to the end of the step, which ``watching_targets`` lets the
    trace count."""
    import torch

    made = torch.zeros_like(prediction)
    for watch in _TARGET_WATCHERS:
        watch(made)
    return made


def mse_loss(output: Any, _inputs: Any) -> torch.Tensor:
    """``F.mse_loss`` of the primary output against a target of its shape (zeros, held as part of the batch)."""
    import torch.nn.functional as F  # noqa: N812

    prediction = primary_output(output)
    return F.mse_loss(prediction, loss_target(prediction))


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
    """``loss_fn`` (the factory's), ``cross-entropy``, ``mse``, ``sum``, or ``model`` (the default before a step
    has run; see ``DefaultLoss``)."""

    @property
    def chosen(self) -> str:
        """The loss the step took: for the default, what ``DefaultLoss`` chose from the output."""
        return (self.fn.chosen or self.name) if isinstance(self.fn, DefaultLoss) else self.name

    @property
    def note(self) -> str | None:
        """What the report says about a loss it assumed (None when the user chose it)."""
        return self.fn.note if isinstance(self.fn, DefaultLoss) else None


DEFAULT_LOSS_NOTES = {
    "cross-entropy": "no loss given: assumed cross-entropy over the last dimension; --loss to change",
    "mse": "no loss given: assumed MSE against a target of the output's shape; --loss to change",
}


def _integer_tensors(inputs: Any) -> bool:
    import torch
    from torch.utils._pytree import tree_flatten

    return any(
        isinstance(v, torch.Tensor) and not (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool)
        for v in tree_flatten(inputs)[0]
    )


def last_dim_cross_entropy(output: Any, inputs: Any) -> torch.Tensor:
    """``F.cross_entropy`` with the classes on the last dimension, against the batch's own integer tensor of the
    targets' shape (a language model's token ids), else zeros."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    logits = primary_output(output)
    ids = _batch_ids(inputs, logits.shape[:-1])
    # The batch's ids as labels, folded into the classes (a head can be narrower than the vocabulary).
    targets = (
        ids.remainder(logits.shape[-1])
        if ids is not None
        else torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    )
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


class DefaultLoss:
    """The loss a step takes when none is given, chosen from the first output it sees:

    1. the model's own ``loss`` when it computed one (a Hugging Face model given ``labels``, or a scalar output);
    2. cross-entropy over the last dimension when the inputs hold integers and the output is float logits over
       a vocabulary or classes (at least 2-D, more than one class): a language model or a text classifier;
    3. otherwise MSE against a target of the output's shape (regression, a ``num_labels=1`` head, images,
       embeddings), the target held as part of the batch for the whole step.

    The same rule for every command that runs a factory's step. One instance per model: it keeps its choice, so
    that the traced and the measured steps take the same loss and the report can name it."""

    def __init__(self) -> None:
        self.chosen: str | None = None

    @property
    def note(self) -> str | None:
        return DEFAULT_LOSS_NOTES.get(self.chosen or "")

    def choose(self, output: Any, inputs: Any) -> str:
        import torch

        own = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if isinstance(own, torch.Tensor) and own.requires_grad:
            return "model"
        logits = primary_output(output)
        if logits.dim() == 0:  # the model returned its loss itself
            return "model"
        # One output per row is a regression head (``num_labels=1``): cross-entropy over one class is zero.
        if _integer_tensors(inputs) and logits.is_floating_point() and logits.dim() >= 2 and logits.shape[-1] > 1:
            return "cross-entropy"
        return "mse"

    def __call__(self, output: Any, inputs: Any) -> torch.Tensor:
        if self.chosen is None:
            self.chosen = self.choose(output, inputs)
        if self.chosen == "model":
            return model_loss(output, inputs)
        if self.chosen == "cross-entropy":
            return last_dim_cross_entropy(output, inputs)
        return mse_loss(output, inputs)


def default_loss() -> StepLoss:
    """A fresh default (``DefaultLoss``): the loss of a step that was given none."""
    return StepLoss(DefaultLoss(), "model")


DEFAULT_LOSS = StepLoss(model_loss, "model")
"""What a subject with no forward pass (a checkpoint) names as its loss."""


def step_loss(loss_fn: Callable[..., Any] | None, loss: LossName | str | None, user_file: Path | None) -> StepLoss:
    """The loss a factory's step takes: its own ``loss_fn``, else the ``loss`` named, else ``default_loss()``.

    nan-trace's factory mode and estimate-memory both call this, then ``forward_and_loss`` with what it returns."""
    if loss_fn is not None:
        if loss is not None:
            raise ParameterError("the factory returns its own loss_fn; leave out {loss}")
        if user_file is None:
            raise ValueError("a factory's loss_fn needs the factory's file, to report its exceptions")
        return StepLoss(user_loss(loss_fn, user_file), "loss_fn")
    if loss is not None:
        name = LossName(loss)
        return StepLoss(NAMED_LOSSES[name], name.value)
    return default_loss()


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
