"""The project's policy applied to a finished scan: roles, ignore rules and tolerated underflow, with reasons kept.

Counts are never changed, only the levels they carry: a report still shows the 3 values that flush to zero in
float16, and says which rule let them pass. A tensor whose role keeps it in its own dtype (``roles``: step
counters, RNG state...) has its casts reported and not judged. The dtype-consistency findings are added here too,
since they judge the checkpoint as a whole after every tensor's statistics are known.
"""

from __future__ import annotations

import dataclasses

from dtypecheck.config import ScanPolicy
from dtypecheck.findings import Finding, level_of_counts, worst
from dtypecheck.scan.consistency import consistency_findings
from dtypecheck.scan.report import ScanReport, TensorScan, cast_counts, check_key, nonfinite, summarise
from dtypecheck.scan.roles import RoleRule


def with_role(tensor: TensorScan, rule: RoleRule | None) -> TensorScan:
    """The tensor with its role (``roles.assign_roles``) and, where the role is not judged, why."""
    if rule is None:
        return tensor
    return dataclasses.replace(tensor, role=rule.role, not_judged=rule.not_judged)


def _judge(tensor: TensorScan, policy: ScanPolicy) -> TensorScan:
    notes: list[str] = []
    passed: list[str] = []
    own = level_of_counts({"nonfinite": nonfinite(tensor)})
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
    tensors = tuple(t if plain and t.not_judged is None else _judge(t, policy or ScanPolicy()) for t in report.tensors)
    extra = [
        Finding(f.kind, "warn", f"{f.pattern}: {f.detail}", f.tensors[0] if len(f.tensors) == 1 else None)
        for f in consistency_findings(tensors)
    ]
    findings = (*report.findings, *extra)
    return dataclasses.replace(
        report, tensors=tensors, findings=findings, summary=summarise(tensors, findings, report.summary.left_out)
    )
