"""DataLoader workers under tracing: a NaN/Inf born in ``Dataset.__getitem__``, a transform or ``collate_fn`` is
named at the worker's own line, not at the line in the main process that consumed the batch.

A worker forked by the DataLoader inherits the tracer, its dispatch mode still on: the worker's ops are checked
there. After each batch it fetched, the worker judges its ops; when the batch holds a non-finite value, it writes
the first producer it found (with its worker id and the batch's place) into a folder the main process reads when
its report is made. There the main process's own producer, an ``input`` that arrived with the data, is replaced by
the worker's event, the consuming line kept as ``arrival``. Workers started by spawn or forkserver import
nothing of the tracer: their ``worker_init_fn`` is wrapped (``tracer.TracedWorkerInit``) to start one there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtypecheck.nantrace.ops import tensors_in
from dtypecheck.nantrace.report import Event

if TYPE_CHECKING:
    from dtypecheck.nantrace.hooks import TracerHooks

_FETCHERS = ("_MapDatasetFetcher", "_IterableDatasetFetcher")


def _nonfinite(batch: Any) -> bool:
    import torch

    return any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors_in(batch))


class WorkerWatch:
    """Wraps the DataLoader's fetchers while tracing; ``collected()`` is what the workers found."""

    def __init__(
        self,
        tracer: TracerHooks,
        *,
        worker_init: Callable[[Any, Path, int], Any] | None = None,
        folder: Path | None = None,
        origin: int | None = None,
    ) -> None:
        self.tracer = tracer
        self._worker_init = worker_init
        """Builds a spawned worker's ``worker_init_fn`` (``tracer.TracedWorkerInit``), None: spawned ones untraced."""
        self.folder = folder or Path(tempfile.gettempdir()) / f"dtypecheck-nantrace-{os.getpid()}-{id(self)}"
        self._origin = os.getpid() if origin is None else origin
        """The traced process: it collects; any other process (a worker) hands over."""
        self._restore: list[tuple[Any, str, Any]] = []
        self._fetches = 0
        self._sent = 0

    def install(self) -> None:
        try:
            from torch.utils.data._utils import fetch
        except ImportError:  # a torch without the private module: workers stay untraced
            return
        watch = self
        for name in _FETCHERS:
            fetcher = getattr(fetch, name, None)
            if fetcher is None:
                continue
            original = fetcher.fetch

            def traced_fetch(self: Any, index: Any, _original: Any = original) -> Any:
                batch = _original(self, index)
                watch.fetched(batch)
                return batch

            self._restore.append((fetcher, "fetch", original))
            fetcher.fetch = traced_fetch
        from torch.utils.data import DataLoader

        get_iterator = DataLoader._get_iterator

        def traced_iterator(loader: Any) -> Any:
            context = loader.multiprocessing_context
            method = context.get_start_method() if context is not None else _default_start_method()
            wrap = watch._worker_init
            if wrap is None or loader.num_workers == 0 or method == "fork" or os.getpid() != watch._origin:
                return get_iterator(loader)
            user_init = loader.worker_init_fn
            loader.worker_init_fn = wrap(user_init, watch.folder, watch._origin)
            try:
                return get_iterator(loader)
            finally:
                loader.worker_init_fn = user_init

        self._restore.append((DataLoader, "_get_iterator", get_iterator))
        DataLoader._get_iterator = traced_iterator  # type: ignore[method-assign,assignment]

    def remove(self) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    def fetched(self, batch: Any) -> None:
        """In a worker: judge what making ``batch`` ran; hand its first producer over when the batch is not finite."""
        if os.getpid() == self._origin or self.tracer.stopped:
            return
        from torch.utils.data import get_worker_info

        from dtypecheck.nantrace.training import untraced

        info = get_worker_info()
        if info is None:
            return
        place = self._fetches * info.num_workers + info.id  # batches go to the workers in turn
        self._fetches += 1
        with untraced():
            self.tracer.judge_now()
            producers = self.tracer.judge.taint.producers
            found, self._sent = producers[self._sent :], len(producers)
            if not found or not _nonfinite(batch):
                return
            event = dataclasses.replace(found[0].event, worker=info.id, batch=place)
        self.folder.mkdir(exist_ok=True)
        target = self.folder / f"{place:09d}-{info.id}.pickle"
        partial = target.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(event))
        partial.replace(target)

    def collected(self) -> list[Event]:
        """In the main process: the workers' events, in batch order (the folder is removed)."""
        if os.getpid() != self._origin or not self.folder.is_dir():
            return []
        events = []
        for path in sorted(self.folder.glob("*.pickle")):
            with contextlib.suppress(OSError, pickle.UnpicklingError, EOFError):
                events.append(pickle.loads(path.read_bytes()))
        shutil.rmtree(self.folder, ignore_errors=True)
        return events


def _default_start_method() -> str | None:
    import multiprocessing

    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method()


def merge_workers(events: tuple[Event, ...], found: list[Event]) -> tuple[Event, ...]:
    """The main process's first producer, when it is data that arrived (``input``) and a worker found where that
    data went non-finite, becomes the worker's event; the consuming line is kept as its ``arrival``."""
    if not events or not found or events[0].cause != "input" or events[0].phase == "backward":
        return events
    arrived, born = events[0], found[0]
    merged = dataclasses.replace(
        born,
        level=arrived.level,
        consequence=arrived.consequence,
        step=arrived.step,
        op_index=arrived.op_index,
        history=arrived.history,
        rank=arrived.rank,
        arrival=arrived.location,
    )
    return (merged, *events[1:])
