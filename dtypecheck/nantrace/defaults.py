"""Who changed ``torch.get_default_dtype()``: the setters are wrapped for the duration of the trace."""

from __future__ import annotations

from typing import Any

from dtypecheck.nantrace.frames import FrameFinder, FrameKey, location_of
from dtypecheck.nantrace.report import DefaultDtype, DefaultDtypeChange

_SETTERS = ("set_default_dtype", "set_default_tensor_type")


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


class DefaultDtypeWatch:
    """Wraps ``torch.set_default_dtype`` and ``torch.set_default_tensor_type`` while installed and records each
    call that changed the default with the user's line. ``remove()`` puts the originals back (and, when asked,
    the default dtype tracing began with: a script run in-process must not leave float64 behind for the caller).
    """

    def __init__(self, frames: FrameFinder, *, restore_default: bool) -> None:
        self._frames = frames
        self._restore_default = restore_default
        self._saved: list[tuple[str, Any]] = []
        self._changes: list[tuple[str, str, str, FrameKey | None]] = []
        self._start = "float32"
        self._end: str | None = None

    def install(self) -> None:
        import torch

        self._start = dtype_name(torch.get_default_dtype())
        for name in _SETTERS:
            original = getattr(torch, name, None)
            if original is not None:
                self._saved.append((name, original))
                setattr(torch, name, self._wrap(name, original))

    def _wrap(self, name: str, original: Any) -> Any:
        import torch

        watch = self

        def set_default(*args: Any, **kwargs: Any) -> Any:
            old = torch.get_default_dtype()
            result = original(*args, **kwargs)
            new = torch.get_default_dtype()
            if new != old:
                frame = watch._frames.user_frame()
                watch._changes.append((dtype_name(old), dtype_name(new), f"torch.{name}", frame))
            return result

        set_default.__name__ = name
        set_default.__doc__ = original.__doc__
        set_default.__wrapped__ = original  # type: ignore[attr-defined]
        return set_default

    def remove(self) -> None:
        import torch

        self._end = dtype_name(torch.get_default_dtype())
        for name, original in reversed(self._saved):
            setattr(torch, name, original)
        self._saved.clear()
        if self._restore_default and self._end != self._start:
            torch.set_default_dtype(getattr(torch, self._start))

    def result(self) -> DefaultDtype:
        import torch

        end = self._end if self._end is not None else dtype_name(torch.get_default_dtype())
        changes = [DefaultDtypeChange(old, new, call, location_of(frame)) for old, new, call, frame in self._changes]
        last = changes[-1].new if changes else self._start
        if end != last:
            # Changed through a reference taken before tracing began (``from torch import set_default_dtype``
            # in an imported module): the change is real, its line unknown.
            changes.append(DefaultDtypeChange(last, end, "unknown", None))
        return DefaultDtype(start=self._start, end=end, changes=tuple(changes))
