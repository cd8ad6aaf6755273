"""Data-dependent shapes on fake tensors: mixture-of-experts dispatch traced under balanced routing.

Fake tensors have shapes but no values, so an op whose output size depends on values (``nonzero``, one-argument
``where``, boolean masking, ``bincount``, ``.item()``) cannot run on them. Routing is where models do this: a
router's ``topk`` picks each token's experts, and the dispatch gathers every expert's tokens.

The tracer keeps real values beside the fake tensors for the small integer and boolean tensors whose values it can
know: those made without data (``arange``, ``zeros``, ``full``), the real tensors a module makes in its forward
(``torch.tensor([merge_size])``, whose values are their own), anything computed from known values only, and the
expert indices of every ``topk`` over a router's scores, which are replaced by a **balanced routing**: row ``r``'s
``k`` choices among ``E`` are ``(r*k + j) mod E``, so that each expert receives its share ``T*k/E`` of the
tokens. A data-dependent op whose inputs are all known is then run on the real values and its output shaped from
the result. The activations of the dispatched tokens are what a perfectly balanced router would allocate; a real
router's imbalance shifts bytes between experts (within the 5% the tests check against MemTracker).
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

from torch.utils._python_dispatch import TorchDispatchMode

from dtypecheck.memory.recipes import Recipes
from dtypecheck.memory.workspaces import op_name, run_op

if TYPE_CHECKING:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

SHADOW_LIMIT = 1 << 22
"""Integer and boolean tensors of more elements than this are not shadowed (attention masks at long sequences):
routing tensors are a few times the number of tokens."""

ROUTING_NOTE = (
    "data-dependent routing traced as balanced: each token's top-{k} of {experts} experts chosen in turn, so "
    "that every expert receives its share of the tokens"
)


FINITE_NOTE = (
    "{count} finiteness check(s) of values the trace does not know (torch.isfinite(x).all() and the like) taken as "
    "a healthy run answers them: every value finite"
)
FINITENESS = {
    "aten.isfinite.default": True,
    "aten.isinf.default": False,
    "aten.isnan.default": False,
    "aten.isposinf.default": False,
    "aten.isneginf.default": False,
}
"""Elementwise finiteness ops and their answer on every value of a healthy run (what an estimate assumes)."""


def healthy_answer(name: str, args: tuple[Any, ...]) -> bool | None:
    """The answer a healthy run (every floating value finite) gives everywhere to a finiteness check, or None for
    another op. ``torch.isfinite(x)`` reaches the trace as ``abs(x) != inf`` times ``x == x``."""
    import torch

    first = args[0] if args else None
    if not isinstance(first, torch.Tensor) or not first.is_floating_point():
        return None
    if name in FINITENESS:
        return FINITENESS[name]
    if name in ("aten.eq.Tensor", "aten.ne.Tensor") and len(args) > 1 and args[1] is first:
        return name == "aten.eq.Tensor"  # x == x: false only at NaN
    infinite = len(args) > 1 and isinstance(args[1], float) and math.isinf(args[1])
    if name in ("aten.eq.Scalar", "aten.ne.Scalar") and infinite:
        return name == "aten.ne.Scalar"
    return None


MASK_NOTE = (
    "{count} boolean mask(s) of values the trace does not know taken as selecting everything (the most memory: "
    "Idefics' real-image mask, every image real)"
)


READS_VALUES = frozenset(
    (
        "aten._local_scalar_dense.default",
        "aten.nonzero.default",
        "aten.repeat_interleave.Tensor",
        "aten.bincount.default",
    )
)
"""Ops that read their input's values (a count, positions): an unknown input's recipe is replayed for them."""


class DataDependentOpError(Exception):
    """An op whose output size depends on values the trace does not know."""

    def __init__(self, op: str) -> None:
        super().__init__(op)
        self.op = op


SCALAR_LIMIT = 16
"""Floating tensors this small are shadowed too: a random scalar drawn to decide a step (LayerDrop's
``torch.rand([]) < p``), whose ``.item()`` would otherwise stop the trace."""


def _is_index_dtype(tensor: torch.Tensor) -> bool:
    """Integer and boolean tensors, and floating scalars (see ``SCALAR_LIMIT``)."""
    import torch

    if tensor.dtype == torch.bool or not (tensor.is_floating_point() or tensor.is_complex()):
        return True
    return tensor.numel() <= SCALAR_LIMIT


DERIVED_LIMIT = 1 << 20
"""Floating tensors up to this many elements are shadowed when computed from known values only (or made without
data): an attention mask made of the known 0/1 mask (Longformer's ``attention_mask > 0`` after
``(1 - mask) * min``), ViLT's default pixel mask of ones, interpolated to its patch grid. The model's floating
inputs are not (``Shadows.forget_data``): their zeros stand for data the trace does not have."""


def _shadowable(tensor: torch.Tensor, *, derived: bool) -> bool:
    """Whether ``tensor``'s real value is kept: an integer or boolean tensor (or floating scalar) up to
    ``SHADOW_LIMIT`` elements, or, ``derived`` from known values, a floating one up to ``DERIVED_LIMIT``."""
    if _is_index_dtype(tensor):
        return tensor.numel() <= SHADOW_LIMIT
    return derived and tensor.is_floating_point() and tensor.numel() <= DERIVED_LIMIT


def _is_real(tensor: object) -> bool:
    """A tensor with data of its own: a constant the model's forward makes of Python values (the fake mode lets
    such real tensors meet fake ones), not a fake or a meta tensor."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, torch.Tensor) and not isinstance(tensor, FakeTensor) and tensor.device.type != "meta"


