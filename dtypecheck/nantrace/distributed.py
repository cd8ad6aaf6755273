"""Distributed runs (``torchrun ... -m dtypecheck nan-trace train.py``): every rank traces, one report is merged.

The ranks talk through their own client of the launcher's key-value store (``MASTER_ADDR:MASTER_PORT``, the store
torchrun's agent hosts), never through the process group the script builds, so a rank stuck in a collective can
still be reached. A rank that ends publishes its report (pickled) and, when it failed, a ``failed`` key. A watcher
thread on every rank polls that key: it stops the traced code at its next op, and when the code is blocked in a
collective (waiting for the rank that stopped) it finishes for it, writes the merged report and ends the process
with the same exit code, within seconds.

The merged report's first producer prefers a value born on its rank over one that arrived through a collective
(``cause == "collective"``), then the earliest step, then the lowest rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from dtypecheck.launcher import RankInfo, store_client
from dtypecheck.nantrace.report import Event, NanTraceReport, RankSummary

if TYPE_CHECKING:
    from dtypecheck.nantrace.tracer import Tracer

POLL_S = 0.1
GRACE_S = 2.0
"""How long a rank told to stop waits for its traced code to reach an op before finishing for it."""
AFTER_FAILURE_S = 15.0
"""How long ranks wait for the others' reports once one has failed."""
CLEAN_WAIT_S = 600.0
"""How long a rank that ended cleanly waits for the others to end."""
DONE_WAIT_S = 5.0
"""How long a rank that delivered waits for the others to deliver too before it exits."""


def _key(value: Event) -> tuple[int, int, int, int]:
    return (value.cause == "collective", value.step, value.rank or 0, value.op_index)


def merge(reports: dict[int, NanTraceReport | None], world_size: int) -> NanTraceReport:
    """One report for the run: every rank's findings, tagged with their rank; the first producer by the rule above."""
    present = {r: rep for r, rep in sorted(reports.items()) if rep is not None}
    base = present.get(0) or next(iter(present.values()))
    events = tuple(sorted((e for rep in present.values() for e in rep.events), key=_key))
    statuses = [rep.status for rep in present.values()]
    status: Literal["clean", "nonfinite", "error"] = (
        "nonfinite" if "nonfinite" in statuses else ("error" if "error" in statuses else "clean")
    )
    summaries = tuple(
        RankSummary(r, rep.status, rep.ops, rep.steps) if rep is not None else RankSummary(r, "missing", 0, 0)
        for r, rep in sorted(reports.items())
    )
    missing = [s.rank for s in summaries if s.status == "missing"]
    notes = tuple(dict.fromkeys(n for rep in present.values() for n in rep.notes))
    if missing:
        notes += (f"no report arrived from rank(s) {', '.join(map(str, missing))}",)
    collapse = next((rep.scale_collapse for rep in present.values() if rep.scale_collapse is not None), None)
    return dataclasses.replace(
        base,
        status=status,
        first=events[0] if events else None,
        events=events,
        warnings=tuple(w for rep in present.values() for w in rep.warnings),
        handled=tuple(h for rep in present.values() for h in rep.handled),
        skipped_steps=tuple(s for rep in present.values() for s in rep.skipped_steps),
        scale_collapse=collapse,
        ops=sum(rep.ops for rep in present.values()),
        steps=max(rep.steps for rep in present.values()),
        stopped_early=any(rep.stopped_early for rep in present.values()),
        notes=notes,
        promotions=next((rep.promotions for rep in present.values() if rep.promotions), ()),
        dtype_error=next((rep.dtype_error for rep in present.values() if rep.dtype_error is not None), None),
        world_size=world_size,
        ranks=summaries,
        # --watch: what the rank of the first producer saw and replayed.
        watch=next((rep.watch for r, rep in present.items() if events and r == events[0].rank), base.watch),
    )


