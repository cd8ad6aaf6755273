"""Where dtypes enter the traced program: the program's dominant float dtype, the line that made each tensor of
another dtype, the first float64 promotion, and what the op that raised a dtype error was given.

Cheap by construction: a tensor's origin is remembered only at ops that make a dtype (factories, ``torch.tensor``,
casts) and at ops whose output is not in the dominant dtype; a float32 program pays one dtype comparison per op.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dtypecheck.nantrace.defaults import dtype_name
from dtypecheck.nantrace.frames import FrameFinder, FrameKey, location_of
from dtypecheck.nantrace.ops import OpInfo, OpKind
from dtypecheck.nantrace.report import Phase, Promotion, TensorArg

if TYPE_CHECKING:
    import torch
    from torch import nn

_PRUNE_AT = 4096
"""Origins kept before dead storages are swept out."""
_MODULES_PER_ERROR = 8
_RAISED_KEPT = 16
"""Records of raising ops and modules kept (a caught-and-retried dtype error must not pin memory forever)."""


def majority_float_dtype(module: nn.Module) -> torch.dtype | None:
    """The floating dtype holding most of a module's parameter elements (None without float parameters)."""
    counts: dict[torch.dtype, int] = {}
    for parameter in module.parameters():
        if parameter.is_floating_point() and not _lazy(parameter):
            counts[parameter.dtype] = counts.get(parameter.dtype, 0) + parameter.numel()
    return max(counts, key=lambda d: counts[d]) if counts else None


def _lazy(parameter: torch.Tensor) -> bool:
    """A lazy module's parameter before its first call (``LazyLinear``): no shape yet, and ``numel()`` raises."""
    from torch.nn.parameter import is_lazy

    return is_lazy(parameter)


def module_dtype(module: nn.Module) -> torch.dtype | None:
    """The dtype of a module's own parameters (its children's when it has none of its own)."""
    own = [p for p in module.parameters(recurse=False) if p.is_floating_point() and not _lazy(p)]
    if own:
        counts: dict[torch.dtype, int] = {}
        for parameter in own:
            counts[parameter.dtype] = counts.get(parameter.dtype, 0) + parameter.numel()
        return max(counts, key=lambda d: counts[d])
    return majority_float_dtype(module)


def tensor_names(root: nn.Module | None) -> dict[int, str]:
    """Storage address -> dotted name of every parameter and buffer of ``root`` (asked only when an op raised)."""
    if root is None:
        return {}
    names: dict[int, str] = {}
    for name, value in (*root.named_parameters(), *root.named_buffers()):
        try:
            names.setdefault(int(value.untyped_storage().data_ptr()), name)
        except (RuntimeError, NotImplementedError):
            continue
    return names


