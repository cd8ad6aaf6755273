"""A planted late overflow for the framework tests: an activation that blows up on its N-th training call.

The counter is a buffer, so that watch mode's replay (which puts the buffers back) sees the same call again.
"""

from __future__ import annotations

import torch


class PlantedOverflow(torch.nn.Module):
    calls: torch.Tensor

    def __init__(self, inner: torch.nn.Module, at_call: int) -> None:
        super().__init__()
        self.inner = inner
        self.at_call = at_call
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
        y: torch.Tensor = self.inner(x)
        if self.training and int(self.calls) == self.at_call:
            y = y * 1e30 * 1e30  # planted overflow
        return y
