"""What dtypecheck needs to know about each aten op, worked out once per overload from its schema."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch._ops import OpOverload


class OpKind(Enum):
    CHECK = "check"
    """Computes new values: its floating outputs are checked."""
    PASS = "pass"
    """Aliases, copies, selects or masks its input (views, clone, relu, dropout's mask, relu's backward): it can
    neither create a non-finite value nor raise a magnitude, so it is not checked; it may still create an
    autograd node whose backward ops need its line."""
    UNINITIALISED = "uninitialised"
    """Returns memory nobody has written yet (``empty*``): whatever it holds is not a finding."""
    SCALAR = "scalar"
    """Returns a Python number (``item``): nothing to check."""


# Ops whose output is uninitialised memory; garbage NaNs there are nobody's bug until someone reads them.
_UNINITIALISED = frozenset(
    {
        "empty",
        "empty_like",
        "new_empty",
        "empty_strided",
        "new_empty_strided",
        "empty_permuted",
        "resize_",
        "resize_as_",
        "set_",
        "_empty_affine_quantized",
        "_resize_output_",
    }
)
# In-place ops that overwrite their target without reading it: the target's old values are not an input.
_OVERWRITE = frozenset(
    {
        "copy_",
        "fill_",
        "zero_",
        "normal_",
        "uniform_",
        "random_",
        "bernoulli_",
        "exponential_",
        "geometric_",
        "log_normal_",
        "cauchy_",
        "_foreach_zero_",
        "_foreach_copy_",
        "detach_",
    }
)
_ALIASING = frozenset({"detach", "alias", "lift", "_unsafe_view", "view", "_reshape_alias"})
# Not checking these saves about a quarter of the reduction work of a transformer step (measured with
# benchmarks/bench_nantrace.py); a NaN they pass on is caught by the next checked op that reads it.
_PASS_THROUGH = frozenset(
    {
        "clone",
        "contiguous",
        "relu",
        "threshold_backward",
        "select_backward",
        "slice_backward",
        "bernoulli_",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "zero_",
    }
)
_COMMUNICATION = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_dtensor", "fsdp"})
_SCALAR = frozenset({"_local_scalar_dense", "item", "equal", "is_nonzero", "sym_size", "sym_numel", "sym_stride"})


@dataclass(frozen=True)
class OpInfo:
    name: str
    """``aten.add_.Tensor``: the overload's qualified name."""
    kind: OpKind
    read_mutated: tuple[int | str, ...]
    """Positions (or keyword names) of arguments the op both reads and writes: checked before it runs."""
    written: tuple[int | str, ...] = ()
    """Every argument the op writes; checked after it runs when it returns nothing (``_foreach_add_``)."""
    creates: bool = False
    """Makes a tensor whose dtype does not come from a tensor input: factories (``zeros``, ``randn``,
    ``*_like``, ``new_*``), ``lift_fresh`` (``torch.tensor``, ``from_numpy``) and casts (``_to_copy``). Where a
    tensor of an unusual dtype was made is remembered at these ops."""


_CASTS = frozenset({"lift_fresh", "lift_fresh_copy", "_to_copy", "to", "_to_dtype"})


def _creates(base: str, schema: Any) -> bool:
    if base in _CASTS or base.endswith("_like") or base.startswith("new_"):
        return True
    return not any(str(argument.type).startswith("Tensor") for argument in schema.arguments)


def classify(func: OpOverload) -> OpInfo:
    schema = func._schema
    base = schema.name.split("::")[-1]
    name = f"{func.namespace}.{base}.{func._overloadname}"
    creates = _creates(base, schema)
    if base in _UNINITIALISED:
        return OpInfo(name, OpKind.UNINITIALISED, (), creates=creates)
    if base in _SCALAR:
        return OpInfo(name, OpKind.SCALAR, ())
    if func.namespace in _COMMUNICATION:
        # Their outputs are written asynchronously (or are buffers still to be filled): checking them at the call
        # reads garbage. What arrives through them is found where it is first read (distributed.py).
        return OpInfo(name, OpKind.PASS, (), creates=creates)
    # lift_fresh turns a Python constant (torch.tensor([...]), x[i] = value) into a tensor: a NaN the user
    # wrote is found there, at their line.
    if (func.is_view or base in _ALIASING or base in _PASS_THROUGH) and base != "lift_fresh":
        return OpInfo(name, OpKind.PASS, (), creates=creates)
    read_mutated: list[int | str] = []
    written: list[int | str] = []
    for position, argument in enumerate(schema.arguments):
        alias = argument.alias_info
        if alias is None or not alias.is_write:
            continue
        where = argument.name if argument.kwarg_only else position
        written.append(where)
        if base not in _OVERWRITE and not argument.is_out:
            read_mutated.append(where)
    return OpInfo(name, OpKind.CHECK, tuple(read_mutated), tuple(written), creates=creates)


def mutated_argument(args: tuple[Any, ...], kwargs: dict[str, Any], where: int | str) -> Any:
    if isinstance(where, str):
        return kwargs.get(where)
    return args[where] if where < len(args) else None


def iter_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Tensors in an argument or a result: directly, or one level down in a list or tuple (cat, foreach)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            if isinstance(item, torch.Tensor):
                yield item


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor of a nested value: a model's output (tuples, lists, mappings such as ``ModelOutput``) or a
    batch (as ``default_collate`` builds it)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from tensors_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from tensors_in(item)


def tensor_list(value: Any) -> list[torch.Tensor]:
    """``list(tensors_in(value))``, without a generator a level for the common shapes (a tensor; a tuple or list of
    tensors): watch mode asks it for each step's model call, output and loss."""
    import torch  # (``from torch import Tensor`` is a Python call each time: importlib's ``_handle_fromlist``)

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        found = []
        for item in value:
            if not isinstance(item, torch.Tensor):
                return list(tensors_in(value))
            found.append(item)
        return found
    return list(tensors_in(value))


def has_nonfinite_scalar(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A Python ``inf``/``nan`` written into the call: the user's own constant."""
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, list | tuple) else (value,)
        for item in items:
            if isinstance(item, float) and not math.isfinite(item):
                return True
    return False
