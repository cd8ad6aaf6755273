"""``torchrun ... -m dtypecheck scan-model DIR``: the files of a sharded checkpoint split across ranks, one report.

Every rank opens the checkpoint (headers only) and lists the same records, so each part (shard file) has the same
index everywhere. The parts are dealt out by bytes (largest first, each to the least loaded rank); each rank scans
its own and, unless it is rank 0, publishes the results (pickled ``TensorScan``s, keyed by their place in the
listing) on the launcher's key-value store and ends with exit 0. Rank 0 scans its parts, collects the others' and
builds the report from the whole listing exactly as a single process does, so the document and exit code are the
same. A rank that cannot read its shard publishes the error instead; rank 0 fails with that error (the shard
named, the exit code of the error), so nothing waits for a rank that has stopped.

The other ranks exit 0 whatever they found: a launcher such as torchrun stops every rank as soon as one exits
non-zero, which could end rank 0 before it has written the report.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from dtypecheck.errors import DtypecheckError, ExitCode

if TYPE_CHECKING:
    from dtypecheck.launcher import RankInfo
    from dtypecheck.scan.report import TensorScan

POLL_S = 0.05
WAIT_S = 3600.0
"""How long rank 0 waits for a rank that has published neither results nor an error."""


class Store(Protocol):
    """The part of ``torch.distributed.Store`` used here (``TCPStore`` in a run; a dict in the tests)."""

    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...


class RankError(DtypecheckError):
    """Another rank could not scan its share: its own message and exit code."""

    def __init__(self, message: str, exit_code: ExitCode) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def split_by_bytes(sizes: Sequence[int], world_size: int) -> list[int]:
    """The rank that scans each part: largest part first, to the rank with the fewest bytes so far (lowest rank
    on ties), so the busiest rank has at most the largest part more than the least busy."""
    loads = [0] * world_size
    owners = [0] * len(sizes)
    for part in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        owners[part] = rank
        loads[rank] += sizes[part]
    return owners


@dataclass(frozen=True)
class Ranks:
    """This process's place in a distributed scan and the store the ranks meet at."""

    rank: int
    world_size: int
    store: Store
    prefix: str
    """Key prefix of this scan: the launcher's run id and the checkpoint's number on the command line."""

    @classmethod
    def connect(cls, info: RankInfo, scan_number: int = 0) -> Ranks:
        """A client of the store the launcher hosts at ``MASTER_ADDR:MASTER_PORT`` (as nan-trace's ranks use)."""
        from dtypecheck.launcher import store_client

        store = store_client(info)
        # torch's stub types the value as str; TCPStore takes bytes as well
        return cls(info.rank, info.world_size, cast("Store", store), f"dtypecheck/scan/{info.run_id}/{scan_number}/")

    def owns(self, owner: int) -> bool:
        return owner == self.rank

    def publish(self, results: dict[int, TensorScan]) -> None:
        self.store.set(f"{self.prefix}result/{self.rank}", pickle.dumps(results))

    def fail(self, exit_code: int, message: str) -> None:
        self.store.set(f"{self.prefix}error/{self.rank}", pickle.dumps((int(exit_code), message)))

    def gather(self, wait_s: float = WAIT_S) -> dict[int, TensorScan]:
        """Every other rank's results (rank 0); raises the first error a rank published, in rank order."""
        found: dict[int, TensorScan] = {}
        waiting = set(range(1, self.world_size))
        deadline = time.monotonic() + wait_s
        while waiting:
            for rank in sorted(waiting):
                error = f"{self.prefix}error/{rank}"
                if self.store.check([error]):
                    code, message = pickle.loads(self.store.get(error))
                    raise RankError(message, ExitCode(code))
                result = f"{self.prefix}result/{rank}"
                if self.store.check([result]):
                    found.update(pickle.loads(self.store.get(result)))
                    waiting.discard(rank)
            if waiting and time.monotonic() > deadline:
                names = ", ".join(map(str, sorted(waiting)))
                raise RankError(f"rank(s) {names} sent no scan results within {wait_s:g} s", ExitCode.INPUT_ERROR)
            if waiting:
                time.sleep(POLL_S)
        return found
