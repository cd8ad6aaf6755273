"""``dtypecheck scan-model``: every tensor of a checkpoint against the limits of its own dtype and of targets.

The checkpoint is read tensor by tensor in bounded chunks (never materialised). Chunks are processed on a pool
of threads (the kernel releases the GIL) with a bounded number in flight, so private memory stays at a few
chunks however large a tensor is, and reading one chunk from disk overlaps with computing on the others. The
chunks of a sharded checkpoint's parts are interleaved, so every shard file is read at the same time.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache, partial
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtypecheck.dtypes import DtypeSpec, lookup
from dtypecheck.errors import ExitCode, ParameterError, describe
from dtypecheck.loaders import Checkpoint, Finding, TensorRecord, open_checkpoint
from dtypecheck.progress import ProgressCallback, no_progress
from dtypecheck.scan.gate import CheckpointPlan, Gate
from dtypecheck.scan.keep_float32 import DEFAULT_MIN_SQNR_DB, with_keep_float32
from dtypecheck.scan.kernel import kernels
from dtypecheck.scan.policy import apply_policy, with_role
from dtypecheck.scan.ranks import Ranks, split_by_bytes
from dtypecheck.scan.report import ScanReport, summarise
from dtypecheck.scan.roles import assign_roles
from dtypecheck.scan.select import EVERYTHING, Selection
from dtypecheck.scan.tensor import TensorScanner
from dtypecheck.scan.verdicts import with_verdicts
from dtypecheck.targets import check_targets

if TYPE_CHECKING:
    import numpy as np
    import torch

    from dtypecheck.config import ScanPolicy

DEFAULT_TARGETS = ("float16", "bfloat16")
MAX_WORKERS = 8


def scan_checkpoint(
    checkpoint: str,
    targets: Sequence[DtypeSpec] | None = None,
    *,
    progress: ProgressCallback = no_progress,
    workers: int | None = None,
    compiled: bool | None = None,
    policy: ScanPolicy | None = None,
    precision: bool = False,
    keep_float32_sqnr_db: float = DEFAULT_MIN_SQNR_DB,
    baseline: str | os.PathLike[str] | None = None,
    baseline_key: str | None = None,
    update_baseline: bool = False,
    selection: Selection = EVERYTHING,
    ranks: Ranks | None = None,
) -> ScanReport:
    """Scan every tensor of ``checkpoint`` (file, folder, ``file.py:factory`` or Hub id).

    ``targets`` default to float16 and bfloat16. ``compiled=False`` forces the numpy kernels (same results),
    ``True`` numba's; by default a small checkpoint (``kernel.SMALL_SCAN_BYTES``) is scanned with numpy's.
    ``policy`` (the project's ignore rules and tolerances) sets the levels; the dtype-consistency findings
    are added either way. ``precision`` adds the precision-loss measures (``measures``) in the second pass;
    ``keep_float32_sqnr_db`` is the SQNR below which a cast loses too much for the summary's ``keep_float32``.
    ``selection`` (include/exclude globs, weights only) says which tensors are read; the others are counted in the
    summary's ``left_out``, and a selection that leaves none is a ``no-tensors`` finding (fail).

    With a ``baseline`` file (``dtypecheck.baseline/1``, or an earlier JSON report) the report is compared with
    the checkpoint's entry in it (``baseline_key``; default: its path relative to the working folder) and its
    ``gate_level`` follows only what is new or worse; with ``update_baseline`` the entry is written instead (the
    file is created if missing). Several checkpoints against shared baseline files: ``dtypecheck.scan.gate``.

    ``ranks`` (rank 0 of a distributed run, ``dtypecheck.scan.ranks``): scan only this rank's share of the parts
    and collect the other ranks' (each runs ``scan_share``); the report is the one a single process makes.
    """
    if ranks is not None and ranks.rank != 0:
        raise ValueError("scan_checkpoint runs on rank 0; the other ranks run scan_share")
    if update_baseline and baseline is None:
        raise ParameterError("{update_baseline}: needs the baseline file to write ({baseline})")
    specs = check_targets(targets) if targets else [lookup(name) for name in DEFAULT_TARGETS]
    plan = CheckpointPlan(checkpoint, baseline=None if baseline is None else Path(baseline), key=baseline_key or "")
    gate = Gate([plan], update=update_baseline)  # the baseline is read before the scan: a bad one fails fast
    opened = open_checkpoint(checkpoint)
    try:
        report = _scan(opened, specs, progress, workers or default_workers(), compiled, precision, selection, ranks)
    finally:
        opened.close()
    assert report is not None  # rank 0 (or a single process) always builds the report
    judged = with_verdicts(with_keep_float32(apply_policy(report, policy), keep_float32_sqnr_db))
    result = gate.judge(plan, judged)
    gate.write()
    return result.report


def scan_share(
    checkpoint: str,
    ranks: Ranks,
    targets: Sequence[DtypeSpec] | None = None,
    *,
    workers: int | None = None,
    compiled: bool | None = None,
    precision: bool = False,
    selection: Selection = EVERYTHING,
) -> tuple[int, str] | None:
    """A rank other than 0: scan this rank's share of ``checkpoint``'s parts and publish the results for rank 0.

    Returns None, or (exit code, message) of the error that stopped it, published for rank 0 to fail with (this
    rank says nothing itself: rank 0 reports once for the run). A bug is published too, then raised.
    """
    try:
        specs = check_targets(targets) if targets else [lookup(name) for name in DEFAULT_TARGETS]
        opened = open_checkpoint(checkpoint)
        try:
            _scan(opened, specs, no_progress, workers or default_workers(), compiled, precision, selection, ranks)
        finally:
            opened.close()
    except Exception as exc:
        mapped = describe(exc)
        if mapped is None:
            ranks.fail(ExitCode.INPUT_ERROR, f"rank {ranks.rank} stopped: {type(exc).__name__}: {exc}")
            raise
        ranks.fail(*mapped)
        return int(mapped[0]), mapped[1]
    return None


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def _parts(checkpoint: Checkpoint) -> list[Checkpoint]:
    parts = getattr(checkpoint, "parts", None)
    found = parts() if callable(parts) else None
    return list(found) if found else [checkpoint]


def _scan(
    checkpoint: Checkpoint,
    targets: list[DtypeSpec],
    progress: ProgressCallback,
    workers: int,
    compiled: bool | None,
    precision: bool = False,
    selection: Selection = EVERYTHING,
    ranks: Ranks | None = None,
) -> ScanReport | None:
    """The report; with ``ranks``, only this rank's share of the parts is scanned: rank 0 collects the others'
    results and returns the report, the other ranks publish theirs and return None. ``compiled``: as
    ``kernel.kernels`` (None: numba for all but a small checkpoint)."""
    parts = _parts(checkpoint)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dtypecheck-scan") as pool:
        every = (
            list(pool.map(lambda part: list(part.records()), parts)) if len(parts) > 1 else [list(parts[0].records())]
        )
        # Roles follow the whole checkpoint's structure (every record, also those the selection leaves out).
        roles = assign_roles(r for records in every for r in records)
        listed = [[r for r in records if selection.keeps(r.name, roles.get(r.name))] for records in every]
        # Records that view the same data (tied weights, aliases) are scanned once and reported under each name.
        first_of: dict[object, TensorRecord] = {}
        copies: list[tuple[TensorRecord, TensorRecord]] = []
        for records in listed:
            for record in records:
                key = _data_key(record)
                if key is not None and first_of.setdefault(key, record) is not record:
                    copies.append((record, first_of[key]))
        shared = {id(copy) for copy, _ in copies}
        data_bytes = sum(r.nbytes for records in listed for r in records if id(r) not in shared)
        k = kernels(compiled, data_bytes, precision=precision)
        scanners_by_part = [
            [TensorScanner(r, targets, k, precision=precision) for r in records if id(r) not in shared]
            for records in listed
        ]
        scanners = [s for part in scanners_by_part for s in part]
        if ranks is not None:
            sizes = [sum(s.record.nbytes for s in part if s.readable) for part in scanners_by_part]
            owners = split_by_bytes(sizes, ranks.world_size)
            scanners_by_part = [part if ranks.owns(owners[i]) else [] for i, part in enumerate(scanners_by_part)]
        mine = [s for part in scanners_by_part for s in part]
        pipeline = _Pipeline(pool, limit=2 * workers, progress=progress)
        pipeline.total = sum(s.record.nbytes for s in mine if s.readable)
        pipeline.run(_interleave([_first_pass_jobs(part) for part in scanners_by_part]))
        _second_pass(pipeline, mine)
    results = {id(s.record): s.result() for s in mine}
    if ranks is not None:
        place = {id(s.record): i for i, s in enumerate(scanners)}
        if ranks.rank != 0:
            ranks.publish({place[key]: scan for key, scan in results.items()})
            return None
        results.update((id(scanners[i].record), scan) for i, scan in ranks.gather().items())
    for copy, original in copies:
        results[id(copy)] = dataclasses.replace(
            results[id(original)], name=copy.name, shape=tuple(copy.shape), alias_of=original.name
        )
    tensors = tuple(with_role(results[id(record)], roles.get(record.name)) for records in listed for record in records)
    found = list(checkpoint.findings)
    left_out = sum(map(len, every)) - len(tensors)
    if left_out and not tensors:
        found.insert(0, Finding("no-tensors", "fail", f"{selection.describe()} left none of the {left_out} tensors"))
    findings = _dedupe(found)
    return ScanReport(
        source=checkpoint.source,
        format=checkpoint.format,
        targets=tuple(t.name for t in targets),
        tensors=tensors,
        findings=findings,
        summary=summarise(tensors, findings, left_out),
    )


Job = tuple[Callable[[], Any], Callable[[Any], None], int, str]
"""(work on a pool thread, merge on the main thread, source bytes, tensor name)."""

Reader = tuple[Callable[..., "torch.Tensor | np.ndarray"], int]
"""(produce one chunk, its source bytes): sources that can defer their reads let the pool threads do them."""


def _data_key(record: TensorRecord) -> object | None:
    """What identifies a record's data: equal keys mean equal values (same source, same dtype)."""
    from dtypecheck.loaders._io.mapped import MappedSource, StridedSource

    source = record.source
    # byte ranges of a mapped file compare by value (offsets, shapes, strides); other sources are never shared
    return (record.dtype, source) if isinstance(source, MappedSource | StridedSource) else None


def _readers(scanner: TensorScanner) -> Iterator[Reader]:
    """The tensor's chunk readers; a mapped source gives numpy arrays where it can (no torch import)."""
    source = scanner.record.source
    if source is None or not scanner.readable:
        return
    deferred = getattr(source, "iter_readers", None)
    if callable(deferred):
        yield from deferred(scanner.chunk_bytes(), arrays=True)
        return
    for chunk in source.iter_chunks(scanner.chunk_bytes()):
        advise_willneed(chunk)
        yield partial(_same, chunk), _nbytes(chunk)


def _same(chunk: torch.Tensor, into: memoryview | None = None) -> torch.Tensor:
    return chunk


_SCRATCH = threading.local()


def _on(work: Callable[..., Any], read: Callable[..., torch.Tensor | np.ndarray], nbytes: int, *args: Any) -> Any:
    """``work(chunk, *args)`` with the chunk read here, on the pool thread, into that thread's reusable buffer (a
    fresh buffer per chunk would cost the kernel's zero-filling of every page); ``work`` returns counts only."""
    import numpy as np

    scratch: np.ndarray | None = getattr(_SCRATCH, "buffer", None)
    if scratch is None or scratch.nbytes < nbytes:
        scratch = _SCRATCH.buffer = np.empty(nbytes, np.uint8)
    return work(read(into=memoryview(scratch.data)), *args)


def _nbytes(chunk: torch.Tensor) -> int:
    return int(chunk.numel() * chunk.element_size())


def _first_pass_jobs(scanners: list[TensorScanner]) -> Iterator[Job]:
    for scanner in scanners:
        for read, nbytes in _readers(scanner):
            yield partial(_on, scanner.process, read, nbytes), scanner.merge, nbytes, scanner.record.name


_MADV_WILLNEED = 3
_PAGE = 4096


@cache
def _madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return function


def advise_willneed(chunk: torch.Tensor) -> None:
    """Start reading a memory-mapped chunk's pages from disk now, asynchronously (``madvise(MADV_WILLNEED)``).

    Chunks are advised when they are queued, a few chunks ahead of the workers, so with a cold page cache the
    disk reads overlap with computing on earlier chunks instead of stalling a worker on each page fault. For
    memory that is not a file mapping the advice does nothing; a failure is ignored.
    """
    madvise = _madvise()
    nbytes = _nbytes(chunk)
    if madvise is None or nbytes == 0:
        return
    address = chunk.data_ptr()
    start = address - address % _PAGE
    madvise(ctypes.c_void_p(start), address + nbytes - start, _MADV_WILLNEED)


def _interleave(streams: list[Iterator[Job]]) -> Iterator[Job]:
    """Round-robin over the parts' jobs, so each shard file is read concurrently rather than one after another."""
    if len(streams) == 1:
        yield from streams[0]
        return
    for batch in zip_longest(*streams):
        yield from (job for job in batch if job is not None)


def _second_pass(pipeline: _Pipeline, scanners: list[TensorScanner]) -> None:
    """float8 targets: the scaled-underflow count needs each tensor's absmax, known only after the first pass."""
    again = [s for s in scanners if s.needs_second_pass()]
    if not again:
        return
    with_inf = [s for s in again if s.needs_finite_absmax()]
    pipeline.total += sum(s.record.nbytes for s in with_inf + again)
    pipeline.run(
        (partial(_on, s.finite_max_pass, read, nbytes), s.merge_finite_max, nbytes, s.record.name)
        for s in with_inf
        for read, nbytes in _readers(s)
    )
    pipeline.run(job for s in again for job in _scaled_jobs(s))


def _scaled_jobs(scanner: TensorScanner) -> Iterator[Job]:
    absmax = scanner.scaling_absmax()
    # A source that defers its reads cuts chunks of chunk_bytes() (the last one ends the tensor): whole rows.
    deferred = callable(getattr(scanner.record.source, "iter_readers", None))
    if deferred and scanner.rows_whole(scanner.chunk_bytes()):
        for read, nbytes in _readers(scanner):
            job = partial(_on, scanner.second_pass, read, nbytes, absmax)
            yield job, scanner.merge_second, nbytes, scanner.record.name
        return
    # Per-channel and MX measures need chunks cut on whole rows: read them here, in order, and regroup.
    source = scanner.record.source
    assert source is not None  # (a scanner with a second pass read its values in the first)
    for chunk in scanner.second_chunks(source.iter_chunks(scanner.chunk_bytes())):
        yield partial(scanner.second_pass, chunk, absmax), scanner.merge_second, _nbytes(chunk), scanner.record.name


class _Pipeline:
    """Runs jobs on the pool with at most ``limit`` in flight, merging results in submission order."""

    def __init__(self, pool: ThreadPoolExecutor, limit: int, progress: ProgressCallback) -> None:
        self.pool = pool
        self.limit = limit
        self.progress = progress
        self.total = 0
        self.done = 0

    def run(self, jobs: Iterator[Job]) -> None:
        in_flight: deque[tuple[Future[Any], Callable[[Any], None], int, str]] = deque()
        try:
            for work, merge, nbytes, name in jobs:
                if len(in_flight) >= self.limit:
                    self._finish(in_flight.popleft())
                in_flight.append((self.pool.submit(work), merge, nbytes, name))
            while in_flight:
                self._finish(in_flight.popleft())
        except BaseException:
            for future, *_ in in_flight:
                future.cancel()
            raise

    def _finish(self, item: tuple[Future[Any], Callable[[Any], None], int, str]) -> None:
        future, merge, nbytes, name = item
        merge(future.result())
        self.done += nbytes
        self.progress(self.done, max(self.total, self.done), name)


def _dedupe(findings: list[Finding]) -> tuple[Finding, ...]:
    seen: dict[tuple[str, str, str, str | None], Finding] = {}
    for finding in findings:
        seen.setdefault((finding.kind, finding.level, finding.detail, finding.tensor), finding)
    return tuple(seen.values())
