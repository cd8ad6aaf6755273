"""Findings of any report as flat diagnostics: one rule id per check, for SARIF and CI annotations.

Read from the typed reports (the same objects the JSON is written from), so SARIF and GitHub annotations say
exactly what the JSON says: with a baseline, only what it marks new or worse; never a check the project's
policy ignored or tolerated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from dtypecheck.findings import CHECK_LEVEL, CHECK_RULE, RULE_BY_ID, RULES, Level, Rule, Severity, finding_rule
from dtypecheck.info import InfoReport
from dtypecheck.nantrace.checks import check_of
from dtypecheck.nantrace.report import Event, Location, NanTraceReport
from dtypecheck.scan.report import GATED_STATES, ScanReport, State, finding_key, gated_checks

__all__ = ["RULES", "RULE_BY_ID", "Diagnostic", "Rule", "Severity", "diagnostics", "report_level"]


def _event_rule(kind: str) -> str:
    """The rule of a nan-trace kind, from its check's registry entry; an unregistered kind or one without a rule
    (a level-``ok`` note) is a bug, never a silent default."""
    try:
        rule = check_of(kind).rule
    except KeyError:
        raise ValueError(f"nan-trace kind {kind!r} has no registered check (nantrace.checks)") from None
    if rule is None:
        raise ValueError(f"nan-trace kind {kind!r} is a note and has no SARIF rule")
    return rule


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
            else:
                message = f"{name}: {count} of {tensor.numel} values {check} in {target}"
            rule_id = CHECK_RULE[check]
            yield Diagnostic(rule_id, _severity(CHECK_LEVEL[check]), message, source, None, name, state)
    for finding in report.findings:
        if finding.level == "ok":
            continue
        shown, state = state_of(finding.tensor, finding_key(finding))
        if not shown:
            continue
        rule_id = finding_rule(finding.kind)
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
    return Diagnostic(_event_rule(event.kind), level, message, *_at(event.location), where)


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
        yield Diagnostic(_event_rule("float64_promotion"), "warn", message, *_at(promotion.location), promotion.module)
    error = report.dtype_error
    if error:
        message = f"{error.exception}; fix: {error.fix}"
        yield Diagnostic(_event_rule("dtype_mismatch"), "fail", message, *_at(error.location), error.module or error.op)


def _info(report: InfoReport) -> Iterator[Diagnostic]:
    for dtype in report.dtypes:
        for mismatch in dtype.mismatches:
            message = (
                f"torch.finfo({dtype.name}).{mismatch.field} is {mismatch.torch}, "
                f"the format's true value is {mismatch.true}"
            )
            yield Diagnostic(finding_rule("finfo-mismatch"), "note", message, None, None, dtype.name)


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
