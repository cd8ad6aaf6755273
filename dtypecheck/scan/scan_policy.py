"""The project's policy applied to a finished scan: ignore rules and tolerated underflow, with reasons kept.

Counts are never changed, only the levels they carry: a report still shows the 3 values that flush to zero in
float16, and says which rule let them pass. The dtype-consistency findings are added here too, since they judge
the checkpoint as a whole after every tensor's statistics are known.
"""

from __future__ import annotations

import dataclasses

from dtypecheck.config import ScanPolicy
from dtypecheck.loaders.base import Finding
from dtypecheck.scan.consistency import consistency_findings
from dtypecheck.scan.scan_report import Float8CastCounts, Level, ScanReport, TensorScan, summarise, worst


def _judge(tensor: TensorScan, policy: ScanPolicy) -> TensorScan:
    notes: list[str] = []
    own: Level = "ok"
    if (tensor.nan or 0) + (tensor.posinf or 0) + (tensor.neginf or 0):
        rule = policy.ignored(tensor.name, "nonfinite")
        if rule is None:
            own = "fail"
        else:
            notes.append(f"nan/inf ignored by '{rule.pattern}': {rule.reason}")
    casts = {}
    for target, cast in tensor.casts.items():
        counts = {"overflow": cast.overflow, "underflow": cast.underflow, "subnormal": cast.subnormal}
        if isinstance(cast, Float8CastCounts):
            counts["scaled_underflow"] = cast.scaled_underflow
        failing = warning = 0
        for check, count in counts.items():
            if not count:
                continue
            rule = policy.ignored(tensor.name, check, target)
            if rule is not None:
                notes.append(f"{check} in {target} ignored by '{rule.pattern}': {rule.reason}")
            elif policy.tolerated(check, target, count, tensor.numel):
                notes.append(f"{check} in {target} tolerated: {count} of {tensor.numel} within max-{check}-fraction")
            elif check == "overflow":
                failing += count
            else:
                warning += count
        level: Level = "fail" if failing else "warn" if warning else "ok"
        casts[target] = dataclasses.replace(cast, level=level)
    return dataclasses.replace(
        tensor, casts=casts, level=worst([own, *(c.level for c in casts.values())]), policy=tuple(notes)
    )


def apply_policy(report: ScanReport, policy: ScanPolicy | None = None) -> ScanReport:
    """Re-judge every tensor under ``policy`` and add the dtype-consistency findings."""
    tensors = (
        report.tensors if policy is None or policy == ScanPolicy() else tuple(_judge(t, policy) for t in report.tensors)
    )
    extra = [
        Finding(f.kind, "warn", f"{f.pattern}: {f.detail}", f.tensors[0] if len(f.tensors) == 1 else None)
        for f in consistency_findings(tensors)
    ]
    findings = (*report.findings, *extra)
    return dataclasses.replace(report, tensors=tensors, findings=findings, summary=summarise(tensors, findings))
