"""What an op or a module that raised was given, kept in case it is the dtype mismatch that ends the run."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from dtypecheck.nantrace.defaults import dtype_name
from dtypecheck.nantrace.dtypeflow import DtypeFlow, Raised, module_dtype, tensor_names
from dtypecheck.nantrace.explain import is_dtype_error
from dtypecheck.nantrace.frames import FrameFinder
from dtypecheck.nantrace.modules import ModuleStack
from dtypecheck.nantrace.ops import OpInfo

if TYPE_CHECKING:
    from torch import nn


class RaiseWatch:
    """Told by the dispatch mode when an op raises and by the module hooks when a forward is left by an exception."""

    def __init__(self, flow: DtypeFlow, frames: FrameFinder) -> None:
        self.flow = flow
        self.frames = frames
        self.modules: ModuleStack | None = None

    @property
    def _modules(self) -> ModuleStack:
        assert self.modules is not None
        return self.modules

    def op_raised(
        self, info: OpInfo, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException
    ) -> None:
        """An op raised: keep what it was given, in case this is the dtype error that ends the run."""
        if not is_dtype_error(exc) or self.flow.already_raised(exc, by_op=True):
            return
        # A failed explanation must never replace the user's own error.
        with contextlib.suppress(Exception):
            self._record_op_raised(info, func, args, kwargs, exc)

    def _record_op_raised(
        self, info: OpInfo, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException
    ) -> None:
        module = self._modules.current_module
        inputs, addresses = self.flow.tensor_args(func._schema, args, kwargs, tensor_names(self._modules.root))
        own = module_dtype(module) if module is not None else None
        self.flow.remember_raised(
            Raised(
                exc=exc,
                op=info.name,
                module=self._modules.current,
                module_type=type(module).__name__ if module is not None else None,
                module_dtype=dtype_name(own) if own is not None else None,
                frame=self.frames.user_frame(),
                inputs=inputs,
                addresses=addresses,
            )
        )

    def module_raised(self, module: nn.Module, path: str, args: Any, exc: BaseException) -> None:
        """A module's forward was left by an exception: its inputs and parameters, and the line that called it
        (also where the raising check ran before any op, as ``conv2d``'s input/bias dtype check does)."""
        if not is_dtype_error(exc):
            return
        # A failed explanation must never replace the user's own error.
        with contextlib.suppress(Exception):
            self._record_module_raised(module, path, args, exc)

    def _record_module_raised(self, module: nn.Module, path: str, args: Any, exc: BaseException) -> None:

        positional = tuple(args) if isinstance(args, tuple) else (args,)
        call_args = tuple(_address(a) for a in positional)
        names = ["input"] if len(positional) == 1 else [f"input{i}" for i in range(len(positional))]
        given = dict(zip(names, positional, strict=True))
        own = dict(module.named_parameters(recurse=False))
        inputs, addresses = self.flow.tensor_args(None, (), {**given, **own}, tensor_names(self._modules.root))
        dtype = module_dtype(module)
        self.flow.remember_raised(
            Raised(
                exc=exc,
                op=None,
                module=path,
                module_type=type(module).__name__,
                module_dtype=dtype_name(dtype) if dtype is not None else None,
                frame=self.frames.user_frame(),
                inputs=inputs,
                addresses=addresses,
                call_args=call_args,
            )
        )


def _address(value: Any) -> int:
    """The storage address of a tensor argument; -1 for anything else, or a tensor without storage of its own."""
    import torch

    if not isinstance(value, torch.Tensor):
        return -1
    try:
        return int(value.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return -1
