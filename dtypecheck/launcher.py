"""A process's place in a run a launcher started (torchrun, or ``--nproc``), and a client of the launcher's store.

On the ground floor: nan-trace's ranks exchange reports through the store and scan-model's ranks their shares of a
sharded checkpoint, and neither core may import the other's internals.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@dataclass(frozen=True)
class RankInfo:
    """This process's place in a run started by torchrun (or any launcher that sets the same variables)."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    run_id: str


def store_client(info: RankInfo) -> Any:
    """A client of the store the launcher (torchrun, ``--nproc``) hosts at ``MASTER_ADDR:MASTER_PORT``: ranks
    exchange reports through it without a process group."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    return TCPStore(
        info.master_addr, info.master_port, is_master=False, timeout=timedelta(seconds=60), wait_for_workers=False
    )


def rank_info(environ: dict[str, str] | None = None) -> RankInfo | None:
    """From ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; None for a single process."""
    env = os.environ if environ is None else environ
    try:
        world_size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env["RANK"]) if world_size > 1 else 0
        port = int(env.get("MASTER_PORT", "0"))
    except (KeyError, ValueError):
        return None
    if world_size <= 1 or not port:
        return None
    run = f"{env.get('TORCHELASTIC_RUN_ID', 'none')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return RankInfo(rank, world_size, env.get("MASTER_ADDR", "127.0.0.1"), port, run)


__all__ = ["RankInfo", "rank_info", "store_client"]
