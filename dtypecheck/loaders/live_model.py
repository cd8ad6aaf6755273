"""A live model, ``path/to/file.py:factory``: the user's own code builds an ``nn.Module`` whose parameters and
buffers are scanned in memory.

This runs the user's file on purpose (it is their script, not a downloaded checkpoint). Errors raised by their
code become ``UserCodeError`` carrying only their own traceback frames.
"""

from __future__ import annotations

import contextlib
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dtypecheck.errors import InputError
from dtypecheck.loaders.base import Checkpoint, Finding, TensorRecord
from dtypecheck.loaders.mapped import EMPTY_SOURCE, LiveSource
from dtypecheck.usercode import call_user


def _run_path(user_file: Path) -> dict[str, Any]:
    """Run the file as ``python file.py`` would see it (its folder importable), without its ``__main__`` block."""
    folder = str(user_file.resolve().parent)
    sys.path.insert(0, folder)
    try:
        return runpy.run_path(str(user_file), run_name="__dtypecheck__")
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


def open_live_model(user_file: Path, factory_name: str | None, target: str) -> Checkpoint:
    import torch

    if factory_name is None:
        raise InputError(f"{target}: name the factory that builds the model, e.g. {user_file}:build_model")
    namespace = call_user(lambda: _run_path(user_file), f"{user_file}: the file", user_file)
    factory = namespace.get(factory_name)
    if factory is None:
        raise InputError(f"{target}: {user_file} defines no {factory_name!r}")
    if not callable(factory):
        raise InputError(f"{target}: {factory_name!r} is not callable")
    model = call_user(factory, f"{user_file}: {factory_name}()", user_file)
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"{target}: {factory_name}() returned {type(model).__name__}, not a torch.nn.Module")
    return LiveModelCheckpoint(target, model)


class LiveModelCheckpoint:
    format = "live-model"

    def __init__(self, source: str, model: Any) -> None:
        self.source = source
        self.findings: list[Finding] = []
        self._model = model

    def records(self) -> Iterator[TensorRecord]:
        named = [*self._model.named_parameters(), *self._model.named_buffers()]
        for name, tensor in named:
            dtype = str(tensor.dtype).removeprefix("torch.")
            shape = tuple(tensor.shape)
            nbytes = tensor.numel() * tensor.element_size()
            source = None if tensor.is_meta else LiveSource(tensor) if tensor.numel() else EMPTY_SOURCE
            yield TensorRecord(name, dtype, shape, nbytes, source, saved_device=str(tensor.device))

    def parts(self) -> list[Checkpoint]:
        return [self]

    def close(self) -> None:
        self._model = None
