"""The dtype census of a checkpoint and the mixed-dtype patterns that bite.

Pure functions over per-tensor summaries (name, dtype, element and byte counts, min/max), so the scanner can
call them after its pass and tests can feed them by hand.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dtypecheck.dtypes import lookup

# Optimizer state as torch, Lightning, DeepSpeed and HF Trainer name it.
_OPTIMIZER_STATE = re.compile(
    r"(^|\.)(optimizer|optimizer_states|optim|opt)(\.|$)|(^|\.)state\.\d+\.|exp_avg|momentum_buffer|square_avg"
)
_NORM_BUFFER = re.compile(r"(^|\.)(running_var|running_mean|moving_var|moving_mean|running_std)$")
_NEAR_FRACTION = 0.5
_INT32 = (-(2**31), 2**31 - 1)


class TensorSummary(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def numel(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def min(self) -> float | int | None: ...
    @property
    def max(self) -> float | int | None: ...


@dataclass(frozen=True)
class CensusRow:
    dtype: str
    tensors: int
    numel: int
    bytes: int


@dataclass(frozen=True)
class ConsistencyFinding:
    kind: str
    """Always ``dtype-consistency``; ``pattern`` says which."""
    pattern: str
    """``minority-dtype``, ``optimizer-precision``, ``norm-buffer-range``, ``integer-narrowing``."""
    level: str
    detail: str
    tensors: tuple[str, ...]


def is_optimizer_state(name: str, role: str = "model") -> bool:
    """Optimizer or trainer state, not the model's own tensors (the names above, or a role other than the model's
    from ``roles.assign_roles``)."""
    return role != "model" or bool(_OPTIMIZER_STATE.search(name))


def _is_state(tensor: TensorSummary) -> bool:
    return is_optimizer_state(tensor.name, getattr(tensor, "role", "model"))


def census(tensors: Iterable[TensorSummary]) -> tuple[CensusRow, ...]:
    """Tensors, elements and bytes per dtype, largest share of bytes first."""
    rows: dict[str, list[int]] = {}
    for t in tensors:
        row = rows.setdefault(t.dtype, [0, 0, 0])
        row[0] += 1
        row[1] += t.numel
        row[2] += t.bytes
    ordered = sorted(rows.items(), key=lambda item: (-item[1][2], item[0]))
    return tuple(CensusRow(dtype, n, numel, nbytes) for dtype, (n, numel, nbytes) in ordered)


def _names(tensors: Sequence[TensorSummary], limit: int = 5) -> str:
    shown = ", ".join(t.name for t in tensors[:limit])
    return shown + (f" and {len(tensors) - limit} more" if len(tensors) > limit else "")


def _itemsize(dtype: str) -> int:
    return lookup(dtype).itemsize_bits


def _is_float(dtype: str) -> bool:
    return lookup(dtype).kind == "float"


def majority_float_dtype(tensors: Iterable[TensorSummary]) -> str | None:
    """The dtype holding most elements among the model's own float tensors (optimizer state left out)."""
    counts: Counter[str] = Counter()
    for t in tensors:
        if _is_float(t.dtype) and not _is_state(t):
            counts[t.dtype] += t.numel
    return counts.most_common(1)[0][0] if counts else None


def consistency_findings(tensors: Sequence[TensorSummary]) -> list[ConsistencyFinding]:
    found: list[ConsistencyFinding] = []
    majority = majority_float_dtype(tensors)
    model = [t for t in tensors if not _is_state(t)]
    if majority is not None:
        odd: dict[str, list[TensorSummary]] = {}
        for t in model:
            if _is_float(t.dtype) and t.dtype != majority and not _NORM_BUFFER.search(t.name):
                odd.setdefault(t.dtype, []).append(t)
        for dtype, members in sorted(odd.items()):
            more = (
                "doubles memory and time where it meets the rest"
                if _itemsize(dtype) > _itemsize(majority)
                else ("silently promotes or mismatches where it meets the rest")
            )
            found.append(
                ConsistencyFinding(
                    "dtype-consistency",
                    "minority-dtype",
                    "warn",
                    f"{len(members)} {dtype} tensor(s) in a {majority} model ({more}): {_names(members)}",
                    tuple(t.name for t in members),
                )
            )
        low_state = [
            t for t in tensors if _is_state(t) and _is_float(t.dtype) and _itemsize(t.dtype) < _itemsize(majority)
        ]
        if low_state:
            dtypes = ", ".join(sorted({t.dtype for t in low_state}))
            found.append(
                ConsistencyFinding(
                    "dtype-consistency",
                    "optimizer-precision",
                    "warn",
                    f"{len(low_state)} optimizer state tensor(s) in {dtypes}, below the {majority} parameters "
                    f"(second moments underflow; keep optimizer state in float32): {_names(low_state)}",
                    tuple(t.name for t in low_state),
                )
            )
    found += _norm_buffers(tensors) + _integer_narrowing(tensors)
    return found


def _norm_buffers(tensors: Sequence[TensorSummary]) -> list[ConsistencyFinding]:
    found = []
    for t in tensors:
        if not _NORM_BUFFER.search(t.name) or not _is_float(t.dtype) or t.max is None or t.min is None:
            continue
        limit = lookup(t.dtype).fmt.max
        absmax = max(abs(float(t.max)), abs(float(t.min)))
        if absmax >= _NEAR_FRACTION * limit:
            found.append(
                ConsistencyFinding(
                    "dtype-consistency",
                    "norm-buffer-range",
                    "warn",
                    f"{t.name}: values up to {absmax:g} in {t.dtype}, whose max is {limit:g}: "
                    "normalisation statistics need float32",
                    (t.name,),
                )
            )
    return found


def _integer_narrowing(tensors: Sequence[TensorSummary]) -> list[ConsistencyFinding]:
    found = []
    for t in tensors:
        spec = lookup(t.dtype)
        if spec.kind not in ("int", "uint") or spec.bits <= 32 or t.max is None or t.min is None:
            continue
        if int(t.max) > _INT32[1] or int(t.min) < _INT32[0]:
            found.append(
                ConsistencyFinding(
                    "dtype-consistency",
                    "integer-narrowing",
                    "warn",
                    f"{t.name}: {t.dtype} values in [{int(t.min):,}, {int(t.max):,}] overflow int32 "
                    "if narrowed (exporters and index kernels often do)",
                    (t.name,),
                )
            )
    return found


def census_as_mapping(rows: Iterable[CensusRow]) -> Mapping[str, Mapping[str, int]]:
    return {r.dtype: {"tensors": r.tensors, "numel": r.numel, "bytes": r.bytes} for r in rows}
