"""Independent traces side by side, in forked copies of this process (``--fit``'s checks at N and N + 1).

A trace is pure Python on fake tensors, so threads cannot share it out; a forked child can, and inherits every
module, fake tensor and cached trace as they are, without pickling any of them. Only each task's result (a small
frozen dataclass of ints) comes back, through a pipe. A child runs torch on one thread (OpenMP's pool does not
survive a fork). Where forking is not safe (not Linux, CUDA initialised, threads of the user's own code running)
or there is one core, everything runs here, one task after another; so does every task whose child failed or did
not answer in time. A task that raises gives None: the caller runs it again itself, where its error is reported.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

MAX_WORKERS = 4
"""More processes than this gain little: a batch of checks is six traces, and each child costs a fork."""
CHILD_GRACE_S = 30.0
"""How long a child may take beyond what this process's own share took, before its tasks are run here."""


def available_workers() -> int:
    """Processes to trace with: the cores this process may run on, at most ``MAX_WORKERS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))


def can_fork(user_code: bool) -> bool:
    """Whether a forked child can run a trace: Linux, CUDA not initialised in this process, and (when a user's
    factory ran here) no other thread that could hold a lock the child needs."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return False
    return not (user_code and threading.active_count() > 1)


def _shares(weights: Sequence[float], workers: int) -> list[list[int]]:
    """Task indices per worker, the heaviest first onto the least loaded (worker 0 is this process)."""
    loads = [0.0] * workers
    shares: list[list[int]] = [[] for _ in range(workers)]
    for index in sorted(range(len(weights)), key=lambda i: -weights[i]):
        worker = min(range(workers), key=lambda w: loads[w])
        loads[worker] += weights[index]
        shares[worker].append(index)
    return [sorted(share) for share in shares]


def _attempt(task: Callable[[], T]) -> T | None:
    try:
        return task()
    except Exception:  # noqa: BLE001 - the caller runs a failed task again itself, where its error is reported
        return None


def _child(share: list[int], tasks: Sequence[Callable[[], T]], write_fd: int) -> None:
    """In the forked child: run ``share``, send the results, and leave without running any exit handler (they
    belong to the parent: its buffered output, its atexit functions)."""
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        torch = sys.modules.get("torch")
        if torch is not None:
            # The traces run small real ops too (the shadows that give value-dependent sizes): OpenMP's thread pool
            # does not survive a fork, so the child's ops run on its one thread.
            torch.set_num_threads(1)
        payload = pickle.dumps([(index, _attempt(tasks[index])) for index in share])
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view) :]
        code = 0
    finally:
        os._exit(code)


def _collect(pid: int, read_fd: int, until: float) -> list[tuple[int, object]]:
    """What the child sent, or nothing when it failed or passed ``until``; the child is reaped either way."""
    chunks: list[bytes] = []
    complete = False
    try:
        while True:
            left = until - time.monotonic()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                break
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                complete = True
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        if not complete:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if not complete or status != 0:
        return []
    try:
        results = pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001 - a damaged answer: its tasks run here
        return []
    return list(results)


def side_by_side(
    tasks: Sequence[Callable[[], T]],
    weights: Sequence[float] | None = None,
    workers: int = 1,
    deadline: float | None = None,
) -> list[T | None]:
    """Each task's result (None where it raised), running the tasks in up to ``workers`` processes: this one and
    forked children. ``weights`` (relative costs) balance the shares; ``deadline`` (``time.monotonic``) bounds the
    wait for a child beyond the grace."""
    results: list[T | None] = [None] * len(tasks)
    workers = min(workers, len(tasks))
    if workers <= 1:
        return [_attempt(task) for task in tasks]
    shares = _shares(weights or [1.0] * len(tasks), workers)
    children: list[tuple[int, int, list[int]]] = []
    local = list(shares[0])
    try:
        for share in shares[1:]:
            try:
                read_fd, write_fd = os.pipe()
            except OSError:  # out of descriptors: this share runs here
                local.extend(share)
                continue
            try:
                pid = os.fork()
            except OSError:  # out of processes or memory: this share runs here
                os.close(read_fd)
                os.close(write_fd)
                local.extend(share)
                continue
            if pid == 0:  # pragma: no cover - the child's coverage is not collected
                os.close(read_fd)
                _child(share, tasks, write_fd)
            os.close(write_fd)
            children.append((pid, read_fd, share))
        started = time.monotonic()
        for index in local:
            results[index] = _attempt(tasks[index])
        own = time.monotonic() - started
        for pid, read_fd, share in children:
            until = time.monotonic() + CHILD_GRACE_S + 4 * own
            if deadline is not None:
                until = min(until, max(deadline, time.monotonic()) + 1.0)
            answered = dict(_collect(pid, read_fd, until))
            for index in share:
                results[index] = answered.get(index)  # type: ignore[assignment]
        children.clear()
    finally:
        for pid, read_fd, _ in children:  # interrupted: no child outlives the call
            with contextlib.suppress(OSError):
                os.close(read_fd)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return results
