"""Where each non-finite value went: the storages holding one, the producer each descends from, and the rule that
turns a producer into a failure or a note.

A producer's value *matters* (a failure) when it reaches the loss, a parameter, an optimizer state, is still held
when the run ends, or dies without anything having turned it finite. It is a note when every storage holding it
was masked (an op read it and wrote finite values: ``where``, ``masked_fill``, ``nan_to_num``, torch's own
``norm`` backward) or when ``GradScaler`` skipped the step it was in.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dtypecheck.findings import Level
from dtypecheck.nantrace.records import plain
from dtypecheck.nantrace.report import Consequence, Event

if TYPE_CHECKING:
    import torch

NOTES: tuple[Consequence, ...] = ("masked", "skipped_step")


@dataclass
class Producer:
    """A non-finite producer while its fate is open."""

    event: Event
    """As found (level ``fail``, no consequence yet)."""
    parents: tuple[int, ...] = ()
    """Producers whose non-finite values this one read (a NaN made from infinities)."""
    masked: bool = False
    """Some op read its value and wrote finite values."""
    reached_loss: bool = False
    resolved: Consequence | None = None


@dataclass
class Taint:
    """Storage address -> (storage, has NaN, has inf, producer index or None for a value the user meant)."""

    storages: dict[int, tuple[weakref.ref[torch.UntypedStorage], bool, bool, int | None]] = field(default_factory=dict)
    producers: list[Producer] = field(default_factory=list)

    # -- storages ----------------------------------------------------------------------------------------------
    def known(self, tensor: torch.Tensor) -> tuple[bool, bool, int | None] | None:
        """(has NaN, has inf, origin) of the memory ``tensor`` views, when a traced op left it non-finite."""
        if not self.storages:  # a clean run: the optimizer step asks this of every parameter and state
            return None
        try:
            entry = self.storages.get(int(plain(tensor).untyped_storage().data_ptr()))
        except (RuntimeError, NotImplementedError):  # no storage of its own (a jagged nested tensor): unchecked
            return None
        if entry is None or entry[0]() is None:
            return None
        return entry[1], entry[2], entry[3]

    def mark(self, tensor: torch.Tensor, has_nan: bool, has_inf: bool, origin: int | None) -> None:
        # Keyed by storage, with a weak reference to it: backward reads saved outputs through new tensor objects
        # over the same memory, and a freed and reused address is never mistaken for the old tensor.
        try:
            storage = plain(tensor).untyped_storage()
            address = int(storage.data_ptr())
        except (RuntimeError, NotImplementedError):
            return
        self.storages[address] = (weakref.ref(storage), has_nan, has_inf, origin)

    def clear(self, tensor: torch.Tensor) -> None:
        try:
            self.storages.pop(int(plain(tensor).untyped_storage().data_ptr()), None)
        except (RuntimeError, NotImplementedError):
            return

    def live_origins(self) -> set[int]:
        """Producers some live storage still holds a value of (dead storages are swept out)."""
        live: set[int] = set()
        for key, (storage, _, _, origin) in list(self.storages.items()):
            if storage() is None:
                del self.storages[key]
            elif origin is not None:
                live.add(origin)
        return live

    # -- producers ---------------------------------------------------------------------------------------------
    def add(self, event: Event, parents: tuple[int, ...]) -> int:
        self.producers.append(Producer(event, parents))
        return len(self.producers) - 1

    def pending(self) -> list[int]:
        return [i for i, p in enumerate(self.producers) if p.resolved is None]

    def lineage(self, origin: int) -> list[int]:
        """``origin`` and the producers it descends from, oldest first (the first producer is the root cause)."""
        seen: list[int] = []
        todo = [origin]
        while todo:
            index = todo.pop()
            if index not in seen:
                seen.append(index)
                todo.extend(self.producers[index].parents)
        return sorted(seen)

    def resolve(self, origin: int, consequence: Consequence) -> Event | None:
        """Settle ``origin`` (a note can still become a failure, never the reverse); the event when it changed."""
        producer = self.producers[origin]
        if producer.resolved is not None and (producer.resolved not in NOTES or consequence in NOTES):
            return None
        producer.resolved = consequence
        level: Level = "ok" if consequence in NOTES else "fail"
        history = producer.event.history if level == "fail" else ()
        return dataclasses.replace(producer.event, level=level, consequence=consequence, history=history)
