"""Turning modules and inputs into fake tensors without allocating their data."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode


def new_fake_mode() -> FakeTensorMode:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dtypecheck.lazy_dynamo import defer_dynamo_import

    defer_dynamo_import()
    # Real tensors may meet fake ones (a constant a module creates in forward): treat them as fake too.
    return FakeTensorMode(allow_non_fake_inputs=True)


def fake_tensor(mode: FakeTensorMode, tensor: torch.Tensor) -> torch.Tensor:
    """A fake copy of ``tensor`` on its own device, or on the CPU for a meta tensor (never reading data)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(tensor, FakeTensor):
        return tensor
    if tensor.device.type == "meta":
        return FakeTensor(mode, tensor.detach(), torch.device("cpu"))
    return mode.from_tensor(tensor.detach())


def fakify_module(module: torch.nn.Module, mode: FakeTensorMode) -> torch.nn.Module:
    """Replace every parameter and buffer by a fake one in place, keeping ties (one tensor, one fake)."""
    from torch import nn

    memo: dict[int, Any] = {}
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is None:
                continue
            if id(param) not in memo:
                # Made outside the mode: inside it, a meta tensor's detach() is converted as a foreign input.
                fake = fake_tensor(mode, param)
                with mode:
                    memo[id(param)] = nn.Parameter(fake, requires_grad=param.requires_grad)
            sub._parameters[name] = memo[id(param)]
        for name, buffer in list(sub._buffers.items()):
            if buffer is None:
                continue
            if id(buffer) not in memo:
                memo[id(buffer)] = fake_tensor(mode, buffer)
                if buffer.device.type != "meta" and is_small_constant(buffer):
                    # A constant the constructor made of Python numbers (Encodec's stride): its value is known.
                    memo[id(buffer)].constant_value = buffer.detach().clone()
            sub._buffers[name] = memo[id(buffer)]
    return module


CONSTANT_LIMIT = 64
"""Elements of the largest constant a constructor makes of Python numbers that is kept off the meta device."""


def is_small_constant(tensor: torch.Tensor) -> bool:
    """An integer or boolean tensor of at most ``CONSTANT_LIMIT`` elements."""
    return not (tensor.is_floating_point() or tensor.is_complex()) and tensor.numel() <= CONSTANT_LIMIT


def _python_integers(data: Any) -> int | None:
    """How many Python ints (or bools) ``data`` nests, or None if it holds anything else."""
    if isinstance(data, int):
        return 1
    if isinstance(data, list | tuple):
        counts = [_python_integers(v) for v in data]
        return None if None in counts else sum(c for c in counts if c is not None)
    return None


def _meta_except_constants() -> Any:
    """``torch.device("meta")``, except for the small integer constants a constructor makes of Python numbers
    (``torch.tensor(stride)``): those stay real, on the CPU, so that the trace knows their values (Encodec's and
    Mimi's convolutions read their padding from such buffers)."""
    import torch
    from torch.utils._device import DeviceContext
    from torch.utils._pytree import tree_flatten, tree_map

    class MetaExceptConstants(DeviceContext):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.tensor and args and kwargs.get("device") is None:
                count = _python_integers(args[0])
                dtype = kwargs.get("dtype")
                integral = dtype is None or not (dtype.is_floating_point or dtype.is_complex)
                if count is not None and count <= CONSTANT_LIMIT and integral:
                    return func(*args, **kwargs)
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            if any(t.device.type != "meta" for t in tensors) and any(t.device.type == "meta" for t in tensors):
                # Such a constant meeting a meta tensor (LayoutLMv3's box cat with its patch boxes) joins it there.
                args, kwargs = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, (args, kwargs))
            return super().__torch_function__(func, types, args, kwargs)  # type: ignore[no-untyped-call]

    return MetaExceptConstants("meta")


def fake_inputs(mode: FakeTensorMode, value: Any) -> Any:
    """The same nesting of inputs with every tensor replaced by a fake one."""
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: fake_tensor(mode, v) if isinstance(v, torch.Tensor) else v, value)


