"""``--fit``: device memory by name or size, and the reserve the runtime and the caching allocator hold back."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from dtypecheck.errors import ParameterError

GIB = 2**30

DEVICES: dict[str, int] = {
    "h200": 141 * 10**9,
    "h100-94gb": 94 * GIB,
    "h100-80gb": 80 * GIB,
    "a100-80gb": 80 * GIB,
    "a100-40gb": 40 * GIB,
    "l40s": 48 * GIB,
    "a10g": 24 * GIB,
    "l4": 24 * GIB,
    "t4": 16 * GIB,
    "v100-32gb": 32 * GIB,
    "v100-16gb": 16 * GIB,
    "rtx4090": 24 * GIB,
    "rtx3090": 24 * GIB,
    "rtx4080": 16 * GIB,
    "mi300x": 192 * GIB,
    "mi250x": 128 * GIB,
}
"""Nominal memory of common accelerators (what the product name says; the H200's 141 GB is decimal). The driver
keeps a little of it, which the reserve covers."""

DEFAULT_RESERVE = "1GiB+5%"
"""The CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers take about 0.5-1 GiB outside PyTorch's allocator;
the caching allocator's rounding and fragmentation typically cost a few percent of what it holds."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str, what: str) -> int:
    """``80GiB``, ``24GB`` (decimal), ``1.5TiB``, ``4096`` (bytes) -> bytes; ``what`` names the parameter."""
    found = _SIZE.match(text)
    unit = found["unit"].lower() if found else ""
    if found is None or unit not in _UNITS:
        raise ParameterError(f"{{{what}}} {text!r}: expected a size such as 80GiB or 24GB")
    return int(float(found["number"]) * _UNITS[unit])


@dataclass(frozen=True)
class DeviceBudget:
    """One device's memory and what of it a training or inference step may use."""

    name: str
    capacity_bytes: int
    reserve_bytes: int
    accelerator: bool
    """Named as a GPU (its step runs on CUDA: torch's foreach optimizers by default)."""

    @property
    def usable_bytes(self) -> int:
        return self.capacity_bytes - self.reserve_bytes


def parse_reserve(text: str, capacity: int) -> int:
    """``2GiB``, ``10%`` (of the device), or both joined by ``+`` -> bytes."""
    total = 0
    for part in (piece.strip() for piece in text.split("+")):
        if part.endswith("%"):
            try:
                percent = float(part[:-1])
            except ValueError:
                raise ParameterError(f"{{reserve}} {text!r}: {part!r} is not a percentage") from None
            if not 0 <= percent < 100:
                raise ParameterError(f"{{reserve}} {text!r}: a percentage must be from 0 to below 100")
            total += int(capacity * percent / 100)
        else:
            total += parse_size(part, "reserve")
    return total


def parse_fit(target: str, reserve: str | None) -> DeviceBudget:
    """A device name from ``DEVICES`` or a size, with ``reserve`` (default ``DEFAULT_RESERVE``) held back."""
    key = target.strip().lower()
    if key in DEVICES:
        capacity, accelerator = DEVICES[key], True
    elif key[:1].isdigit():
        capacity, accelerator = parse_size(target, "fit"), False
    else:
        close = [name for name in DEVICES if name.startswith(key)] or difflib.get_close_matches(key, DEVICES, n=1)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else f" (known: {', '.join(DEVICES)})"
        raise ParameterError(f"{{fit}} {target!r}: not a size or a known device{hint}")
    held = parse_reserve(reserve or DEFAULT_RESERVE, capacity)
    if held >= capacity:
        raise ParameterError(f"{{reserve}} {reserve or DEFAULT_RESERVE!r} leaves nothing of {target}")
    return DeviceBudget(key if accelerator else target.strip(), capacity, held, accelerator)


def default_device() -> str:
    """Where an unspecified step runs: CUDA when this machine has it."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
