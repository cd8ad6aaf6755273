"""A format's true values from its bit layout, and where ``torch.finfo``/``torch.iinfo`` disagree with them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dtypecheck.dtypes import FloatFormat
from dtypecheck.info.report import Mismatch, Number

if TYPE_CHECKING:
    import torch


def true_finfo(fmt: FloatFormat) -> dict[str, Number]:
    """The ``torch.finfo`` fields as the bit layout defines them."""
    return {
        "bits": fmt.bits,
        "eps": fmt.eps,
        "max": fmt.max,
        "min": fmt.min,
        "smallest_normal": fmt.smallest_normal,
        "resolution": fmt.resolution,
    }


def torch_finfo(dtype: torch.dtype) -> dict[str, Number] | None:
    """What ``torch.finfo`` reports, or ``None`` where it raises."""
    import torch

    # Some dtypes construct a finfo whose attributes then raise (float4), so read them all inside the try.
    try:
        info = torch.finfo(dtype)
        return {
            "bits": int(info.bits),
            "eps": float(info.eps),
            "max": float(info.max),
            "min": float(info.min),
            "smallest_normal": float(info.smallest_normal),
            "resolution": float(info.resolution),
        }
    except (TypeError, RuntimeError, NotImplementedError):
        return None


def torch_iinfo(dtype: torch.dtype) -> dict[str, Number] | None:
    """What ``torch.iinfo`` reports, or ``None`` where it raises (sub-byte integers)."""
    import torch

    try:
        info = torch.iinfo(dtype)
        return {"bits": int(info.bits), "min": int(info.min), "max": int(info.max)}
    except (TypeError, RuntimeError, NotImplementedError):
        return None


def mismatches(reported: Mapping[str, Number] | None, truth: Mapping[str, Number]) -> tuple[Mismatch, ...]:
    """Every field torch reports that differs from the truth (none when torch reports nothing)."""
    if reported is None:
        return ()
    return tuple(Mismatch(k, reported[k], truth[k]) for k in reported if k in truth and reported[k] != truth[k])
