"""What a model holds, independent of where it came from: one entry per distinct parameter and buffer.

The inventory is built from a live (fake or meta) module or from a checkpoint's tensor records, and everything
the estimate needs about model states (weights, gradients, optimizer states) is computed from it alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

    from dtypecheck.loaders.base import TensorRecord

LayerKind = Literal["embedding", "norm", "other"]
"""``embedding`` and ``norm`` are the layers weight quantizers usually leave alone."""

_EMBEDDING_NAME_HINTS = ("embed", "wte", "wpe", "word_embeddings", "position_embeddings", "tok_embeddings")
_NORM_NAME_HINTS = ("norm", "ln_", ".ln", "layernorm", "rmsnorm")


@dataclass(frozen=True)
class TensorEntry:
    """One distinct tensor of the model (a tied weight appears once, under its first name)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    """torch dtype name without ``torch.``."""
    itemsize_bits: int
    trainable: bool
    floating: bool
    layer: LayerKind

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return (self.numel * self.itemsize_bits + 7) // 8


@dataclass(frozen=True)
class Inventory:
    parameters: tuple[TensorEntry, ...]
    buffers: tuple[TensorEntry, ...]
    largest_unit_parameters: int
    """Parameter count of the largest repeated block (or leaf module): what ZeRO-3/FSDP gathers at once."""

    @property
    def parameter_count(self) -> int:
        return sum(p.numel for p in self.parameters)

    @property
    def trainable(self) -> tuple[TensorEntry, ...]:
        return tuple(p for p in self.parameters if p.trainable)

    @property
    def trainable_count(self) -> int:
        return sum(p.numel for p in self.trainable)

    @property
    def buffer_count(self) -> int:
        return sum(b.numel for b in self.buffers)

    @property
    def buffer_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)


def _layer_kind_of_module(module: object) -> LayerKind:
    from torch import nn

    if isinstance(module, nn.Embedding | nn.EmbeddingBag):
        return "embedding"
    norm_types: tuple[type, ...] = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase)
    rms = getattr(nn, "RMSNorm", None)
    if rms is not None:
        norm_types += (rms,)
    if isinstance(module, norm_types) or "norm" in type(module).__name__.lower():
        return "norm"
    return "other"


def layer_kind_of_name(name: str) -> LayerKind:
    """Guess the layer kind from a checkpoint key, where no module type is known."""
    lowered = name.lower()
    if any(hint in lowered for hint in _EMBEDDING_NAME_HINTS):
        return "embedding"
    if any(hint in lowered for hint in _NORM_NAME_HINTS):
        return "norm"
    return "other"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _itemsize_bits(dtype: torch.dtype) -> int:
    from dtypecheck.dtypes import spec_of

    return spec_of(dtype).itemsize_bits


def _unit_parameter_count(module: torch.nn.Module) -> int:
    """Largest element of any ModuleList/Sequential (the usual FSDP wrapping unit), else largest leaf module."""
    from torch import nn

    best = 0
    for sub in module.modules():
        if isinstance(sub, nn.ModuleList | nn.Sequential):
            for child in sub.children():
                best = max(best, sum(p.numel() for p in child.parameters()))
    if best:
        return best
    for sub in module.modules():
        best = max(best, sum(p.numel() for p in sub.parameters(recurse=False)))
    return best


def distinct_parameters(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter, torch.nn.Module]]:
    """Every distinct parameter once, under the name the inventory gives it (a tied one under its first name), with
    the module that holds it."""
    seen: set[int] = set()
    for module_name, sub in module.named_modules(remove_duplicate=False):
        for name, param in sub.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            yield (f"{module_name}.{name}" if module_name else name), param, sub


def inventory_of_module(module: torch.nn.Module) -> Inventory:
    """Every distinct parameter and buffer; tied parameters (one tensor under two names) count once."""
    params: list[TensorEntry] = []
    for full, param, sub in distinct_parameters(module):
        params.append(_entry(full, param, _layer_kind_of_module(sub), trainable=param.requires_grad))
    seen = {id(param) for param in module.parameters()}
    buffers: list[TensorEntry] = []
    for name, buffer in module.named_buffers():
        if id(buffer) in seen:
            continue
        seen.add(id(buffer))
        buffers.append(_entry(name, buffer, "other", trainable=False))
    return Inventory(tuple(params), tuple(buffers), _unit_parameter_count(module))


def _entry(name: str, tensor: torch.Tensor, kind: LayerKind, *, trainable: bool) -> TensorEntry:
    floating = tensor.is_floating_point() or tensor.is_complex()
    return TensorEntry(
        name=name,
        shape=tuple(tensor.shape),
        dtype=_dtype_name(tensor.dtype),
        itemsize_bits=_itemsize_bits(tensor.dtype),
        trainable=trainable and floating,
        floating=floating,
        layer=kind,
    )


_TRAINING_STATE = re.compile(
    r"^(?:"
    r"optim(?:izer)?s?|opt"  # optimizer, optimizers, optim, opt
    r"|(?:lr_)?schedulers?"  # scheduler, lr_scheduler, lr_schedulers
    r"|(?:grad_|amp_)?scaler"  # scaler, grad_scaler
    r")(?:[_-]?(?:state|states|state_dict|state_dicts|sd|dict))?$"
)
"""A key of a training checkpoint that holds the trainer's state, not the model's, in any common spelling:
``optimizer``, ``optimizer_state``, ``optimizer_states``, ``optimizer_state_dict``, ``optim``, ``opt_state``,
``lr_scheduler``, ``scheduler``, ``scaler``..."""


def is_training_state(name: str) -> bool:
    """True for a tensor under a trainer-state key at any level but the last (``ckpt.optimizer_state.state.0``)."""
    return any(_TRAINING_STATE.match(part.lower()) for part in name.split(".")[:-1])


def is_rnn_flat_weight_alias(name: str, names: set[str]) -> bool:
    """``lstm._flat_weights.N`` of an RNN module pickled whole: torch's list of the same parameters the module
    also holds as ``weight_ih_l0``..., counted once (the record says nothing of storage sharing, so the rule goes by
    the module's own names)."""
    parts = name.split(".")
    if "_flat_weights" not in parts[:-1]:
        return False
    prefix = ".".join(parts[: parts.index("_flat_weights")])
    return f"{prefix}.weight_ih_l0".lstrip(".") in names


def inventory_of_records(records: Iterable[TensorRecord]) -> Inventory:
    """A checkpoint's tensors from their headers: every floating tensor is taken for a trainable parameter
    (a state dict does not say which are buffers); integer tensors are counted as buffers. A training
    checkpoint's optimizer and scheduler entries are left out: the estimate computes its own."""
    from dtypecheck.dtypes import lookup

    params: list[TensorEntry] = []
    buffers: list[TensorEntry] = []
    largest = 0
    listed = list(records)
    names = {record.name for record in listed}
    for record in listed:
        if is_training_state(record.name) or is_rnn_flat_weight_alias(record.name, names):
            continue
        spec = lookup(record.dtype)
        floating = spec.is_floating_or_complex
        numel = record.numel
        # The record's own byte count is authoritative (packed and quantized storage included).
        bits = (record.nbytes * 8) // numel if numel else spec.itemsize_bits
        entry = TensorEntry(
            name=record.name,
            shape=tuple(record.shape),
            dtype=spec.name,
            itemsize_bits=bits or spec.itemsize_bits,
            trainable=floating,
            floating=floating,
            layer=layer_kind_of_name(record.name),
        )
        (params if floating else buffers).append(entry)
        largest = max(largest, numel)
    return Inventory(tuple(params), tuple(buffers), largest)
