"""What fake tensors cannot tell by themselves: workspaces a kernel sizes at run time, and ops whose meta kernel
accepts fewer dtypes than the real ones.

oneDNN's LSTM/GRU (``aten.mkldnn_rnn_layer``, what ``nn.LSTM`` runs on the CPU) returns a workspace that autograd
saves for the backward pass; its meta kernel returns zero elements because the size comes from the oneDNN
primitive. The tracer asks the real kernel once per shape, on zero-filled CPU tensors of the same shapes. Past
``PROBE_LIMIT`` bytes of real input (a ``--fit`` search at a huge batch), it asks at the two largest batches b and
2b within the limit and extends linearly: the workspace holds per-sequence gates and states, page-rounded.

``aten._grouped_mm`` (mixture-of-experts layers in transformers) has a meta kernel that takes bfloat16 only, while
the model runs it in float32 too; it is shaped in bfloat16 and its output given the inputs' dtype.

A reduced MSE, smooth-L1, BCE or soft-margin loss returns its scalar in the elementwise buffer it reduced (the
real kernel's storage is the inputs' size; the meta kernel's, 4 bytes): counted at its real size while it lives.
So is the output of ``col2im`` and ``im2col`` (``F.fold``, ``F.unfold``), made the input's size and shrunk.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from dtypecheck.memory.dispatch_cache import cached_call


class _TensorShape(NamedTuple):
    shape: tuple[int, ...]
    dtype: Any


PROBE_LIMIT = 64 * 2**20
"""The most bytes of real zero-filled arguments a probe allocates."""
_CACHE: dict[tuple[Any, ...], int] = {}
_WORKSPACE_OUTPUT = {"aten.mkldnn_rnn_layer.default": 3}
"""Op -> the index of its output that is a run-time-sized workspace."""
_BATCH_DIMS = {"aten.mkldnn_rnn_layer.default": (1, None, None, None, None, 0, 0)}
"""Op -> for each tensor argument, its batch dimension (None: not batched): ``input`` is (seq, batch, features),
``hx`` and ``cx`` are (batch, hidden)."""


_BFLOAT16_META_ONLY = frozenset({"aten._grouped_mm.default"})


@functools.cache
def op_name(func: Any) -> str:
    """``str(func)`` ("aten.view.default"), made once per op: the tracer asks for it several times per call."""
    return str(func)


def run_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` on fake tensors, shaping a bfloat16-only meta kernel in bfloat16."""
    import torch
    from torch.utils._pytree import tree_map

    name = op_name(func)
    if name == "aten._unsafe_view.default":
        # Below autograd ``_unsafe_view`` is ``view``: the same storage, sizes and strides. Fake tensors never cache
        # it and shape it with a Python reference (0.55 ms an op against 0.17 for a cached view: 46 a T5 block
        # trace, from every Linear on 3-D input).
        try:
            return cached_call(torch.ops.aten.view.default, args, kwargs)
        except RuntimeError:
            return func(*args, **kwargs)
    if name not in _BFLOAT16_META_ONLY:
        return cached_call(func, args, kwargs)
    dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()}
    if dtypes <= {torch.bfloat16}:
        return func(*args, **kwargs)

    def to_bfloat16(value: Any) -> Any:
        is_float = isinstance(value, torch.Tensor) and value.is_floating_point()
        return value.to(torch.bfloat16) if is_float else value

    out = func(*tree_map(to_bfloat16, args), **tree_map(to_bfloat16, kwargs))
    dtype = next(iter(dtypes)) if len(dtypes) == 1 else torch.float32
    return out.to(dtype)


_REDUCED_LOSSES = frozenset(
    {
        "aten.mse_loss.default",
        "aten.smooth_l1_loss.default",
        "aten.binary_cross_entropy.default",
        "aten.soft_margin_loss.default",
    }
)
"""Losses whose real kernel, reducing, returns the mean or sum in its elementwise buffer: the structured kernel
builds its output at the inputs' broadcast size, then resizes it to 0-dim, and the storage stays (torch 2.13 on
the CPU: a 16 MiB storage behind the ``F.mse_loss`` of two 16 MiB tensors, kept as long as the loss lives, through
backward and, in a loop that still holds ``loss``, the update). Fake tensors give a 4-byte scalar."""