class KnownValues:
    """Real tensors by fake tensor, by identity (a tensor's ``==`` is elementwise, so no ``WeakKeyDictionary``);
    an entry goes when its fake tensor does."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}

    def __contains__(self, fake: object) -> bool:
        entry = self._entries.get(id(fake))
        return (entry is not None and entry[0]() is fake) or _is_real(fake)

    def __getitem__(self, fake: torch.Tensor) -> torch.Tensor:
        if _is_real(fake):
            return fake
        if fake not in self:
            raise KeyError("no known value")
        return self._entries[id(fake)][1]

    def __setitem__(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        key = id(fake)
        self._entries[key] = (weakref.ref(fake, lambda _ref: self._entries.pop(key, None)), real)

    def pop(self, fake: torch.Tensor, default: None = None) -> None:
        entry = self._entries.get(id(fake))
        if entry is not None and entry[0]() is fake:
            del self._entries[id(fake)]


def tensors_in(args: tuple[Any, ...], kwargs: dict[str, Any], tensor_type: type) -> list[Any]:
    """The tensors among an op's arguments (or, with no kwargs, its outputs), in ``tree_flatten((args, kwargs))``
    order: an aten op's arguments and outputs nest only lists and tuples (``cat``'s tensors, ``index``'s indices, a
    ``Tensor[]`` in an output tuple), so a flat walk does what the generic pytree flattening does per op, several
    times faster."""
    found: list[Any] = []
    todo: list[Any] = [*args, *kwargs.values()] if kwargs else list(args)
    index = 0
    while index < len(todo):
        value = todo[index]
        index += 1
        if isinstance(value, tensor_type):
            found.append(value)
        elif isinstance(value, list | tuple):
            # Depth first, as tree_flatten: the nested values go next, before the rest.
            todo[index:index] = value
    return found


class Shadows:
    """Real values of the fake integer and boolean tensors whose values are known, by fake tensor."""

    def __init__(self, fake_mode: FakeTensorMode) -> None:
        self.fake_mode = fake_mode
        self.values = KnownValues()
        self.routed: set[tuple[int, int]] = set()
        """(k, experts) of every top-k replaced by balanced routing."""
        self.assumed_masks = 0
        """Unknown boolean masks indexed with, taken as all true."""
        self.assumed_finite = 0
        """Finiteness checks of unknown values, taken as all finite."""
        self.recipes = Recipes()
        """How unknown small integer and boolean tensors were made: their values once their sources are known."""

    def notes(self) -> tuple[str, ...]:
        routing = tuple(ROUTING_NOTE.format(k=k, experts=e) for k, e in sorted(self.routed))
        masks = (MASK_NOTE.format(count=self.assumed_masks),) if self.assumed_masks else ()
        finite = (FINITE_NOTE.format(count=self.assumed_finite),) if self.assumed_finite else ()
        return routing + masks + finite

    # --- the dispatch hook -------------------------------------------------------------------------------

    def run(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], run_fake: Any) -> Any:
        """``func`` on fake tensors, with known values kept beside its integer and boolean outputs, and the
        data-dependent ops whose inputs are known run on the values instead."""
        import torch
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
            unset_fake_temporarily,
        )

        tensors = tensors_in(args, kwargs, torch.Tensor)
        known = all(t in self.values for t in tensors)
        name = op_name(func)
        if not known and tensors and name in READS_VALUES:
            known = all(self._replayed(t) for t in tensors)
        if name == "aten._local_scalar_dense.default":
            if known and tensors:
                with unset_fake_temporarily():
                    return self.values[tensors[0]].item()
            raise DataDependentOpError(name)
        try:
            out = run_fake(func, args, kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            return self._data_dependent(func, args, kwargs, known, run_fake)
        healthy = None if known or not isinstance(out, torch.Tensor) else healthy_answer(name, args)
        if healthy is not None:
            # RT-DETR's encoder layer clamps only ``if not torch.isfinite(hidden_states).all()``: the check's answer
            # is known for a healthy run, as one value broadcast (nothing allocated, at any size).
            with unset_fake_temporarily():
                self.values[out] = torch.full((), healthy, dtype=torch.bool).expand(out.shape)
            self.assumed_finite += name != "aten.eq.Tensor"  # isfinite: one check, two ops
        elif name == "aten.topk.default":
            self._balance(args, kwargs, out)
        elif known:
            self._follow(func, args, kwargs, out)
        else:
            self._forget_mutated(func, args)
            if isinstance(out, torch.Tensor | list | tuple):
                self.recipes.record(func, args, kwargs, out, self._known)
        return out

    def _known(self, tensor: torch.Tensor) -> torch.Tensor | None:
        return self.values[tensor] if tensor in self.values else None  # noqa: SIM401  (no ``get``)

    def _replayed(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s value is known, worked out from its recipe where it was not."""
        if tensor in self.values:
            return True
        real = self.recipes.replay(tensor, self._known)
        if real is None or tuple(real.shape) != tuple(tensor.shape):
            return False
        self.values[tensor] = real
        return True

    # --- helpers ----------------------------------------------------------------------------------------

    def _real(self, value: Any) -> Any:
        import torch
        from torch.utils._pytree import tree_map

        return tree_map(lambda v: self.values[v] if isinstance(v, torch.Tensor) else v, value)

    def _run_real(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return func(*self._real(args), **self._real(kwargs))

    def _remember(self, fake: Any, real: Any, *, derived: bool = False) -> None:
        import torch
        from torch.utils._pytree import tree_flatten

        fakes, reals = tree_flatten(fake)[0], tree_flatten(real)[0]
        for f, r in zip(fakes, reals, strict=False):
            tensors = isinstance(f, torch.Tensor) and isinstance(r, torch.Tensor) and _shadowable(f, derived=derived)
            if tensors and tuple(r.shape) == tuple(f.shape):
                self.values[f] = r

    def _follow(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Compute the real values of an op whose inputs are all known (cheap: small integer tensors, and the
        floating tensors computed from known ones, see ``DERIVED_LIMIT``)."""
        import torch
        from torch.utils._pytree import tree_flatten

        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outs or not all(_shadowable(t, derived=True) for t in outs):
            return
        real = self._run_real(func, args, kwargs)
        if func._schema.is_mutable:
            # In place: the real tensors were updated alongside; their shadows still stand.
            return
        self._remember(out, real, derived=True)

    def forget_data(self, inputs: Any) -> None:
        """The model's floating inputs (fake stand-ins for data, made of zeros) are values the trace does not
        know."""
        import torch
        from torch.utils._pytree import tree_flatten

        for value in tree_flatten(inputs)[0]:
            if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
                self.values.pop(value)

    def _forget_mutated(self, func: Any, args: tuple[Any, ...]) -> None:
        """An in-place op with unknown inputs leaves the tensors it wrote unknown."""
        import torch

        if not func._schema.is_mutable:
            return
        for argument, value in zip(func._schema.arguments, args, strict=False):
            if argument.alias_info is not None and argument.alias_info.is_write and isinstance(value, torch.Tensor):
                self.values.pop(value, None)
                self.recipes.forget(value)

    def _balance(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """A top-k's indices become a balanced routing: row ``r`` picks ``(r*k + j) mod E`` for ``j < k``."""
        import torch
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        source: torch.Tensor = args[0]
        k = int(args[1] if len(args) > 1 else kwargs["k"])
        dim = int(args[2] if len(args) > 2 else kwargs.get("dim", -1)) % max(source.dim(), 1)
        indices = out[1]
        experts = int(source.shape[dim]) if source.dim() else 1
        if indices.numel() > SHADOW_LIMIT:
            return
        with unset_fake_temporarily():
            moved = list(indices.shape)
            moved.append(moved.pop(dim))
            rows = int(torch.tensor(moved[:-1]).prod()) if len(moved) > 1 else 1
            choice = (torch.arange(rows).unsqueeze(1) * k + torch.arange(k)) % max(experts, 1)
            real = choice.reshape(moved).movedim(-1, dim).contiguous()
        self.values[indices] = real
        self.routed.add((k, experts))

    def _data_dependent(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], known: bool, run_fake: Any
    ) -> Any:
        """An op fake tensors cannot size: run it on the known values, or index with the known mask's positions."""
        import torch

        name = op_name(func)
        if known:
            real = self._run_real(func, args, kwargs)
            fake = self._to_fake(real)
            self._remember(fake, real)
            return fake
        if name == "aten.index.Tensor":
            self._assume_selected(args)
        masks = self._known_bool_indices(args)
        if masks is not None:
            return self.run(func, masks, kwargs, run_fake)
        if name == "aten.masked_select.default" and args[1] in self.values:
            mask = self.values[args[1]]
            shape = torch.broadcast_shapes(mask.shape, args[0].shape)  # type: ignore[no-untyped-call]
            with torch._subclasses.fake_tensor.unset_fake_temporarily():
                count = int(torch.broadcast_to(mask, shape).sum())
            return run_fake(torch.ops.aten.new_empty.default, (args[0], (count,)), {})
        raise DataDependentOpError(name)

    def _assume_selected(self, args: tuple[Any, ...]) -> None:
        """``x[mask]`` with a boolean mask of unknown values: the mask is taken as all true from here on (its
        count, ``mask.sum()``, then agrees with what was selected), the largest selection and so the most memory
        (a mask too large to shadow stays unknown)."""
        import torch
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        if len(args) < 2 or not isinstance(args[1], list | tuple):
            return
        for index in args[1]:
            if isinstance(index, torch.Tensor) and index.dtype == torch.bool and index not in self.values:
                if index.numel() > SHADOW_LIMIT:
                    return
                with unset_fake_temporarily():
                    self.values[index] = torch.ones(tuple(index.shape), dtype=torch.bool)
                self.assumed_masks += 1

    def _known_bool_indices(self, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """``index``/``index_put`` arguments with each known boolean mask replaced by its positions (as
        ``x[mask]`` is ``x[mask.nonzero().unbind(1)]``); None when there is no known mask."""
        import torch
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        if len(args) < 2 or not isinstance(args[1], list | tuple):
            return None
        replaced: list[Any] = []
        changed = False
        for index in args[1]:
            if isinstance(index, torch.Tensor) and index.dtype == torch.bool and index in self.values:
                with unset_fake_temporarily():
                    positions = self.values[index].nonzero().unbind(1)
                for real in positions:
                    fake = self._to_fake(real)
                    self.values[fake] = real
                    replaced.append(fake)
                changed = True
            else:
                replaced.append(index)
        if not changed:
            return None
        return (args[0], replaced, *args[2:])

    def _to_fake(self, real: Any) -> Any:
        import torch
        from torch.utils._pytree import tree_map

        def convert(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            # A fresh fake tensor of the result's shape: the op allocated it, so the tracker counts it.
            return torch.empty(value.shape, dtype=value.dtype)

        return tree_map(convert, real)


class KnownValuesMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Ops run with ``shadows``' known values and nothing counted: a pass's side computation (how many features
    a vision tower makes, to put as many placeholders in the text) that reads the values its inputs were made
    of."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as the tracer's own mode: nothing here is compiled

    def __init__(self, shadows: Shadows) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.shadows = shadows

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return self.shadows.run(func, args, kwargs or {}, run_op)
