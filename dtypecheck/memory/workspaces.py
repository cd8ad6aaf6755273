"""Workspaces a kernel sizes at run time, which fake tensors report as empty.

oneDNN's LSTM/GRU (``aten.mkldnn_rnn_layer``, what ``nn.LSTM`` runs on the CPU) returns a workspace that autograd
saves for the backward pass; its meta kernel returns zero elements because the size comes from the oneDNN
primitive. The tracer asks the real kernel once per shape, on zero-filled CPU tensors of the same shapes (one
layer's input and weights: small next to the model it estimates).
"""

from __future__ import annotations

from typing import Any

_CACHE: dict[tuple[Any, ...], int] = {}
_WORKSPACE_OUTPUT = {"aten.mkldnn_rnn_layer.default": 3}
"""Op -> the index of its output that is a run-time-sized workspace."""


def workspace_output(func: Any) -> int | None:
    """The index of ``func``'s workspace output, when fake tensors cannot size it."""
    return _WORKSPACE_OUTPUT.get(str(func))


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    import torch

    def hashable(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return (tuple(value.shape), value.dtype)
        return tuple(value) if isinstance(value, list) else value

    return tuple(hashable(a) for a in args)


def real_workspace_bytes(func: Any, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes of output ``index`` when ``func`` runs for real on zero tensors of the same shapes (cached)."""
    import torch

    key = (str(func), index, _signature(args), tuple(sorted(kwargs.items())), torch.is_grad_enabled())
    return _probe(key, func, index, args, kwargs)


def _probe(key: tuple[Any, ...], func: Any, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # Under the caller's grad mode: without grad the kernel returns no workspace, and nothing is counted.
    with unset_fake_temporarily():
        real = [torch.zeros(a.shape, dtype=a.dtype) if isinstance(a, torch.Tensor) else a for a in args]
        out = func(*real, **kwargs)
        workspace = out[index]
        size = int(workspace.untyped_storage().nbytes()) if isinstance(workspace, torch.Tensor) else 0
    _CACHE[key] = size
    return size
