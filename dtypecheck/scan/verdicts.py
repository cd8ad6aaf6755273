"""One verdict per target: "will this checkpoint survive in float16?" answered in a line, from the exact counts.

Over the tensors whose casts are judged (``not_judged`` ones are left out: their role keeps them in their own
dtype). A tensor's level for a target is the worst of its own values (NaN/inf: ``fail``) and its cast to that
target, as the policy left them; tensors without a cast to the target (integer tensors against a float target)
do not count. The advice, first rule that applies:

1. some tensor already holds NaN/inf: "fix first: N tensor(s) already hold NaN/inf; then " and the advice of the
   rules below for the other tensors (no cast helps those N);
2. nothing at ``warn`` or ``fail``: "safe to cast" ("nothing to judge: ..." when no tensor is cast to the target:
   an empty checkpoint, or only integers and bookkeeping);
3. no ``fail`` on a float8/fp4 target, the scaled verdict first (how those formats are used): "cast with
   per-tensor scaling; S% of values flush to zero after per-tensor scaling (U% unscaled)";
   only ``warn`` on another target: "cast; X% of values flush to zero" (or "N values become subnormal"); counts
   below what harms (``policy.HARM_FRACTION``) leave it at "safe to cast" and are named after it;
4. ``fail`` on a float8/fp4 target (judged per tensor scaled to the target's max, as fp8 is used): "needs per-tensor
   scaling";
5. ``fail`` in at most ``KEEP_AT_MOST`` of the tensors (and at most a tenth of them): "cast, keep these N tensors in
   float32" (the tensors whose level is ``fail``);
6. otherwise "not representable: N of M tensors overflow".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dtypecheck.dtypes import lookup
from dtypecheck.errors import UnknownDtypeError
from dtypecheck.findings import Level, worst
from dtypecheck.scan.report import Float8CastCounts, ScanReport, TensorScan, Verdict, check_key, nonfinite, severity

KEEP_AT_MOST = 10
"""Beyond this many failing tensors (or a tenth of them), keeping them in float32 is no longer a cast."""


def _values(tensor: TensorScan) -> int:
    """Values a cast counts over: complex tensors count both parts."""
    return tensor.numel * (2 if tensor.dtype.startswith("complex") else 1)


def _own_level(tensor: TensorScan) -> Level:
    if not nonfinite(tensor) or check_key(None, "nonfinite") in tensor.passed:
        return "ok"
    return "fail"


def _scaled(target: str) -> bool:
    try:
        return lookup(target).scaled
    except UnknownDtypeError:
        return False


def verdict(target: str, tensors: Sequence[TensorScan]) -> Verdict:
    """The verdict for one target over ``tensors`` (the report's, in any order)."""
    judged = [
        (t, t.casts[target]) for t in tensors if t.not_judged is None and t.alias_of is None and target in t.casts
    ]
    judged = [(t, cast) for t, cast in judged if cast.overflow is not None]  # empty tensors have no counts
    levels = {t.name: worst([_own_level(t), cast.level]) for t, cast in judged}
    by_level = {level: sum(1 for name in levels if levels[name] == level) for level in ("ok", "warn", "fail")}
    overflow = sum(cast.overflow or 0 for _, cast in judged)
    underflow = sum(cast.underflow or 0 for _, cast in judged)
    subnormal = sum(cast.subnormal or 0 for _, cast in judged)
    values = sum(_values(t) for t, _ in judged)
    scaled = [cast.scaled_underflow or 0 for _, cast in judged if isinstance(cast, Float8CastCounts)]
    level = worst(levels.values())

    at_worst = [t for t, _ in judged if levels[t.name] == level]
    worst_tensor = min(at_worst, key=severity).name if level != "ok" else None
    return Verdict(
        target=target,
        level=level,
        overflow=overflow,
        underflow=underflow,
        subnormal=subnormal,
        fraction_flushed=underflow / values if values else 0.0,
        tensors=by_level,
        worst=worst_tensor,
        advice=_advice(target, [t for t, _ in judged], levels),
        scaled_underflow=sum(scaled) if scaled else None,
    )


def _advice(target: str, judged: Sequence[TensorScan], levels: dict[str, Level]) -> str:
    broken = {t.name for t in judged if _own_level(t) == "fail"}
    if broken:
        rest = [t for t in judged if t.name not in broken]
        then = _cast_advice(target, rest, {t.name: levels[t.name] for t in rest})
        return f"fix first: {len(broken)} tensor(s) already hold NaN/inf; then {then}"
    return _cast_advice(target, judged, levels)


def _share(count: int, values: int) -> str:
    return f"{100 * count / values:.2g}%" if values else "0%"


def _cast_advice(target: str, judged: Sequence[TensorScan], levels: dict[str, Level]) -> str:
    """The advice over ``judged`` (the tensors it is about: without those already broken), from their counts."""
    casts = [t.casts[target] for t in judged]
    underflow = sum(c.underflow or 0 for c in casts)
    subnormal = sum(c.subnormal or 0 for c in casts)
    values = sum(_values(t) for t in judged)
    scaled_casts = [c.scaled_underflow or 0 for c in casts if isinstance(c, Float8CastCounts)]
    scaled = sum(scaled_casts) if scaled_casts else None
    failing = [name for name, level in levels.items() if level == "fail"]
    if not judged:
        return "nothing to judge: no tensor of the checkpoint is cast to this target"
    if not failing and scaled is not None:
        if not scaled and not underflow:
            return "safe to cast with per-tensor scaling"
        unscaled = f" ({_share(underflow, values)} unscaled)" if underflow else ""
        if not scaled:
            return f"cast with per-tensor scaling; nothing flushes to zero after scaling{unscaled}"
        return f"cast with per-tensor scaling; {_share(scaled, values)} of values flush to zero after scaling{unscaled}"
    if not failing and "warn" in levels.values():
        if underflow:
            return f"cast; {_share(underflow, values)} of values flush to zero"
        return f"cast; {subnormal:,} values become subnormal"
    if not failing:
        if not underflow and not subnormal:
            return "safe to cast"
        below = [f"{subnormal:,} values become subnormal"] if subnormal else []
        below += [f"{_share(underflow, values)} flush to zero"] if underflow else []
        return f"safe to cast ({', '.join(below)}: below what harms)"
    if _scaled(target):
        return "needs per-tensor scaling"
    if len(failing) <= min(KEEP_AT_MOST, max(1, len(judged) // 10)):
        return f"cast, keep these {len(failing)} tensor(s) in float32: {', '.join(failing)}"
    return f"not representable: {len(failing)} of {len(judged)} tensors overflow"


def with_verdicts(report: ScanReport) -> ScanReport:
    """``report`` with its summary's ``verdicts``, one per target in the report's order."""
    verdicts = tuple(verdict(target, report.tensors) for target in report.targets)
    return dataclasses.replace(report, summary=dataclasses.replace(report.summary, verdicts=verdicts))


__all__ = ["KEEP_AT_MOST", "verdict", "with_verdicts"]
