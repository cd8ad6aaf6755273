"""A ``dtypecheck.scan/1`` JSON document read back into the report types, checked once at the boundary.

Baselines are earlier documents, possibly written by older versions: keys this version added (``passed``,
``census``...) may be missing and take their defaults; a value of the wrong type is an ``InputError`` naming
the document, never a crash halfway through a comparison.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtypecheck.errors import InputError
from dtypecheck.findings import LEVELS, Finding, Level
from dtypecheck.scan.report import (
    STATES,
    BaselineComparison,
    CastCounts,
    Change,
    Float8CastCounts,
    Number,
    ScanReport,
    State,
    TensorScan,
    summarise,
)
from dtypecheck.scan.roles import ROLES, Role


class _MalformedError(ValueError):
    pass


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _MalformedError(f"{what} is not an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _MalformedError(f"{what} is not a list")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _MalformedError(f"{what} is not a string")
    return value


def _optional_str(value: Any, what: str) -> str | None:
    return None if value is None else _str(value, what)


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _MalformedError(f"{what} is not a count")
    return value


def _number(value: Any, what: str) -> Number | None:
    if value is None:
        return None
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _MalformedError(f"{what} is not a number")
    return value


def _level(value: Any, what: str) -> Level:
    for level in LEVELS:
        if value == level:
            return level
    raise _MalformedError(f"{what} is not one of {', '.join(LEVELS)}")


def _state(value: Any, what: str) -> State:
    for state in STATES:
        if value == state:
            return state
    raise _MalformedError(f"{what} is not one of {', '.join(STATES)}")


def _role(value: Any, what: str) -> Role:
    for role in ROLES:
        if value == role:
            return role
    raise _MalformedError(f"{what} is not one of {', '.join(ROLES)}")


def _strings(value: Any, what: str) -> tuple[str, ...]:
    return tuple(_str(item, what) for item in _list(value, what))


def _cast(doc: Mapping[str, Any], what: str) -> CastCounts:
    overflow = _count(doc.get("overflow"), f"{what}.overflow")
    underflow = _count(doc.get("underflow"), f"{what}.underflow")
    subnormal = _count(doc.get("subnormal"), f"{what}.subnormal")
    level = _level(doc.get("level"), f"{what}.level")
    if "scaled_underflow" in doc:
        scaled = _count(doc["scaled_underflow"], f"{what}.scaled_underflow")
        return Float8CastCounts(overflow, underflow, subnormal, level, scaled)
    return CastCounts(overflow, underflow, subnormal, level)


def _tensor(doc: Mapping[str, Any]) -> TensorScan:
    name = _str(doc.get("name"), "a tensor's name")
    what = f"tensor {name!r}"
    casts = {
        _str(target, f"{what}: a target"): _cast(_mapping(cast, f"{what}.casts"), f"{what}.casts.{target}")
        for target, cast in _mapping(doc.get("casts") or {}, f"{what}.casts").items()
    }

    def number(key: str) -> Number | None:
        return _number(doc.get(key), f"{what}.{key}")

    def count(key: str, default: int | None = None) -> int | None:
        return _count(doc.get(key, default), f"{what}.{key}")

    return TensorScan(
        name=name,
        dtype=_str(doc.get("dtype", ""), f"{what}.dtype"),
        shape=tuple(_count(d, f"{what}.shape") or 0 for d in _list(doc.get("shape"), f"{what}.shape")),
        numel=count("numel", 0) or 0,
        bytes=count("bytes", 0) or 0,
        min=number("min"),
        max=number("max"),
        absmax=number("absmax"),
        min_abs_nonzero=number("min_abs_nonzero"),
        nan=count("nan"),
        posinf=count("posinf"),
        neginf=count("neginf"),
        zeros=count("zeros"),
        subnormal=count("subnormal"),
        casts=casts,
        level=_level(doc.get("level", "ok"), f"{what}.level"),
        note=_optional_str(doc.get("note"), f"{what}.note"),
        policy=_strings(doc.get("policy"), f"{what}.policy"),
        passed=_strings(doc.get("passed"), f"{what}.passed"),
        role=_role(doc.get("role", "model"), f"{what}.role"),
        not_judged=_optional_str(doc.get("not_judged"), f"{what}.not_judged"),
        alias_of=_optional_str(doc.get("alias_of"), f"{what}.alias_of"),
        stored=_optional_str(doc.get("stored"), f"{what}.stored"),
        stored_bytes=_count(doc.get("stored_bytes"), f"{what}.stored_bytes"),
    )


def _finding(doc: Mapping[str, Any], what: str) -> Finding:
    return Finding(
        kind=_str(doc.get("kind"), f"{what}.kind"),
        level=_level(doc.get("level"), f"{what}.level"),
        detail=_str(doc.get("detail", ""), f"{what}.detail"),
        tensor=_optional_str(doc.get("tensor"), f"{what}.tensor"),
    )


def _change(doc: Mapping[str, Any], what: str) -> Change:
    return Change(
        tensor=_optional_str(doc.get("tensor"), f"{what}.tensor"),
        check=_str(doc.get("check"), f"{what}.check"),
        before=_count(doc.get("before"), f"{what}.before") or 0,
        after=_count(doc.get("after"), f"{what}.after") or 0,
        state=_state(doc.get("state"), f"{what}.state"),
        level=_level(doc.get("level"), f"{what}.level"),
    )


def _baseline(value: Any) -> BaselineComparison | None:
    if value is None:
        return None
    doc = _mapping(value, "baseline")
    changes = tuple(_change(_mapping(c, "a change"), "a change") for c in _list(doc.get("changes"), "changes"))
    counts: dict[str, int] = {state: sum(1 for c in changes if c.state == state) for state in STATES}
    return BaselineComparison(
        _str(doc.get("source", ""), "baseline.source"), changes, counts, _level(doc.get("level"), "baseline.level")
    )


def _left_out(doc: Mapping[str, Any]) -> Any:
    summary = doc.get("summary")
    return summary.get("left_out", 0) if isinstance(summary, Mapping) else 0


def _report(doc: Mapping[str, Any]) -> ScanReport:
    tensors = tuple(_tensor(_mapping(t, "a tensor")) for t in _list(doc.get("tensors"), "tensors"))
    findings = tuple(_finding(_mapping(f, "a finding"), "a finding") for f in _list(doc.get("findings"), "findings"))
    return ScanReport(
        source=_str(doc.get("source", ""), "source"),
        format=_str(doc.get("format", ""), "format"),
        targets=_strings(doc.get("targets"), "targets"),
        tensors=tensors,
        findings=findings,
        summary=summarise(tensors, findings, _count(_left_out(doc), "summary.left_out") or 0),
        baseline=_baseline(doc.get("baseline")),
    )


def read_scan_document(doc: Any, where: str) -> ScanReport:
    """The report a ``scan-model --format json`` document describes; ``where`` names it in the error."""
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(schema, str) or not schema.startswith("dtypecheck.scan/"):
        raise InputError(f"{where}: not a dtypecheck scan-model JSON report")
    try:
        return _report(doc)
    except _MalformedError as exc:
        raise InputError(f"{where}: malformed scan-model report ({exc})") from None


__all__ = ["read_scan_document"]
