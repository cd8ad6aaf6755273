"""Keep autocast on for what an op calls from inside its kernel, as it is without the tracer.

A Python dispatch mode's ``__torch_dispatch__`` runs with every dispatch key above Python excluded, autocast's
included, so the ops a kernel calls from inside (``affine_grid_generator``'s ``bmm``, ``_trilinear``'s products,
the nested-tensor fast path of ``TransformerEncoder``) ran in float32 under tracing where the plain run casts them
to bf16/fp16: other losses traced than plain (issue 30.1). Autocast casts an op's inputs only where it has a rule
for it (``mm``, ``conv2d``, ``layer_norm``) and otherwise falls through to the kernel with autocast still on, so an
op with no rule of its own is run with autocast's keys restored to what they were when the op was called
(torch's own snapshot of the dispatch state at entry): its kernel's inner calls meet autocast exactly as plainly.
An op with a rule needs nothing: autocast's wrapper turns itself off around the kernel in the plain run too.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

_AUTOCAST_KEYS = ("AutocastCPU", "AutocastCUDA", "AutocastXPU", "AutocastMPS")


@functools.cache
def _keys() -> tuple[Any, ...]:
    import torch

    return tuple(getattr(torch._C.DispatchKey, name) for name in _AUTOCAST_KEYS if hasattr(torch._C.DispatchKey, name))


@functools.cache
def falls_through(func: Any) -> tuple[Any, ...]:
    """The autocast keys ``func`` has no kernel of its own for: there autocast passes it on, still on."""
    import torch

    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    try:
        name = func.name()  # aten::mul.Tensor: the overload, as the dispatcher registers it
        return tuple(key for key in _keys() if not has_kernel(name, key))
    except (AttributeError, RuntimeError):  # not a dispatcher op (a higher-order op): left as it was
        return ()


class AutocastInside:
    """``run(func, args, kwargs)`` calls ``func`` as the plain run would, as far as autocast goes.

    ``maybe`` says whether autocast can be on at all: it is when tracing begins (``install``), or once the traced
    code has turned it on (``torch.set_autocast_enabled``, which every ``torch.autocast`` context calls); until then
    ``run`` is not needed and the tracer calls ``func`` directly (torch's snapshot costs about a microsecond an op)."""

    def __init__(self) -> None:
        import torch

        self.maybe = False
        self.on_change: Any = None
        """Told when ``maybe`` turns on (the C++ per-op path then leaves every op to the Python mode)."""
        self._snapshot = getattr(torch._C, "_RestorePythonTLSSnapshot", None)
        self._set_excluded = getattr(torch._C, "_SetExcludeDispatchKeyGuard", None)
        self._is_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded

    def install(self) -> list[tuple[Any, str, Any]]:
        """Watch for autocast being turned on; (owner, name, original) to put back when tracing ends."""
        import torch

        if self._snapshot is None or self._set_excluded is None:  # older torch: nothing to restore with
            return []
        self.maybe = any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda"))
        original = torch.set_autocast_enabled

        def set_autocast_enabled(*args: Any) -> None:
            if args and args[-1] is True:
                self.maybe = True
                if self.on_change is not None:
                    self.on_change()
            original(*args)

        torch.set_autocast_enabled = set_autocast_enabled  # type: ignore[assignment]
        return [(torch, "set_autocast_enabled", original)]

    def run(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        keys = falls_through(func)
        if not keys:
            return func(*args, **kwargs)
        assert self._snapshot is not None
        assert self._set_excluded is not None
        is_excluded = self._is_excluded
        with self._snapshot():
            on = [key for key in keys if not is_excluded(key)]
        if not on:
            return func(*args, **kwargs)
        with contextlib.ExitStack() as stack:
            for key in on:
                stack.enter_context(self._set_excluded(key, False))
            return func(*args, **kwargs)
