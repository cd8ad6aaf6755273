"""Findings of any report as flat diagnostics: one rule id per check, for SARIF and CI annotations.

Built from the JSON document (the contract every command already honours), so every command's findings reach
SARIF and GitHub annotations through the same path as its JSON, with nothing per-command in the renderers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dtypecheck.findings import CHECK_LEVEL, Check, Level

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
    baseline_state: str | None = None
    """``new``, ``worse``, ``unchanged`` or ``fixed`` when compared with a baseline."""

    @property
    def fingerprint(self) -> str:
        """Stable across runs for the same check on the same thing: lets code scanning track it."""
        key = f"{self.rule_id}|{self.logical or ''}|{self.message.split(':')[0]}"
        return hashlib.sha256(key.encode()).hexdigest()[:32]


def _severity(level: Level) -> Severity:
    """A finding's level as a diagnostic's: ``ok`` is only ever a note."""
    return "note" if level == "ok" else level


def _level(value: Any, default: Severity = "warn") -> Severity:
    return value if value in ("fail", "warn", "note") else default


def _scan(doc: Mapping[str, Any]) -> Iterator[Diagnostic]:
    source = doc.get("source")
    changes = (doc.get("baseline") or {}).get("changes", [])
    states = {(c.get("tensor"), c.get("check")): c.get("state") for c in changes}
    for tensor in doc.get("tensors", []):
        name = tensor.get("name")
        bad = {k: tensor.get(k) or 0 for k in ("nan", "posinf", "neginf")}
        if any(bad.values()):
            counts = ", ".join(f"{v} {k}" for k, v in bad.items() if v)
            yield Diagnostic(
                "DTC101",
                _severity(CHECK_LEVEL["nonfinite"]),
                f"{name}: {counts} in {tensor.get('dtype')}",
                source,
                None,
                name,
                states.get((name, "nonfinite")),
            )
        for target, cast in (tensor.get("casts") or {}).items():
            for check, rule_id in _CAST_RULES.items():
                count = cast.get(check) or 0
                if not count:
                    continue
                level = _severity(CHECK_LEVEL[check])
                if cast.get("level") == "ok":
                    continue  # tolerated or ignored by the project's policy
                yield Diagnostic(
                    rule_id,
                    level,
                    f"{name}: {count} of {tensor.get('numel')} values {check} in {target}",
                    source,
                    None,
                    name,
                    states.get((name, f"{check}:{target}")),
                )
    for finding in doc.get("findings", []):
        if finding.get("level") not in ("fail", "warn"):
            continue
        level = _level(finding.get("level"))
        rule_id = _FINDING_RULES.get(str(finding.get("kind")), "DTC111")
        detail = f"{finding.get('kind')}: {finding.get('detail')}"
        yield Diagnostic(rule_id, level, detail, source, None, finding.get("tensor"))


def _event(event: Mapping[str, Any], level: Severity) -> Diagnostic:
    location = event.get("location") or {}
    where = event.get("module") or event.get("op")
    cause = f" ({event['cause']})" if event.get("cause") else ""
    message = f"{event.get('kind')} from {event.get('op')} in {event.get('phase')}{cause}"
    if event.get("module"):
        message += f" in module {event['module']}"
    return Diagnostic(
        _EVENT_RULES.get(str(event.get("kind")), "DTC201"),
        level,
        message,
        location.get("file"),
        location.get("line"),
        where,
    )


def _nantrace(doc: Mapping[str, Any]) -> Iterator[Diagnostic]:
    first = doc.get("first")
    if first:
        yield _event(first, "fail")
    for event in doc.get("events") or []:
        if event != first and event.get("kind") in ("nan", "inf"):
            yield _event(event, "fail")
    for event in doc.get("warnings", []):
        yield _event(event, "warn")
    for promotion in doc.get("promotions") or []:
        location = promotion.get("location") or {}
        created = promotion.get("created") or {}
        origin = f" (the float64 tensor was made at {created['file']}:{created['line']})" if created.get("file") else ""
        message = f"{promotion.get('op')} computes in float64 in a {promotion.get('dominant')} program{origin}"
        yield Diagnostic("DTC204", "warn", message, location.get("file"), location.get("line"), promotion.get("module"))
    error = doc.get("dtype_error")
    if error:
        location = error.get("location") or {}
        message = f"{error.get('exception')}; fix: {error.get('fix')}"
        yield Diagnostic(
            "DTC205",
            "fail",
            message,
            location.get("file"),
            location.get("line"),
            error.get("module") or error.get("op"),
        )


def _info(doc: Mapping[str, Any]) -> Iterator[Diagnostic]:
    for dtype in doc.get("dtypes", []):
        for mismatch in dtype.get("mismatches", []):
            message = (
                f"torch.finfo({dtype['name']}).{mismatch['field']} is {mismatch['torch']}, "
                f"the format's true value is {mismatch['true']}"
            )
            yield Diagnostic("DTC001", "note", message, None, None, dtype["name"])


def diagnostics(doc: Mapping[str, Any]) -> list[Diagnostic]:
    """Every finding of a report document, in report order."""
    schema = str(doc.get("schema", ""))
    if schema.startswith("dtypecheck.scan/"):
        return list(_scan(doc))
    if schema.startswith("dtypecheck.nantrace/"):
        return list(_nantrace(doc))
    if schema.startswith("dtypecheck.info/"):
        return list(_info(doc))
    return []
