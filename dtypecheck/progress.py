"""The progress protocol the core reports through; only the CLI decides whether anything is drawn."""

from __future__ import annotations

from collections.abc import Callable

ProgressCallback = Callable[[int, int, str], None]
"""``(done, total, what)``: units are the caller's (bytes, tensors, ops); ``total`` may grow."""


def no_progress(done: int, total: int, what: str) -> None:
    """The default sink: the core never needs to know whether anyone is watching."""