@functools.cache
def _keeps_buffer(name: str, dtype: Any) -> bool:
    """Whether this torch's real kernel of the reduced loss ``name`` returns its scalar in the elementwise buffer:
    asked once per dtype on 4 x 4 CPU tensors (the behaviour is the kernel's, not the shape's)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    op = getattr(torch.ops.aten, name.split(".")[1]).default
    with unset_fake_temporarily(), torch.no_grad():
        half = torch.full((4, 4), 0.5, dtype=dtype)
        try:
            loss = op(half, half.clone(), reduction=1)
        except (RuntimeError, TypeError):
            return False
    return bool(loss.dim() == 0 and loss.untyped_storage().nbytes() >= half.nbytes)


_INPUT_SIZED = {
    "aten.col2im.default": ((1, 4, 9), ((4, 4), (2, 2), (1, 1), (0, 0), (1, 1))),
    "aten.im2col.default": ((1, 1, 6, 6), ((2, 2), (1, 1), (0, 0), (3, 3))),
}
"""Ops whose real kernels (the CPU's and CUDA's) make their output ``empty_like(input)`` and resize it to the
output's shape, which keeps the storage at the input's size where the output is smaller: overlapping blocks folded
(NeuCodec's ISTFT overlap-add, a (1, 1, 1, 9120) float32 signal in the 122,880 bytes of its (1, 1920, 16) frames;
its inference was 6.4% under MemTracker), or blocks unfolded at a stride past the kernel. Each with a probe, (input
shape, the other arguments), whose output is smaller than its input."""


@functools.cache
def _keeps_input_size(name: str, dtype: Any) -> bool:
    """Whether this torch's real kernel of ``name`` (of ``_INPUT_SIZED``) returns a smaller output in storage of
    its input's size: asked once per dtype on a small CPU tensor."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    op = getattr(torch.ops.aten, name.split(".")[1]).default
    shape, rest = _INPUT_SIZED[name]
    with unset_fake_temporarily(), torch.no_grad():
        blocks = torch.zeros(shape, dtype=dtype)
        try:
            out = op(blocks, *rest)
        except (RuntimeError, TypeError):
            return False
    return bool(out.numel() < blocks.numel() and out.untyped_storage().nbytes() >= blocks.nbytes)


def held_output_bytes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int | None:
    """The bytes ``out``'s real storage holds where its fake one says less: a reduced loss of ``_REDUCED_LOSSES``
    that keeps its elementwise buffer (the broadcast inputs' size), a fold or unfold (``_INPUT_SIZED``) output
    smaller than its input; None for every other op."""
    import torch

    name = op_name(func)
    if name in _INPUT_SIZED and isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
        if out.numel() >= args[0].numel() or not _keeps_input_size(name, out.dtype):
            return None
        return int(args[0].numel()) * int(out.element_size())
    if name not in _REDUCED_LOSSES or not isinstance(out, torch.Tensor) or out.dim() != 0:
        return None
    schema = [a.name for a in func._schema.arguments]
    at = schema.index("reduction")
    reduction = kwargs.get("reduction", args[at] if len(args) > at else 1)
    if reduction == 0 or len(args) < 2 or not _keeps_buffer(name, args[0].dtype):
        return None
    shape = torch.broadcast_shapes(args[0].shape, args[1].shape)  # type: ignore[no-untyped-call]
    return int(shape.numel()) * int(out.element_size())


def workspace_output(func: Any) -> int | None:
    """The index of ``func``'s workspace output, when fake tensors cannot size it."""
    return _WORKSPACE_OUTPUT.get(op_name(func))


def _shapes(args: tuple[Any, ...]) -> tuple[Any, ...]:
    import torch

    def hashable(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return _TensorShape(tuple(value.shape), value.dtype)
        return tuple(value) if isinstance(value, list) else value

    return tuple(hashable(a) for a in args)


def _with_batch(shapes: tuple[Any, ...], dims: tuple[int | None, ...], batch: int) -> tuple[Any, ...]:
    resized = list(shapes)
    for index, dim in enumerate(dims):
        if dim is not None:
            shape, dtype = resized[index]
            resized[index] = _TensorShape((*shape[:dim], batch, *shape[dim + 1 :]), dtype)
    return tuple(resized)


def _probe(func: Any, index: int, shapes: tuple[Any, ...], kwargs: dict[str, Any], grad: bool) -> int:
    key = (str(func), index, shapes, tuple(sorted(kwargs.items())), grad)
    if key in _CACHE:
        return _CACHE[key]
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # Under the caller's grad mode: without grad the kernel returns no workspace, and nothing is counted.
    with unset_fake_temporarily(), torch.set_grad_enabled(grad):
        real = [torch.zeros(a.shape, dtype=a.dtype) if isinstance(a, _TensorShape) else a for a in shapes]
        workspace = func(*real, **kwargs)[index]
        size = int(workspace.untyped_storage().nbytes()) if isinstance(workspace, torch.Tensor) else 0
    _CACHE[key] = size
    return size


def real_workspace_bytes(func: Any, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes of output ``index`` when ``func`` runs for real on zero tensors of the same shapes (cached)."""
    import torch

    shapes = _shapes(args)
    grad = torch.is_grad_enabled()
    real_bytes = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
    dims = _BATCH_DIMS.get(str(func))
    if real_bytes <= PROBE_LIMIT or dims is None:
        return _probe(func, index, shapes, kwargs, grad)
    batch = int(args[0].shape[dims[0]]) if dims[0] is not None else 1
    # The two largest batches within the limit: the page rounding matters least there.
    small = max(1, batch * PROBE_LIMIT // real_bytes // 2)
    first = _probe(func, index, _with_batch(shapes, dims, small), kwargs, grad)
    second = _probe(func, index, _with_batch(shapes, dims, 2 * small), kwargs, grad)
    return first + (batch - small) * (second - first) // small
