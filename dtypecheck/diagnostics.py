"""Findings of any report as flat diagnostics: one rule id per check, for SARIF and CI annotations.

Read from the typed reports (the same objects the JSON is written from), so SARIF and GitHub annotations say
exactly what the JSON says: with a baseline, only what it marks new or worse; never a check the project's
policy ignored or tolerated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from dtypecheck.findings import CHECK_LEVEL, Check, Level
from dtypecheck.info import InfoReport
from dtypecheck.nantrace.report import Event, Location, NanTraceReport
from dtypecheck.scan.scan_report import GATED_STATES, ScanReport, State, finding_key, gated_checks

Severity = Literal["fail", "warn", "note"]


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    summary: str
    default_level: Severity


RULES: tuple[Rule, ...] = (
    Rule("DTC001", "finfo-mismatch", "torch.finfo disagrees with the dtype's true value", "note"),
    Rule("DTC101", "nonfinite-values", "The tensor already holds NaN or infinite values", "fail"),
    Rule("DTC102", "cast-overflow", "Values beyond the target dtype's max: inf (or silent saturation) on cast", "fail"),
    Rule("DTC103", "cast-underflow", "Nonzero values that round to zero in the target dtype", "warn"),
    Rule("DTC104", "cast-subnormal", "Values that become subnormal in the target dtype, losing precision", "warn"),
    Rule("DTC105", "scaled-underflow", "Values lost to zero in float8 even after per-tensor amax scaling", "warn"),
    Rule(
        "DTC110", "pickle-global", "The checkpoint's pickle references a global (code it would import or run)", "warn"
    ),
    Rule("DTC111", "checkpoint-structure", "The checkpoint's structure is inconsistent (index, shards, sizes)", "warn"),
    Rule("DTC120", "dtype-consistency", "Mixed or surprising dtypes in the model or its optimizer state", "warn"),
    Rule("DTC201", "nonfinite-producer", "An operator produced NaN or Inf from finite inputs", "fail"),
    Rule("DTC202", "near-overflow", "An operator's output came close to its dtype's max", "warn"),
    Rule("DTC203", "half-precision-underflow", "An operator's half-precision output was mostly lost to zero", "warn"),
    Rule("DTC204", "float64-promotion", "float64 entered a lower-precision program (memory and time double)", "warn"),
    Rule("DTC205", "dtype-mismatch", "The traced code died of a dtype mismatch between an op's inputs", "fail"),
)
RULE_BY_ID = {rule.id: rule for rule in RULES}
_CAST_RULES: dict[Check, str] = {
    "overflow": "DTC102",
    "underflow": "DTC103",
    "subnormal": "DTC104",
    "scaled_underflow": "DTC105",
}
_FINDING_RULES = {"pickle-global": "DTC110", "dtype-consistency": "DTC120"}
_EVENT_RULES = {"nan": "DTC201", "inf": "DTC201", "near_overflow": "DTC202", "underflow": "DTC203"}


@dataclass(frozen=True)
class Diagnostic:
    rule_id: str
    level: Severity
    message: str
    file: str | None
    """The artifact: the checkpoint or the source file."""
    line: int | None = None
    logical: str | None = None
    """Tensor name or module path."""
    baseline_state: State | None = None
    """``new``, ``worse``, ``unchanged`` or ``fixed`` when compared with a baseline."""

    @property
    def fingerprint(self) -> str:
        """Stable across runs for the same check on the same thing: lets code scanning track it."""
        key = f"{self.rule_id}|{self.logical or ''}|{self.message.split(':')[0]}"
        return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]  # names may hold lone surrogates


def _severity(level: Level) -> Severity:
    """A finding's level as a diagnostic's: ``ok`` is only ever a note."""
    return "note" if level == "ok" else level


def _scan(report: ScanReport) -> Iterator[Diagnostic]:
    source = report.source
    states = {(c.tensor, c.check): c.state for c in report.baseline.changes} if report.baseline else None

    def state_of(tensor: str | None, key: str) -> tuple[bool, State | None]:
        """Whether to annotate this check, and its baseline state: with a baseline, only new or worse ones."""
        if states is None:
            return True, None
        state = states.get((tensor, key))
        return state in GATED_STATES, state

    for tensor in report.tensors:
        name = tensor.name
        for key, check, target, count in gated_checks(tensor):
            shown, state = state_of(name, key)
            if not shown:
                continue
            if target is None:
                bad = {"nan": tensor.nan, "posinf": tensor.posinf, "neginf": tensor.neginf}
                counts = ", ".join(f"{v} {k}" for k, v in bad.items() if v)
                message = f"{name}: {counts} in {tensor.dtype}"
                rule_id = "DTC101"
            else:
                message = f"{name}: {count} of {tensor.numel} values {check} in {target}"
                rule_id = _CAST_RULES[check]
            yield Diagnostic(rule_id, _severity(CHECK_LEVEL[check]), message, source, None, name, state)
    for finding in report.findings:
        if finding.level == "ok":
            continue
        shown, state = state_of(finding.tensor, finding_key(finding))
        if not shown:
            continue
        rule_id = _FINDING_RULES.get(finding.kind, "DTC111")
        detail = f"{finding.kind}: {finding.detail}"
        yield Diagnostic(rule_id, _severity(finding.level), detail, source, None, finding.tensor, state)


def _at(location: Location | None) -> tuple[str | None, int | None]:
    return (location.file, location.line) if location is not None else (None, None)


def _event(event: Event, level: Severity) -> Diagnostic:
    where = event.module or event.op
    cause = f" ({event.cause})" if event.cause else ""
    message = f"{event.kind} from {event.op} in {event.phase}{cause}"
    if event.module:
        message += f" in module {event.module}"
    return Diagnostic(_EVENT_RULES.get(event.kind, "DTC201"), level, message, *_at(event.location), where)


def _nantrace(report: NanTraceReport) -> Iterator[Diagnostic]:
    first = report.first
    if first:
        yield _event(first, "fail")
    for event in report.events:
        if event != first and event.kind in ("nan", "inf"):
            yield _event(event, "fail")
    for event in report.warnings:
        yield _event(event, "warn")
    for promotion in report.promotions:
        created = promotion.created
        origin = f" (the float64 tensor was made at {created.file}:{created.line})" if created and created.file else ""
        message = f"{promotion.op} computes in float64 in a {promotion.dominant} program{origin}"
        yield Diagnostic("DTC204", "warn", message, *_at(promotion.location), promotion.module)
    error = report.dtype_error
    if error:
        message = f"{error.exception}; fix: {error.fix}"
        yield Diagnostic("DTC205", "fail", message, *_at(error.location), error.module or error.op)


def _info(report: InfoReport) -> Iterator[Diagnostic]:
    for dtype in report.dtypes:
        for mismatch in dtype.mismatches:
            message = (
                f"torch.finfo({dtype.name}).{mismatch.field} is {mismatch.torch}, "
                f"the format's true value is {mismatch.true}"
            )
            yield Diagnostic("DTC001", "note", message, None, None, dtype.name)


def diagnostics(report: object) -> list[Diagnostic]:
    """Every finding of a report, in report order (none for reports without findings, e.g. memory)."""
    if isinstance(report, ScanReport):
        return list(_scan(report))
    if isinstance(report, NanTraceReport):
        return list(_nantrace(report))
    if isinstance(report, InfoReport):
        return list(_info(report))
    return []


def report_level(report: object) -> str | None:
    """The level (scan) or status (nan-trace) a SARIF run carries as a property; None for other reports."""
    if isinstance(report, ScanReport):
        return report.summary.level
    if isinstance(report, NanTraceReport):
        return report.status
    return None
