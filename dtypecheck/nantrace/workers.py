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


def nonfinite_batch(batch: Any) -> bool:
    import torch

    return any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors_in(batch))


class FetchWatch:
    """Wraps the DataLoader's fetchers (``fetch``: what to do around each batch a worker makes); ``collected()``
    is what the workers handed over. ``WorkerWatch`` traces the workers fully, watch mode's ``WorkerReplay``
    checks each batch and traces only the making of a non-finite one again."""

    def __init__(
        self,
        *,
        worker_init: Callable[[Any, Path, int], Any] | None = None,
        folder: Path | None = None,
        origin: int | None = None,
    ) -> None:
        self._worker_init = worker_init
        """Builds a spawned worker's ``worker_init_fn`` (``tracer.TracedWorkerInit``), None: spawned ones untraced."""
        self.folder = folder or Path(tempfile.gettempdir()) / f"dtypecheck-nantrace-{os.getpid()}-{id(self)}"
        self._origin = os.getpid() if origin is None else origin
        """The traced process: it collects; any other process (a worker) hands over."""
        self._restore: list[tuple[Any, str, Any]] = []
        self._fetches = 0

    def fetch(self, fetcher: Any, index: Any, original: Callable[[Any, Any], Any]) -> Any:
        raise NotImplementedError

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
                return watch.fetch(self, index, _original)

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

    def place(self) -> tuple[int, int] | None:
        """In a worker: (its id, the place of the batch it is making now); None in the traced process."""
        if os.getpid() == self._origin:
            return None
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is None:
            return None
        place = self._fetches * info.num_workers + info.id  # batches go to the workers in turn
        self._fetches += 1
        return info.id, place

    def hand_over(self, event: Event, worker: int, place: int) -> None:
        """In a worker: the event for the traced process, which reads the folder when its report is made."""
        self.folder.mkdir(exist_ok=True)
        target = self.folder / f"{place:09d}-{worker}.pickle"
        partial = target.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(dataclasses.replace(event, worker=worker, batch=place)))
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


class WorkerWatch(FetchWatch):
    """A full trace's workers: a forked one runs on under the tracer it inherited; after each batch it judges."""

    def __init__(
        self,
        tracer: TracerHooks,
        *,
        worker_init: Callable[[Any, Path, int], Any] | None = None,
        folder: Path | None = None,
        origin: int | None = None,
    ) -> None:
        super().__init__(worker_init=worker_init, folder=folder, origin=origin)
        self.tracer = tracer
        self._sent = 0

    def fetch(self, fetcher: Any, index: Any, original: Callable[[Any, Any], Any]) -> Any:
        batch = original(fetcher, index)
        self.fetched(batch)
        return batch

    def fetched(self, batch: Any) -> None:
        """In a worker: judge what making ``batch`` ran; hand its first producer over when the batch is not finite."""
        if os.getpid() == self._origin or self.tracer.stopped:
            return
        from dtypecheck.nantrace.training import untraced

        where = self.place()
        if where is None:
            return
        with untraced():
            self.tracer.judge_now()
            producers = self.tracer.judge.taint.producers
            found, self._sent = producers[self._sent :], len(producers)
            if not found or not nonfinite_batch(batch):
                return
            self.hand_over(found[0].event, *where)


def _default_start_method() -> str | None:
    import multiprocessing

    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method()


def merge_workers(
    events: tuple[Event, ...], found: list[Event], *, untraced: set[int] | frozenset[int] = frozenset()
) -> tuple[Event, ...]:
    """The main process's first producer, when it is data that arrived (``input``) and a worker found where that
    data went non-finite, becomes the worker's event; the consuming line is kept as its ``arrival``.

    So does a producer in the ``untraced`` set (``Judge.untraced_inputs``): one that read an infinity no traced op
    made. A ``-inf`` from the worker is not yet a NaN: the main process's ``addmm`` makes NaN of it (``inf - inf``),
    a new NaN there by the rules, whose root is still the worker's line."""
    if not events or not found:
        return events
    arrived_data = events[0].cause == "input" and events[0].phase != "backward"
    if not arrived_data and events[0].op_index not in untraced:
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
