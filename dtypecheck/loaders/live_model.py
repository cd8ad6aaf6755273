"""A live model, ``path/to/file.py:factory``: the user's own code builds an ``nn.Module`` whose parameters and
buffers are scanned in memory.

This runs the user's file on purpose (it is their script, not a downloaded checkpoint). Errors raised by their
code become ``UserCodeError`` carrying only their own traceback frames.
"""

from __future__ import annotations

import contextlib
import runpy
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dtypecheck.errors import InputError, UserCodeError
from dtypecheck.loaders.base import Checkpoint, Finding, TensorRecord
from dtypecheck.loaders.mapped import EMPTY_SOURCE, LiveSource


def _user_traceback(exc: BaseException, user_file: Path) -> str:
    """The traceback of ``exc`` keeping only frames from the user's files (not dtypecheck's, runpy's or torch's)."""
    machinery = (str(Path(__file__).resolve().parents[1]), str(Path(runpy.__file__).resolve()))
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith(machinery) and "importlib" not in frame.filename
    ]
    if not frames:
        frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == str(user_file)]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
    lines.extend(traceback.format_exception_only(type(exc), exc))
    return "".join(lines)


def _run_path(user_file: Path) -> dict[str, Any]:
    """Run the file as ``python file.py`` would see it (its folder importable), without its ``__main__`` block."""
    folder = str(user_file.resolve().parent)
    sys.path.insert(0, folder)
    try:
        return runpy.run_path(str(user_file), run_name="__dtypecheck__")
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


def _run_user_code(user_file: Path, what: str, action: Any) -> Any:
    try:
        return action()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        summary = f"{user_file}: {what} raised {type(exc).__name__}: {exc}"
        raise UserCodeError(summary, _user_traceback(exc, user_file)) from exc


def open_live_model(user_file: Path, factory_name: str | None, target: str) -> Checkpoint:
    import torch

    if factory_name is None:
        raise InputError(f"{target}: name the factory that builds the model, e.g. {user_file}:build_model")
    namespace = _run_user_code(user_file, "the file", lambda: _run_path(user_file))
    factory = namespace.get(factory_name)
    if factory is None:
        raise InputError(f"{target}: {user_file} defines no {factory_name!r}")
    if not callable(factory):
        raise InputError(f"{target}: {factory_name!r} is not callable")
    model = _run_user_code(user_file, f"{factory_name}()", factory)
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
