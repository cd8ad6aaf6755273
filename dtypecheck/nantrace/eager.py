"""``torch.compile`` under tracing: the model runs eagerly, so that every op reaches the dispatch mode."""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtypecheck.nantrace.hooks import TracerHooks


def run_compile_eagerly(tracer: TracerHooks) -> list[tuple[Any, str, Any]]:
    """Make ``torch.compile`` hand back the model itself: compiled kernels would bypass the dispatch mode.

    Counts the calls on ``tracer.compile_calls``; returns (owner, name, original) to put back when tracing ends."""
    import torch

    restore: list[tuple[Any, str, Any]] = []

    def compile_eagerly(model: Any = None, **kwargs: Any) -> Any:
        tracer.compile_calls += 1
        return model if model is not None else (lambda fn: fn)

    def module_compile_eagerly(module: Any, *args: Any, **kwargs: Any) -> None:
        tracer.compile_calls += 1

    restore.append((torch, "compile", torch.compile))
    torch.compile = compile_eagerly
    if hasattr(torch.nn.Module, "compile"):  # torch >= 2.2
        restore.append((torch.nn.Module, "compile", torch.nn.Module.compile))
        torch.nn.Module.compile = module_compile_eagerly  # type: ignore[method-assign,assignment]
    dynamo_config = sys.modules.get("torch._dynamo.config")
    if isinstance(dynamo_config, types.ModuleType):
        # Functions compiled before tracing began: dynamo leaves frames alone while disabled.
        restore.append((dynamo_config, "disable", getattr(dynamo_config, "disable", False)))
        setattr(dynamo_config, "disable", True)  # noqa: B010  (a module attribute mypy cannot see)
    return restore
