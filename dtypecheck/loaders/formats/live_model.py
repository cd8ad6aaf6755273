"""A live model, ``path/to/file.py:factory``: the user's own code builds an ``nn.Module`` whose parameters and
buffers are scanned in memory.

This runs the user's file on purpose (it is their script, not a downloaded checkpoint), through
``usercode.load_factory``, so the factory may return any of ``usercode.FACTORY_FORMS`` as in the other commands
(the inputs and loss function are not needed to scan weights). Errors raised by their code become
``UserCodeError`` carrying only their own traceback frames.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dtypecheck.loaders._io.mapped import EMPTY_SOURCE, LiveSource
from dtypecheck.loaders.base import Checkpoint, Finding, TensorRecord
from dtypecheck.usercode import call_user, load_factory


def open_live_model(target: str) -> Checkpoint:
    """Run ``file.py``, call its factory, and scan the model it built."""
    made = load_factory(target)
    return LiveModelCheckpoint(target, made.model, made.file)


class LiveModelCheckpoint:
    format = "live-model"

    def __init__(self, source: str, model: Any, user_file: Path | None = None) -> None:
        self.source = source
        self.findings: list[Finding] = []
        self._model = model
        # The module's own methods are the user's code too (a ``parameters()`` that raises): listed once, now.
        model_of = self._model
        file = user_file or Path(source.rpartition(":")[0])
        self._named: list[tuple[str, Any]] = call_user(
            lambda: [*model_of.named_parameters(), *model_of.named_buffers()],
            f"{file}: the model's named_parameters()/named_buffers()",
            file,
        )

    def records(self) -> Iterator[TensorRecord]:
        for name, tensor in self._named:
            dtype = str(tensor.dtype).removeprefix("torch.")
            shape = tuple(tensor.shape)
            nbytes = tensor.numel() * tensor.element_size()
            source = None if tensor.is_meta else LiveSource(tensor) if tensor.numel() else EMPTY_SOURCE
            yield TensorRecord(name, dtype, shape, nbytes, source, saved_device=str(tensor.device))

    def parts(self) -> list[Checkpoint]:
        return [self]

    def close(self) -> None:
        self._model = None
        self._named = []
