"""What the run keeps from step to step outside the three per-step checks: every live ``nn.Module``'s parameters
and buffers (the model's buffers, an EMA or ``AveragedModel`` copy, a teacher), less what an optimizer updates
(checked after its update already).

A NaN written into an EMA copy between two steps (issue 30.3) is in none of the loss, the gradients or the update,
so watch mode used to pass it. Modules are found as they are made (``nn.Module.__init__``) or copied
(``copy.deepcopy`` goes through ``__setstate__``) while watching, and the model watch mode is given. Modules made
before watching began are not searched for (the process may hold others' modules, a diverged one among them).
Tensors kept outside any module or optimizer (a plain dict of EMA tensors) are not watched; the report says so.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dtypecheck.nantrace.records import readable
from dtypecheck.nantrace.watch.state import Flag, all_finite

if TYPE_CHECKING:
    import torch
    from torch import nn

NOT_WATCHED = (
    "tensors kept outside every module and optimizer (a plain list or dict of tensors), and modules made before "
    "watching began other than the model, are not watched"
)


class HeldModules:
    """The live modules; ``flags(skip)`` checks their tensors (those in ``skip`` aside) without a host sync."""

    def __init__(self) -> None:
        self._modules: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self._made = 0
        """Modules made or copied since watching began: the cached tensor list is rebuilt when it changes."""
        self._built_at = -1
        self._skip_ids: frozenset[int] = frozenset()
        self._tensors: list[torch.Tensor] = []

    def install(self, patch: Callable[[Any, str, Callable[[Any], Any]], None], model: nn.Module | None) -> None:
        """Hold ``model`` and every module made or copied from now on (``patch(owner, name, make)``)."""
        from torch import nn

        held = self

        def wrap(original: Any) -> Any:
            def method(module: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(module, *args, **kwargs)
                held._modules.add(module)
                held._made += 1
                return result

            return method

        patch(nn.Module, "__init__", wrap)
        patch(nn.Module, "__setstate__", wrap)
        if model is not None:
            self._modules.add(model)
        self._made += 1

    def add(self, module: nn.Module) -> None:
        """Hold a module found otherwise (one the watch sees called outermost)."""
        if module not in self._modules:
            self._modules.add(module)
            self._made += 1

    def flag(self, skip: frozenset[int]) -> Flag:
        """Whether every held tensor is finite, as ``all_finite`` answers (an on-device flag is read with
        ``read_flags``)."""
        if self._built_at != self._made or skip is not self._skip_ids:
            self._build(skip)
        return all_finite(self._tensors) if self._tensors else None

    def _build(self, skip: frozenset[int]) -> None:
        self._built_at, self._skip_ids = self._made, skip
        seen: set[int] = set(skip)
        self._tensors = []
        for module in list(self._modules):
            for tensor in (*module._parameters.values(), *module._buffers.values()):
                if tensor is None or id(tensor) in seen or not tensor.is_floating_point() or not tensor.numel():
                    continue
                seen.add(id(tensor))
                self._tensors.append(tensor)  # all_finite writes nothing: saved-for-backward ones are safe too

    def nonfinite_names(self, skip: frozenset[int]) -> list[str]:
        """``Class.dotted.name`` of each non-finite held tensor, outermost modules first (only once found)."""
        import torch

        modules = list(self._modules)
        inner = {id(child) for module in modules for child in module.modules() if child is not module}
        names: list[str] = []
        seen: set[int] = set(skip)
        for top in (m for m in modules if id(m) not in inner):
            for name, tensor in (*top.named_parameters(), *top.named_buffers()):
                if id(tensor) in seen or not tensor.is_floating_point() or not readable(tensor, storage_less=True):
                    continue
                seen.add(id(tensor))
                with torch.no_grad():
                    if not bool(tensor.isfinite().all()):
                        names.append(f"{type(top).__name__}.{name}")
        return names