class Session:
    """One rank's side of a distributed trace. ``deliver(merged) -> exit code`` writes the report (rank 0);
    ``end_process(code)`` ends the process when the traced code is stuck in a collective and cannot return."""

    def __init__(
        self, info: RankInfo, deliver: Callable[[NanTraceReport], int], end_process: Callable[[int], None]
    ) -> None:
        self.info = info
        self._deliver = deliver
        self._end_process = end_process
        self._prefix = f"dtypecheck/nantrace/{info.run_id}/"
        self._store: Any = None
        self._tracer: Tracer | None = None
        self._snapshot: Callable[[], NanTraceReport] | None = None
        self._finishing = threading.Lock()
        self._connecting = threading.Lock()
        self._done = threading.Event()
        self._code: int | None = None
        self._watcher: threading.Thread | None = None
        self.held: list[object] = []
        """The traced script's globals, kept until the process ends (``os._exit``)."""

    # -- the store ---------------------------------------------------------------------------------------------
    def _connect(self) -> Any:
        with self._connecting:
            return self._client()

    def _client(self) -> Any:
        if self._store is None:
            self._store = store_client(self.info)
        return self._store

    def _has(self, key: str) -> bool:
        return bool(self._connect().check([self._prefix + key]))

    def _set(self, key: str, value: bytes) -> None:
        self._connect().set(self._prefix + key, value)

    # -- running -----------------------------------------------------------------------------------------------
    def attach(self, tracer: Tracer, snapshot: Callable[[], NanTraceReport]) -> None:
        """Trace with ``tracer``; ``snapshot()`` is this rank's report so far (for finishing from the watcher)."""
        self._tracer = tracer
        self._snapshot = snapshot
        self._watcher = threading.Thread(target=self._watch, name="dtypecheck-nantrace-watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._done.is_set():
            try:
                if self._has("failed"):
                    break
            except Exception:  # noqa: BLE001  (the store is not up yet, or already gone: keep polling)
                pass
            time.sleep(POLL_S)
        else:
            return
        if self._tracer is not None:
            self._tracer.interrupt()
        if self._done.wait(GRACE_S) or self._snapshot is None:
            return
        # Still inside the traced code: blocked in a collective that waits for a rank that stopped.
        with contextlib.suppress(Exception):
            self._end_process(self.finish(self._snapshot()))

    def finish(self, report: NanTraceReport) -> int:
        """Publish this rank's report, wait for the others', merge, deliver (once per process); the exit code."""
        with self._finishing:
            if self._code is not None:
                return self._code
            self._done.set()
            if report.status != "clean" or report.level == "fail":
                self._set("failed", str(self.info.rank).encode())
            self._set(f"report/{self.info.rank}", pickle.dumps(dataclasses.replace(report, ranks=())))
            merged = merge(self._collect(), self.info.world_size)
            self._code = self._deliver(merged)
            self._set(f"done/{self.info.rank}", b"1")
            self._wait_for_all("done/", DONE_WAIT_S)
            return self._code

    def _wait_for_all(self, key: str, seconds: float) -> None:
        """Let every rank reach ``key`` (so that they end together, and a launcher sees one exit code)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if all(self._has(f"{key}{rank}") for rank in range(self.info.world_size)):
                return
            time.sleep(POLL_S)

    def abandon(self) -> None:
        """This rank ends without a report (its code raised): the others stop waiting for it."""
        self._done.set()
        with contextlib.suppress(Exception):
            self._set("failed", str(self.info.rank).encode())

    def _collect(self) -> dict[int, NanTraceReport | None]:
        found: dict[int, NanTraceReport | None] = dict.fromkeys(range(self.info.world_size))
        deadline = time.monotonic() + CLEAN_WAIT_S
        failed_at: float | None = None
        while True:
            for rank, value in found.items():
                if value is None and self._has(f"report/{rank}"):
                    found[rank] = pickle.loads(self._connect().get(f"{self._prefix}report/{rank}"))
            if all(v is not None for v in found.values()):
                return found
            now = time.monotonic()
            if failed_at is None and self._has("failed"):
                failed_at = now
            if now > deadline or (failed_at is not None and now - failed_at > AFTER_FAILURE_S):
                return found
            time.sleep(POLL_S)
