"""Turning modules and inputs into fake tensors without allocating their data."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode


def new_fake_mode() -> FakeTensorMode:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dtypecheck.memory.lazy_dynamo import defer_dynamo_import

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
            sub._buffers[name] = memo[id(buffer)]
    return module


def fake_inputs(mode: FakeTensorMode, value: Any) -> Any:
    """The same nesting of inputs with every tensor replaced by a fake one."""
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: fake_tensor(mode, v) if isinstance(v, torch.Tensor) else v, value)


def cast_module(module: torch.nn.Module, dtype: torch.dtype, mode: FakeTensorMode) -> None:
    """``module.to(dtype)`` for fake parameters (whose weak references forbid ``Module.to``'s tensor swap):
    floating parameters and buffers get new fake tensors in ``dtype``, ties kept."""
    from torch import nn

    memo: dict[int, Any] = {}

    def convert(tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_floating_point() or tensor.dtype == dtype:
            return tensor
        if id(tensor) not in memo:
            with mode:
                converted = tensor.detach().to(dtype)
            if isinstance(tensor, nn.Parameter) or getattr(tensor, "_is_param", False):
                converted = nn.Parameter(converted, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = converted
        return memo[id(tensor)]  # type: ignore[no-any-return]

    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None:
                sub._parameters[name] = convert(param)  # type: ignore[assignment]
        for name, buffer in list(sub._buffers.items()):
            if buffer is not None:
                sub._buffers[name] = convert(buffer)


@contextlib.contextmanager
def on_meta_without_init() -> Iterator[None]:
    """Build modules on the meta device with ``torch.nn.init``'s in-place initialisers made no-ops: a meta tensor
    has no values to fill, and the meta ``normal_`` runs through Python references that import torch._dynamo
    (seconds) on first use."""
    import torch
    from torch.nn import init

    names = [name for name in dir(init) if name.endswith("_") and not name.startswith("_")]
    originals = {name: getattr(init, name) for name in names}

    def keep(tensor: torch.Tensor, *_args: Any, **_kwargs: Any) -> torch.Tensor:
        return tensor

    try:
        for name in names:
            setattr(init, name, keep)
        with torch.device("meta"):
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
