"""A cheaper front for fake tensors' own dispatch cache: the same outputs, found by a key that costs less.

A traced pass runs thousands of ops, nearly all of them met before at the same shapes (every block of a deep model
runs the same ops, every ``--fit`` check at a shape traces 1, 2 and 3 blocks). Fake tensors cache the output of each
(op, argument metadata), but their key is built in Python per op through ``extract_tensor_metadata`` and a generic
flattening (memory format, sparsity checks, a dataclass walk): on a T5 block's training trace that key and the
dispatch around it are a third of the whole trace.

``cached_call`` keys each op on the same facts at the cost of a few attribute reads per tensor: the op, the global
state the fake key holds (default dtype and device, inference mode, a proxy tracer), and per tensor its dtype,
shape, strides, device, storage offset and size, ``requires_grad``, conj/neg/inference/quantized bits. Anything
else (a SymInt, a function, a real tensor, a sparse one) goes the usual way. The first time a key is met the op
runs through the fake mode as usual, and its own cache entry for those arguments (computed by its own rules,
including whatever it declines to cache) is remembered under the cheaper key; later calls build their output from
that entry with the fake mode's own ``_output_from_cache_entry``, exactly what its cache hit does.

The key holds everything the fake key holds but one thing: for an op that neither views nor writes its arguments
(``mul``, ``matmul``, not ``select`` or ``add_``), where each tensor lies in its storage (offset, storage size) is
left out, since such an op's outputs are fresh tensors shaped from sizes, strides and dtypes. The fake key holds
it, so that a loop over a sequence (Mamba's scan: ``deltaA[:, :, i]`` times the state, for every ``i``) misses the
fake cache at every step and the first block of a new shape cost three times the second; here it hits.

Where this torch lacks the internals named here (older or newer releases), every op runs the usual way.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

_ENTRIES: dict[tuple[Any, ...], Any] = {}
_DECLINED = object()
"""The fake mode does not cache these arguments (an op it answers directly, a data-dependent one): run it."""
MAX_ENTRIES = 1 << 18
"""Entries kept before the cache starts afresh (a long ``--fit`` or sweep session stays bounded)."""
_SCALARS = (int, float, bool, complex, str)
_OUTPUT_ARGUMENTS = ["state", "entry", "key", "func", "args"]


class _UncachableError(Exception):
    """An argument the cheap key does not describe: the op goes the usual way."""


@dataclass(frozen=True)
class _Torch:
    """This torch's fake-tensor cache internals that ``cached_call`` relies on."""

    fake_tensor: type
    fake_mode: type
    bypass: type[Exception]
    key_state: type
    valid_entry: type
    fake_key: Any
    proxy_key: Any
    plain: tuple[type, ...]
    """Argument types that stand for themselves in a key (dtype, device, layout, memory format)."""
    strided: Any


@functools.cache
def _torch() -> _Torch | None:
    try:
        import torch
        from torch._subclasses import fake_tensor
    except ImportError:
        return None
    mode = getattr(fake_tensor, "FakeTensorMode", None)
    names = ("FakeTensor", "_BypassDispatchCache", "_CacheKeyState", "_DispatchCacheValidEntry")
    keys = getattr(torch._C, "_TorchDispatchModeKey", None)
    needed = ("_cache_key", "_output_from_cache_entry", "cache")
    if mode is None or keys is None or not all(hasattr(mode, n) for n in needed):
        return None
    if not all(hasattr(fake_tensor, n) for n in names) or not hasattr(keys, "PROXY"):
        return None
    # The calls made below, as this torch spells them (another release may take other arguments).
    signatures = {"_cache_key": ["state", "func", "args", "kwargs"], "_output_from_cache_entry": _OUTPUT_ARGUMENTS}
    for name, expected in signatures.items():
        if list(inspect.signature(getattr(mode, name)).parameters)[1:] != expected:
            return None
    fake, bypass, key_state, valid_entry = (getattr(fake_tensor, n) for n in names)
    return _Torch(
        fake,
        mode,
        bypass,
        key_state,
        valid_entry,
        keys.FAKE,
        keys.PROXY,
        (torch.dtype, torch.device, torch.layout, torch.memory_format),
        torch.strided,
    )


@functools.cache
def _where_free(func: Any) -> bool:
    """Whether ``func``'s outputs are independent of where its tensor arguments lie in their storages: an op that
    neither views nor writes an argument makes fresh outputs from the arguments' sizes, strides and dtypes (a
    storage offset or size matters only to a view of it or a write into it)."""
    try:
        return not func.is_view and not func._schema.is_mutable
    except AttributeError:
        return False


def _append(value: Any, mode: Any, internals: _Torch, key: list[Any], where: bool) -> None:
    """``value`` as key parts; ``where``: a tensor's storage offset and size too."""
    kind = type(value)
    if kind is internals.fake_tensor:
        if value.fake_mode is not mode or value.constant is not None or value.layout is not internals.strided:
            raise _UncachableError
        key.append(
            (
                value.dtype,
                value.shape,
                value.stride(),
                value.fake_device,
                value.storage_offset() if where else None,
                value.untyped_storage().nbytes() if where else None,
                value.requires_grad,
                value.is_conj(),
                value.is_neg(),
                value.is_inference(),
                value.is_quantized,
            )
        )
    elif value is None or kind in _SCALARS:
        key.append((kind, value))  # the type too: 1, 1.0 and True hash alike but give other dtypes
    elif kind is list or kind is tuple:
        key.append((kind, len(value)))
        for item in value:
            _append(item, mode, internals, key, where)
    elif kind in internals.plain:
        key.append(value)
    else:
        raise _UncachableError


def cached_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` under the active fake mode, its output built from the fake cache's own entry when
    these arguments were met before (see the module's docstring)."""
    internals = _torch()
    if internals is None:
        return func(*args, **kwargs)
    import torch

    mode = torch._C._get_dispatch_mode(internals.fake_key)
    if mode is None or mode.shape_env is not None or not getattr(mode, "cache_enabled", False):
        return func(*args, **kwargs)
    key: list[Any] = [
        func,
        torch.get_default_dtype(),
        torch._C._get_default_device(),
        torch.is_inference_mode_enabled(),
        torch._C._get_dispatch_mode(internals.proxy_key) is not None,
    ]
    where = not _where_free(func)
    try:
        for value in args:
            _append(value, mode, internals, key, where)
        for name, value in kwargs.items():
            key.append(name)
            _append(value, mode, internals, key, where)
    except _UncachableError:
        return func(*args, **kwargs)
    found = tuple(key)
    entry = _ENTRIES.get(found)
    if entry is _DECLINED:
        return func(*args, **kwargs)
    if entry is not None:
        state, cached, theirs = entry
        return mode._output_from_cache_entry(state, cached, theirs, func, args)
    # First met: the fake mode's own key, taken before the op runs (an in-place op may change its arguments).
    state = internals.key_state(mode.shape_env)
    try:
        theirs = mode._cache_key(state, func, args, kwargs)
    except internals.bypass:
        theirs = None
    out = func(*args, **kwargs)
    cached = internals.fake_mode.cache.get(theirs) if theirs is not None else None  # type: ignore[attr-defined]
    if len(_ENTRIES) >= MAX_ENTRIES:
        _ENTRIES.clear()
    usable = isinstance(cached, internals.valid_entry) and not state.known_symbols
    _ENTRIES[found] = (state, cached, theirs) if usable else _DECLINED
    return out