def cast_module(module: torch.nn.Module, dtype: torch.dtype, mode: FakeTensorMode) -> None:
    """``module.to(dtype)`` for fake parameters (whose weak references forbid ``Module.to``'s tensor swap):
    floating parameters and buffers get new fake tensors in ``dtype``, ties kept."""

    def to_dtype(tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_floating_point() or tensor.dtype == dtype:
            return tensor
        with mode:
            return tensor.detach().to(dtype)

    replace_converted(module.modules(), to_dtype)


def replace_converted(modules: Iterable[torch.nn.Module], convert: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """``convert`` each parameter and buffer of ``modules`` (fake ones: torch's in-place swap refuses them) and
    put what it returns in their place: a tensor it leaves as it is stays, one it changes is replaced by its
    conversion, a parameter's wrapped as a new ``Parameter`` (its gradient converted alike), each tensor converted
    once so that ties stay ties."""
    import torch
    from torch import nn

    memo: dict[int, Any] = {}

    def replaced(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in memo:
            with torch.no_grad():
                converted = convert(tensor)
                if converted is not tensor and (
                    isinstance(tensor, nn.Parameter) or getattr(tensor, "_is_param", False)
                ):
                    grad = tensor.grad
                    converted = nn.Parameter(converted, requires_grad=tensor.requires_grad)
                    if grad is not None:
                        converted.grad = convert(grad)
            memo[id(tensor)] = converted
        return memo[id(tensor)]  # type: ignore[no-any-return]

    for sub in modules:
        for name, param in list(sub._parameters.items()):
            if param is not None:
                sub._parameters[name] = replaced(param)  # type: ignore[assignment]
        for name, buffer in list(sub._buffers.items()):
            if buffer is not None:
                sub._buffers[name] = replaced(buffer)


@contextlib.contextmanager
def on_meta_without_init() -> Iterator[None]:
    """Build modules on the meta device with ``torch.nn.init``'s in-place initialisers made no-ops: a meta tensor
    has no values to fill, and the meta ``normal_`` runs through Python references that import torch._dynamo
    (seconds) on first use."""
    from torch.nn import init

    names = [name for name in dir(init) if name.endswith("_") and not name.startswith("_")]
    originals = {name: getattr(init, name) for name in names}

    def keep(tensor: torch.Tensor, *_args: Any, **_kwargs: Any) -> torch.Tensor:
        return tensor

    try:
        for name in names:
            setattr(init, name, keep)
        with _meta_except_constants():
            yield
    finally:
        for name, original in originals.items():
            setattr(init, name, original)


@contextlib.contextmanager
def quiet_fake_tensor_log() -> Iterator[None]:
    """Silence the traceback FakeTensorMode logs when an op fails: the error itself is reported in one line."""
    import logging

    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def fake_module_conversions() -> Iterator[None]:
    """``Module.to()`` (``.float()``, ``.half()``...) called by a model's own forward on fake parameters: NLLB-MoE's
    router casts its classifier to its own dtype at every call. Torch swaps each fake parameter for its converted
    copy in place (``swap_tensors``), which the fake tensors' weak references refuse ("Couldn't swap
    Linear.weight"); here the modules that hold fakes are converted as ``cast_module`` converts them
    (``replace_converted``: ties kept). Modules that hold no fake tensor are converted by torch as usual."""
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensor

    original = nn.Module._apply

    def holds_fakes(module: nn.Module) -> bool:
        held = (*module._parameters.values(), *module._buffers.values())
        return any(isinstance(tensor, FakeTensor) for tensor in held)

    def apply(self: nn.Module, fn: Any, recurse: bool = True) -> nn.Module:
        modules = list(self.modules()) if recurse else [self]
        faked = [module for module in modules if holds_fakes(module)]
        if not faked:
            return original(self, fn, recurse)  # type: ignore[no-any-return, no-untyped-call]
        ids = {id(module) for module in faked}
        for module in modules:
            if id(module) not in ids:
                original(module, fn, recurse=False)  # type: ignore[no-untyped-call]
        replace_converted(faked, fn)
        return self

    nn.Module._apply = apply  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module._apply = original  # type: ignore[method-assign]
