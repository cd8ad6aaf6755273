"""The "keep these in float32" list: tensors that no requested 16-bit or narrower target holds well.

A target does not hold a float32/float64 tensor when, after the project's policy:

- its cast ``fail``s (values overflow the target's max); or
- it flushes at least ``FLUSHED_FRACTION`` of the tensor's nonzero values to zero (for float8/float4 targets:
  even after per-tensor scaling, ``scaled_underflow``); or
- with ``--precision``, its SQNR is below ``min_sqnr_db`` (``--keep-float32-sqnr``, config
  ``keep-float32-sqnr-db``; default ``DEFAULT_MIN_SQNR_DB``): the error's energy is more than 1% of the signal's.

A tensor is listed when *every* requested narrow float target fails it this way, with the reason per target:
typically norm weights and biases with tiny values, or embeddings with huge ones, where the usual answer is to keep
that tensor in float32 and cast the rest. A tensor's own NaN/inf is no reason (float32 would not help), and a
tensor already stored in 16 bits or fewer is not a candidate.
"""

from __future__ import annotations

import dataclasses

from dtypecheck.dtypes import lookup
from dtypecheck.errors import UnknownDtypeError
from dtypecheck.scan.report import CastCounts, Float8CastCounts, KeepFloat32, ScanReport, TensorScan, severity

DEFAULT_MIN_SQNR_DB = 20.0
"""Below this SQNR a cast is judged to lose too much (quantisation noise above 1% of the signal's energy)."""
FLUSHED_FRACTION = 0.01
"""A target that flushes at least this share of a tensor's nonzero values to zero does not hold it."""


def _narrow(target: str) -> bool:
    try:
        spec = lookup(target)
    except UnknownDtypeError:
        return False
    return spec.kind == "float" and spec.fmt.bits < 32


def _wide(tensor: TensorScan) -> bool:
    try:
        spec = lookup(tensor.dtype)
    except UnknownDtypeError:
        return False
    return spec.kind == "float" and spec.fmt.bits >= 32


def _problem(tensor: TensorScan, cast: CastCounts, min_sqnr_db: float) -> str | None:
    """Why ``cast`` does not hold ``tensor`` (one phrase), or None when it does."""
    if cast.level == "fail" and cast.overflow:
        return f"{cast.overflow} value(s) overflow"
    nonzero = tensor.numel - (tensor.zeros or 0) - (tensor.nan or 0) - (tensor.posinf or 0) - (tensor.neginf or 0)
    flushed = cast.scaled_underflow if isinstance(cast, Float8CastCounts) else cast.underflow
    if flushed and nonzero > 0 and flushed >= FLUSHED_FRACTION * nonzero:
        how = " even after scaling" if isinstance(cast, Float8CastCounts) else ""
        return f"{100 * flushed / nonzero:.3g}% of nonzero values flushed to zero{how}"
    if cast.sqnr_db is not None and cast.sqnr_db < min_sqnr_db:
        return f"SQNR {cast.sqnr_db:.1f} dB < {min_sqnr_db:g} dB"
    return None


def keep_float32(report: ScanReport, min_sqnr_db: float = DEFAULT_MIN_SQNR_DB) -> tuple[KeepFloat32, ...]:
    """The tensors of ``report`` that every requested narrow float target fails to hold, worst first."""
    narrow = [t for t in report.targets if _narrow(t)]
    if not narrow:
        return ()
    found = []
    for tensor in sorted(report.tensors, key=severity):
        if not _wide(tensor) or not tensor.numel or tensor.not_judged is not None or tensor.alias_of is not None:
            continue
        reasons = []
        for target in narrow:
            cast = tensor.casts.get(target)
            problem = None if cast is None or cast.overflow is None else _problem(tensor, cast, min_sqnr_db)
            if problem is None:
                break
            reasons.append(f"{target}: {problem}")
        else:
            found.append(KeepFloat32(tensor.name, "; ".join(reasons)))
    return tuple(found)


def with_keep_float32(report: ScanReport, min_sqnr_db: float = DEFAULT_MIN_SQNR_DB) -> ScanReport:
    """``report`` with its summary's ``keep_float32`` list filled in (after the policy has set the levels)."""
    summary = dataclasses.replace(report.summary, keep_float32=keep_float32(report, min_sqnr_db))
    return dataclasses.replace(report, summary=summary)