def named_tensor_args(schema: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(schema argument name, tensor) for every tensor an op was given; list items as ``name[i]``."""
    import torch

    names = [a.name for a in schema.arguments] if schema is not None else []
    given = [*((names[i] if i < len(names) else f"arg{i}", v) for i, v in enumerate(args)), *kwargs.items()]
    for name, value in given:
        if isinstance(value, torch.Tensor):
            yield name, value
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                if isinstance(item, torch.Tensor):
                    yield f"{name}[{i}]", item


@dataclass(frozen=True)
class Raised:
    """What an op or a module that raised was given, captured at the moment it raised."""

    exc: BaseException
    op: str | None
    module: str | None
    module_type: str | None
    module_dtype: str | None
    """Majority dtype of the raising module's own floating parameters."""
    frame: FrameKey | None
    inputs: tuple[TensorArg, ...]
    addresses: tuple[int, ...]
    """Storage address of each of ``inputs`` (-1 when it has none)."""
    call_args: tuple[int, ...] = ()
    """Module records: the storage address of each positional argument of the module's call (-1 for a
    non-tensor), to name the user's variable on the calling line."""


class DtypeFlow:
    def __init__(self, frames: FrameFinder, *, lower_names: tuple[str, ...]) -> None:
        import torch

        self._frames = frames
        self.dominant: torch.dtype | None = None
        self.confirmed = False
        """The dominant dtype came from a model's parameters (not just from the first float op)."""
        self.on_change: Callable[[torch.dtype | None, bool], None] | None = None
        """Told (dominant, confirmed) when a model's parameters set them (the C++ per-op path keeps them)."""
        self._float64 = torch.float64
        self._lower = frozenset(getattr(torch, n) for n in lower_names)
        self._origins: dict[int, tuple[weakref.ref[torch.UntypedStorage], FrameKey | None, str]] = {}
        self._roots_seen: set[int] = set()
        self.promotion: Promotion | None = None
        self.raised: list[Raised] = []

    # -- the dominant dtype ------------------------------------------------------------------------------------
    def root_started(self, module: nn.Module) -> None:
        """A model starts running: the majority of its parameters becomes the program's dtype (once)."""
        if self.confirmed or id(module) in self._roots_seen:
            return
        self._roots_seen.add(id(module))
        dtype = majority_float_dtype(module)
        if dtype is not None:
            self.dominant, self.confirmed = dtype, True
            if self.on_change is not None:
                self.on_change(dtype, True)

    # -- origins -----------------------------------------------------------------------------------------------
    def _remember(self, tensor: torch.Tensor, frame: FrameKey | None, op: str) -> None:
        try:
            storage = tensor.untyped_storage()
            address = int(storage.data_ptr())
        except (RuntimeError, NotImplementedError):  # no storage of its own (a nested tensor's wrapper, meta)
            return
        origins = self._origins
        if len(origins) >= _PRUNE_AT:
            for key in [k for k, (ref, _, _) in origins.items() if ref() is None]:
                del origins[key]
        origins[address] = (weakref.ref(storage), frame, op)

    def origin_of(self, tensor: torch.Tensor) -> tuple[FrameKey | None, str] | None:
        try:
            entry = self._origins.get(int(tensor.untyped_storage().data_ptr()))
        except (RuntimeError, NotImplementedError):  # a tensor without storage (a subclass, meta)
            return None
        if entry is None or entry[0]() is None:
            return None
        return entry[1], entry[2]

    def created_outside(self, info: OpInfo, out: Any) -> None:
        """A making op on a path that does not walk frames (``empty``, factories under no_grad)."""
        import torch

        if (
            isinstance(out, torch.Tensor)
            and out.dtype.is_floating_point
            and not (self.confirmed and out.dtype is self.dominant)
        ):
            self._remember(out, self._frames.user_frame(), info.name)

    def after_op(
        self,
        func: Any,
        info: OpInfo,
        record_args: tuple[tuple[Any, ...], dict[str, Any]],
        result: torch.Tensor,
        frame: FrameKey | None,
        where: tuple[str | None, bool, int, int],
    ) -> None:
        """Called once per traced op with its first output; ``where`` is (module, in backward, step, op index)."""
        dtype = result.dtype
        if not dtype.is_floating_point:
            return
        if self.dominant is None:
            self.dominant = dtype
        if info.creates:
            if not (self.confirmed and dtype is self.dominant):
                self._remember(result, frame, info.name)
            return
        if dtype is self.dominant:
            return
        self._derived(func, info, record_args, result, frame, where)

    def _derived(
        self,
        func: Any,
        info: OpInfo,
        record_args: tuple[tuple[Any, ...], dict[str, Any]],
        result: torch.Tensor,
        frame: FrameKey | None,
        where: tuple[str | None, bool, int, int],
    ) -> None:
        """An op computed a tensor outside the dominant dtype: it inherits the origin of its input of that dtype."""
        import torch

        dtype = result.dtype
        args, kwargs = record_args
        inherited: tuple[FrameKey | None, str] | None = None
        has64 = has_lower = False
        for value in (*args, *kwargs.values()):
            items = value if isinstance(value, list | tuple) else (value,)
            for item in items:
                if isinstance(item, torch.Tensor) and item.dtype.is_floating_point:
                    if item.dtype is dtype and inherited is None:
                        inherited = self.origin_of(item)
                    has64 |= item.dtype is self._float64
                    has_lower |= item.dtype in self._lower
        if inherited is not None:
            self._remember(result, inherited[0], inherited[1])
        if (
            dtype is self._float64
            and self.promotion is None
            and info.kind is OpKind.CHECK  # views and copies pass float64 on; they do not compute in it
            and has64
            # float64 scalar arithmetic (GradScaler's own ``_scale.double().reciprocal()``) doubles nothing.
            and (has_lower or (self.dominant in self._lower and result.dim() > 0))
            and self.dominant is not None
        ):
            self.promotion = self._promotion(func, info, args, kwargs, result, frame, where)

    def _promotion(
        self,
        func: Any,
        info: OpInfo,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result: torch.Tensor,
        frame: FrameKey | None,
        where: tuple[str | None, bool, int, int],
    ) -> Promotion:
        import torch

        module, backward, step, index = where
        inputs, _ = self.tensor_args(func._schema, args, kwargs)
        created = next((a.created for a in inputs if a.dtype == "float64" and a.created is not None), None)
        # The output's grad_fn is attached only after dispatch returns: ask whether autograd will record the op.
        grad = torch.is_grad_enabled() and any(t.requires_grad for _, t in named_tensor_args(None, args, kwargs))
        in_autograd = module is not None or grad
        phase: Phase = "backward" if backward else ("forward" if in_autograd else "other")
        return Promotion(
            op=info.name,
            phase=phase,
            module=module,
            dtype=dtype_name(result.dtype),
            dominant=dtype_name(self.dominant),
            inputs=tuple(a for a in inputs if a.dtype.startswith(("float", "bfloat"))),
            location=location_of(frame),
            created=created,
            step=step,
            op_index=index,
        )

    # -- errors ------------------------------------------------------------------------------------------------
    def tensor_args(
        self,
        schema: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        parameters: dict[int, str] | None = None,
    ) -> tuple[tuple[TensorArg, ...], tuple[int, ...]]:
        """The tensors an op was given, and the storage address of each."""
        found = []
        addresses = []
        for name, tensor in named_tensor_args(schema, args, kwargs):
            origin = self.origin_of(tensor)
            try:
                address = int(tensor.untyped_storage().data_ptr())
            except (RuntimeError, NotImplementedError):
                address = -1
            addresses.append(address)
            found.append(
                TensorArg(
                    name=name,
                    dtype=dtype_name(tensor.dtype),
                    shape=tuple(int(s) for s in tensor.shape),
                    parameter=(parameters or {}).get(address),
                    created=location_of(origin[0]) if origin else None,
                    created_by=origin[1] if origin else None,
                )
            )
        return tuple(found), tuple(addresses)

    def remember_raised(self, raised: Raised) -> None:
        same = [r for r in self.raised if r.exc is raised.exc]
        if raised.op is None and len(same) >= _MODULES_PER_ERROR:
            return  # the innermost modules are the ones that explain it
        if len(self.raised) >= _RAISED_KEPT:
            older = next((r for r in self.raised if r.exc is not raised.exc), None)
            if older is None:
                return
            self.raised.remove(older)
        self.raised.append(raised)

    def already_raised(self, exc: BaseException, *, by_op: bool) -> bool:
        return by_op and any(r.exc is exc and r.op is not None for r in self.raised)

    def release(self) -> None:
        self._origins.clear()
