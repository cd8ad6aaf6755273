"""How small integer and boolean tensors of values the trace does not know were computed, so that their values can be
worked out once the trace takes the values they came from as known: Idefics3 counts its real images
(``real_images_inds.sum()``, unknown: the images are zeros standing for data) before it indexes with the mask, which
the tracer then takes as all true, and reads the count with ``.tolist()`` after."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    Known = Callable[[torch.Tensor], "torch.Tensor | None"]

RECIPE_LIMIT = 1 << 12
"""Outputs of at most this many elements get a recipe: counts and masks of a few images or experts, not the
per-token tensors of a long sequence (replaying those would cost what the fake mode saves)."""


class _Step:
    """One op: its function, its arguments with each tensor replaced by a value known when the op ran, a step,
    or a weak reference to a tensor of unknown origin (which may become known later), its output, weakly, and
    which of its outputs that is (``unbind``'s, ``split``'s), or None for its only one."""

    __slots__ = ("args", "func", "item", "kwargs", "out")

    def __init__(self, func: Any, args: Any, kwargs: Any, out: torch.Tensor, item: int | None) -> None:
        self.func, self.args, self.kwargs, self.item = func, args, kwargs, item
        self.out = weakref.ref(out)


class _Unknown:
    """A tensor of unknown values and origin, by weak reference: known later or never."""

    __slots__ = ("ref",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.ref = weakref.ref(tensor)


class _Known:
    __slots__ = ("value",)

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class Recipes:
    """The steps that made unknown small integer and boolean tensors, by output tensor (an entry goes with it).
    Holding no fake tensor alive (weak references, and the real values that were known), they leave the memory
    the trace counts as it was."""

    def __init__(self) -> None:
        self._steps: dict[int, _Step] = {}

    def record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, known: Known) -> None:
        """Remember how ``out`` (a small integer or boolean tensor, or a list of them) was made; ``known(t)`` is
        ``t``'s real value or None."""
        import torch

        outs = list(enumerate(out)) if isinstance(out, list | tuple) else [(None, out)]
        if func._schema.is_mutable or not outs:
            return
        for _, tensor in outs:
            if not isinstance(tensor, torch.Tensor) or tensor.numel() > RECIPE_LIMIT:
                return
            if tensor.is_floating_point() or tensor.is_complex():
                return

        def node(value: Any) -> Any:
            if isinstance(value, list | tuple):
                return type(value)(node(v) for v in value)
            if not isinstance(value, torch.Tensor):
                return value
            real = known(value)
            if real is not None:
                return _Known(real)
            step = self._steps.get(id(value))
            return step if step is not None and step.out() is value else _Unknown(value)

        made_of, named = node(args), {k: node(v) for k, v in kwargs.items()}
        for item, tensor in outs:
            key = id(tensor)
            step = _Step(func, made_of, named, tensor, item)
            step.out = weakref.ref(tensor, lambda _ref, key=key: self._steps.pop(key, None))  # type: ignore[misc]
            self._steps[key] = step

    def forget(self, tensor: torch.Tensor) -> None:
        """``tensor`` was written in place: how it was made no longer says what it holds."""
        step = self._steps.get(id(tensor))
        if step is not None and step.out() is tensor:
            del self._steps[id(tensor)]

    def replay(self, tensor: torch.Tensor, known: Known) -> torch.Tensor | None:
        """``tensor``'s real value from its recipe, where every tensor it started from is known now; else None."""
        step = self._steps.get(id(tensor))
        if step is None or step.out() is not tensor:
            return None
        value: torch.Tensor | None = self._value(step, known, depth=0)
        return value

    def _value(self, node: Any, known: Known, depth: int) -> Any:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        if depth > 64:  # a long chain is a sequence's own computation, not a count
            return None
        if isinstance(node, _Known):
            return node.value
        if isinstance(node, _Unknown):
            tensor = node.ref()
            return None if tensor is None else known(tensor)
        tensor = node.out()
        if tensor is not None and (real := known(tensor)) is not None:
            return real
        args = self._values(node.args, known, depth)
        kwargs = {k: self._values(v, known, depth) for k, v in node.kwargs.items()}
        if args is None or any(v is None and node.kwargs[k] is not None for k, v in kwargs.items()):
            return None
        with unset_fake_temporarily():
            made = node.func(*args, **kwargs)
        return made if node.item is None else made[node.item]

    def _values(self, value: Any, known: Known, depth: int) -> Any:
        if isinstance(value, list | tuple):
            found = [self._values(v, known, depth) for v in value]
            missing = any(f is None and v is not None for f, v in zip(found, value, strict=True))
            return None if missing else type(value)(found)
        if isinstance(value, _Step | _Known | _Unknown):
            return self._value(value, known, depth + 1)
        return value
