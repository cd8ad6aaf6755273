"""Watch mode's DataLoader workers: each batch a worker makes is checked there (one ``isfinite`` per tensor, in
the worker, off the training loop's path); the making of a non-finite one is run again from the same random
state under a full tracer in that worker, and its first producer handed to the main process, as a full trace's
workers hand theirs (``nantrace.workers``). The step's replay in the main process then names the worker's line,
not the main-process op that first met the data (``merge_workers``).

Workers started by spawn or forkserver import nothing of dtypecheck: their ``worker_init_fn`` is wrapped
(``ReplayWorkerInit``) to install the check there.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtypecheck.nantrace.training import untraced
from dtypecheck.nantrace.workers import FetchWatch, nonfinite_batch

REPLAYS_PER_WORKER = 4
"""Non-finite batches a worker makes again traced: the first is the one a step meets first; a few more cover a
non-finite batch the model masks (a ``-inf`` padding) before the one that fails."""


class WorkerReplay(FetchWatch):
    def __init__(
        self,
        make_tracer: Callable[[], Any],
        *,
        folder: Path | None = None,
        origin: int | None = None,
        spawned: bool = True,
    ) -> None:
        super().__init__(worker_init=ReplayWorkerInit if spawned else None, folder=folder, origin=origin)
        self._make_tracer = make_tracer
        self._replays = 0

    def fetch(self, fetcher: Any, index: Any, original: Callable[[Any, Any], Any]) -> Any:
        where = self.place()
        if where is None or self._replays >= REPLAYS_PER_WORKER:
            return original(fetcher, index)
        state = _RandomState.take()
        batch = original(fetcher, index)
        if not nonfinite_batch(batch):
            return batch
        self._replays += 1
        again = _RandomState.take()
        state.put_back()
        try:
            tracer = self._make_tracer()
            with tracer:
                remade = original(fetcher, index)
            with untraced():
                producers = tracer.judge.taint.producers
                if producers and nonfinite_batch(remade):
                    self.hand_over(producers[0].event, *where)
        except Exception:  # noqa: BLE001  (the check must never break the run: the batch goes on untraced)
            pass
        finally:
            again.put_back()  # the worker goes on as if the batch had been made once
        return batch


class _RandomState:
    """What a dataset's random transforms draw from in a worker: torch's, Python's and (when loaded) NumPy's."""

    def __init__(self, cpu: Any, python: Any, numpy: Any) -> None:
        self.cpu, self.python, self.numpy = cpu, python, numpy

    @classmethod
    def take(cls) -> _RandomState:
        import torch

        numpy = sys.modules.get("numpy")
        return cls(torch.get_rng_state(), random.getstate(), numpy.random.get_state() if numpy else None)

    def put_back(self) -> None:
        import torch

        torch.set_rng_state(self.cpu)
        random.setstate(self.python)
        numpy = sys.modules.get("numpy")
        if numpy is not None and self.numpy is not None:
            numpy.random.set_state(self.numpy)


class ReplayWorkerInit:
    """A spawned or forkserver worker's ``worker_init_fn`` under watch mode: install the batch check there, then
    run the user's own ``worker_init_fn``, if any."""

    def __init__(self, user_init: Any, folder: Path, origin: int) -> None:
        self.user_init = user_init
        self.folder = folder
        self.origin = origin

    def __call__(self, worker_id: int) -> None:
        from dtypecheck.nantrace.tracer import TraceOptions, Tracer

        options = TraceOptions(stop_run=False, keep_going=False)
        WorkerReplay(lambda: Tracer(options), folder=self.folder, origin=self.origin, spawned=False).install()
        if self.user_init is not None:
            self.user_init(worker_id)


__all__ = ["ReplayWorkerInit", "WorkerReplay"]
