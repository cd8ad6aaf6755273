"""One tensor's ``--precision`` measures, planned from its shape and merged chunk by chunk.

Casts that are not scaled (float16, bfloat16) are measured in the first pass, on the chunks the counts read, so
the default targets need no second pass; float8/float4 targets need the tensor's absmax (per-tensor scaling) and
whole rows (per channel, MX), so they are measured in the second pass that counts their scaled underflow.
With ``compiled`` the compiled loops run (``precision.compiled_cast_loss`` and ``blockscale``'s), else numpy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dtypecheck.dtypes import DtypeSpec
from dtypecheck.scan.blockscale import (
    chunk_unit,
    compiled_mx_loss,
    compiled_per_channel_loss,
    mx_loss,
    per_channel_loss,
    regroup,
)
from dtypecheck.scan.precision import Loss, compiled_cast_loss, plain_or_tensor_scaled
from dtypecheck.scan.report import SchemeVerdict

if TYPE_CHECKING:
    import torch


@dataclass
class Losses:
    """Per target name: the cast a scan judges, and (float8/float4 targets) per-channel and MX scaling."""

    cast: dict[str, Loss] = field(default_factory=dict)
    channel: dict[str, Loss] = field(default_factory=dict)
    mx: dict[str, Loss] = field(default_factory=dict)

    def add(self, other: Losses) -> None:
        for mine, theirs in ((self.cast, other.cast), (self.channel, other.channel), (self.mx, other.mx)):
            for name, loss in theirs.items():
                mine.setdefault(name, Loss()).add(loss)


class MeasurePlan:
    """What to measure for one tensor: every float target's cast, and block scalings of the scaled ones."""

    def __init__(
        self, shape: tuple[int, ...], values_per_element: int, targets: Sequence[DtypeSpec], *, compiled: bool = False
    ) -> None:
        floats = [t for t in targets if t.kind == "float"]
        self.unscaled = [t for t in floats if not t.scaled]
        self.scaled = [t for t in floats if t.scaled]
        self.channel_row, self.mx_row = chunk_unit(shape, values_per_element)
        self.unit = self.channel_row or self.mx_row
        self._cast = compiled_cast_loss if compiled else plain_or_tensor_scaled
        self._channel = compiled_per_channel_loss if compiled else per_channel_loss
        self._mx = compiled_mx_loss if compiled else mx_loss

    def regroup(self, chunks: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
        """The tensor's chunks cut on whole rows (as they come when they already are)."""
        return regroup(chunks, self.unit) if self.unit else chunks

    def measure_unscaled(self, values: np.ndarray) -> Losses | None:
        """The first pass's losses of one chunk (any cut): the plain casts; None when there are none."""
        if not self.unscaled:
            return None
        part = Losses()
        for target in self.unscaled:
            part.cast[target.name] = self._cast(values, target, 0.0)
        return part

    def measure(self, values: np.ndarray, absmax: float) -> Losses:
        """The second pass's losses of one chunk (``values``: its flat float32/float64 values, starting on a row):
        the scaled casts, per tensor, per channel and in MX blocks."""
        part = Losses()
        for target in self.scaled:
            part.cast[target.name] = self._cast(values, target, absmax)
            if self.channel_row:
                part.channel[target.name] = self._channel(values, self.channel_row, target)
            if self.mx_row:
                part.mx[target.name] = self._mx(values, self.mx_row, target)
        return part

    @staticmethod
    def cast_fields(losses: Losses, target: DtypeSpec) -> dict[str, Any]:
        """The precision fields of one target's ``CastCounts`` (keyword arguments)."""
        loss = losses.cast.get(target.name)
        if loss is None:
            return {}
        found: dict[str, Any] = {"sqnr_db": loss.sqnr_db, "max_rel_error": loss.max_rel_error}
        if target.scaled:
            found["per_channel"] = _verdict(losses.channel.get(target.name))
            found["mx"] = _verdict(losses.mx.get(target.name))
        return found


def _verdict(loss: Loss | None) -> SchemeVerdict | None:
    if loss is None:
        return None
    return SchemeVerdict(loss.underflow, loss.overflow, loss.sqnr_db, loss.max_rel_error)
