"""Which module is running: a stack kept by global forward pre/post hooks, with dotted paths inside the model."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.hooks import RemovableHandle


class ModuleStack:
    """The modules whose ``forward`` is running, innermost last, each with its path inside the outermost one.

    Global hooks see every module, including those the user builds inside the traced code, without needing
    the root model; the path of a child is found among its parent's registered children (cached by identity).
    The outermost module is the model itself, path ``""``.
    """

    def __init__(
        self,
        names: dict[int, str] | None = None,
        *,
        on_root: Callable[[nn.Module], None] | None = None,
        on_raise: Callable[[nn.Module, str, Any, BaseException], None] | None = None,
    ) -> None:
        self._names = names or {}
        self._on_root = on_root
        """Told when an outermost module starts running (the dtype watch reads its parameters' dtype)."""
        self._on_raise = on_raise
        """Told when a module's forward is left by an exception, innermost module first."""
        """Known paths by ``id(module)`` (factory mode knows the model)."""
        self._stack: list[tuple[nn.Module, str]] = []
        self._child_names: dict[tuple[int, int], str] = {}
        self._handles: list[RemovableHandle] = []
        self.on_change: Callable[[str | None], None] | None = None
        """Told the module on top (``current``) when it changes: the C++ per-op path keeps it."""
        self._roots: dict[int, nn.Module] = {}
        """Outermost modules seen running, to name the parameter an optimizer op updates. Held until tracing
        ends: a script's model dies with its globals before the last read-back."""

    @property
    def current(self) -> str | None:
        return self._stack[-1][1] if self._stack else None

    @property
    def current_module(self) -> nn.Module | None:
        return self._stack[-1][0] if self._stack else None

    @property
    def root(self) -> nn.Module | None:
        return self._stack[0][0] if self._stack else None

    def _path_of(self, module: nn.Module) -> str:
        known = self._names.get(id(module))
        if known is not None:
            return known
        if not self._stack:
            return ""
        parent, parent_path = self._stack[-1]
        key = (id(parent), id(module))
        name = self._child_names.get(key)
        if name is None:
            # A direct child, else a descendant reached through a container that is not called itself
            # (``self.layers = ModuleList(...)``, as every HF model has): its dotted path.
            name = next((n for n, child in parent.named_children() if child is module), None)
            if name is None:
                name = next((n for n, child in parent.named_modules() if child is module and n), None)
            if name is None:
                # Called from its parent without being registered in it (kept in a plain list, say).
                name = f"<{type(module).__name__}>"
            self._child_names[key] = name
        return f"{parent_path}.{name}" if parent_path else name

    def _enter(self, module: nn.Module, args: Any) -> None:
        if not self._stack:
            self._roots.setdefault(id(module), module)
            if self._on_root is not None:
                self._on_root(module)
        path = self._path_of(module)
        self._stack.append((module, path))
        if self.on_change is not None:
            self.on_change(path)

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._on_raise is not None:
            # always_call hooks run inside torch's ``except`` when the forward raised: the exception is in flight.
            raised = sys.exc_info()[1]
            if raised is not None and self._stack and self._stack[-1][0] is module:
                self._on_raise(module, self._stack[-1][1], args, raised)
        # Pop down to this module: a forward that raised skips nothing (always_call), but be robust anyway.
        stack = self._stack
        while stack:
            top, _ = stack.pop()
            if top is module:
                break
        if self.on_change is not None:
            self.on_change(stack[-1][1] if stack else None)

    def owner_of(self, tensor: torch.Tensor) -> str | None:
        """The path of the module whose parameter or buffer ``tensor`` is (or views), else None.

        Only asked for reported events outside any forward (the optimizer step), so a full walk is affordable.
        """
        import torch

        from dtypecheck.nantrace.records import plain

        try:
            address = plain(tensor).untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # no storage of its own: no parameter's
            return None
        for root in list(self._roots.values()):
            for name, value in (*root.named_parameters(), *root.named_buffers()):
                if value.layout is torch.strided and plain(value).untyped_storage().data_ptr() == address:
                    module_path = name.rpartition(".")[0]
                    known = self._names.get(id(root))
                    return f"{known}.{module_path}".strip(".") if known else module_path
        return None

    def install(self) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._handles.append(register_module_forward_pre_hook(self._enter))
        self._handles.append(register_module_forward_hook(self._exit, always_call=True))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stack.clear()
        self._roots.clear()
