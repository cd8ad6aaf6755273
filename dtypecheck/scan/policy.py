"""The project's policy applied to a finished scan: roles, ignore rules and tolerated underflow, with reasons kept.

Counts are never changed, only the levels they carry: a report still shows the 3 values that flush to zero in
float16, and says which rule let them pass. A tensor whose role keeps it in its own dtype (``roles``: step
counters, RNG state...) has its casts reported and not judged. The dtype-consistency findings are added here too,
since they judge the checkpoint as a whole after every tensor's statistics are known.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final

from dtypecheck.config import ScanPolicy
from dtypecheck.findings import Check, Finding, level_of_counts, worst
from dtypecheck.scan.consistency import consistency_findings
from dtypecheck.scan.report import (
    CastCounts,
    Float8CastCounts,
    ScanReport,
    TensorScan,
    cast_counts,
    check_key,
    nonfinite,
    summarise,
)
from dtypecheck.scan.roles import RoleRule

HARM_FRACTION: Final[Mapping[Check, float]] = {"underflow": 1e-3, "subnormal": 1e-2, "scaled_underflow": 1e-3}
"""What a ``warn`` means (docs/contract.md "Levels"): a cast check of level warn counts only when more than this
share of a tensor's values is hit: more than 0.1% flushed to zero (after per-tensor scaling for float8/fp4, the way
those formats are used), or more than 1% left subnormal. A few hundred subnormals among millions of weights harm
nothing, and every healthy checkpoint has them; the counts are reported all the same. A project's own
``max-underflow-fraction`` / ``max-subnormal-fraction`` for a target replaces this rule for it (0: every value
counts). Overflow and NaN/inf always fail."""


def with_role(tensor: TensorScan, rule: RoleRule | None) -> TensorScan:
    """The tensor with its role (``roles.assign_roles``) and, where the role is not judged, why."""
    if rule is None:
        return tensor
    return dataclasses.replace(tensor, role=rule.role, not_judged=rule.not_judged, role_rule=rule)


def harmless(check: Check, target: str, count: int, tensor: TensorScan, cast: CastCounts, policy: ScanPolicy) -> bool:
    """Whether ``count`` values hit by ``check`` in ``target`` stay below what harms (``HARM_FRACTION``), where the
    project set no limit of its own for that check and target."""
    configured = {"underflow": policy.max_underflow_fraction, "subnormal": policy.max_subnormal_fraction}
    if check not in HARM_FRACTION or target in configured.get(check, {}):
        return False
    if isinstance(cast, Float8CastCounts) and check in ("underflow", "subnormal"):
        return True  # float8/fp4 is cast scaled: what it loses unscaled is reported, scaled_underflow is judged
    values = tensor.numel * (2 if tensor.dtype.startswith("complex") else 1)
    return count <= HARM_FRACTION[check] * values


def _soft_counts(tensor: TensorScan) -> bool:
    return any(cast_counts(cast).get(check) for cast in tensor.casts.values() for check in HARM_FRACTION)


def _judge(tensor: TensorScan, policy: ScanPolicy) -> TensorScan:
    notes: list[str] = []
    passed: list[str] = []
    own = level_of_counts({"nonfinite": nonfinite(tensor)})
    if own != "ok" and not tensor.nan and tensor.role_rule is not None and tensor.role_rule.infinite_sentinel:
        own = "ok"  # reported in its counts, not judged: ±inf is how that state says "no score yet"
        notes.append("±inf is this trainer state's value for a score not yet set")
    if own != "ok":
        rule = policy.ignored(tensor.name, "nonfinite")
        if rule is not None:
            own = "ok"
            passed.append(check_key(None, "nonfinite"))
            notes.append(f"nan/inf ignored by '{rule.pattern}': {rule.reason}")
    casts = {}
    for target, cast in tensor.casts.items():
        gated: dict[str, int] = {}
        for check, count in cast_counts(cast).items():
            if not count:
                continue
            if tensor.not_judged is not None:
                passed.append(check_key(target, check))
                continue
            rule = policy.ignored(tensor.name, check, target)
            if rule is not None:
                notes.append(f"{check} in {target} ignored by '{rule.pattern}': {rule.reason}")
            elif policy.tolerated(check, target, count, tensor.numel):
                notes.append(f"{check} in {target} tolerated: {count} of {tensor.numel} within max-{check}-fraction")
            elif harmless(check, target, count, tensor, cast, policy):
                pass  # reported, not judged: below what harms (no note: every healthy checkpoint has these)
            else:
                gated[check] = count
                continue
            passed.append(check_key(target, check))
        casts[target] = dataclasses.replace(cast, level=level_of_counts(gated))
    return dataclasses.replace(
        tensor,
        casts=casts,
        level=worst([own, *(c.level for c in casts.values())]),
        policy=tuple(notes),
        passed=tuple(passed),
    )


def apply_policy(report: ScanReport, policy: ScanPolicy | None = None) -> ScanReport:
    """Re-judge every tensor under its role (given by the scan: ``roles.assign_roles``) and ``policy``, add the
    dtype-consistency findings."""
    plain = policy is None or policy == ScanPolicy()
    tensors = tuple(
        t if plain and t.not_judged is None and not _soft_counts(t) else _judge(t, policy or ScanPolicy())
        for t in report.tensors
    )
    extra = [
        Finding(f.kind, "warn", f"{f.pattern}: {f.detail}", f.tensors[0] if len(f.tensors) == 1 else None)
        for f in consistency_findings(tensors)
    ]
    findings = (*report.findings, *extra)
    return dataclasses.replace(
        report, tensors=tensors, findings=findings, summary=summarise(tensors, findings, report.summary.left_out)
    )
