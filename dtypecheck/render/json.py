"""JSON rendering: one document, non-finite floats as strings, every other float round-trips (repr)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

from dtypecheck import __version__
from dtypecheck.findings import LEVELS, worst

if TYPE_CHECKING:
    from dtypecheck.scan.report import ScanReport

SCAN_SET_SCHEMA = "dtypecheck.scan-set/1"
"""``scan-model A B --format json``: several checkpoints' reports in one document."""


def jsonable(value: Any) -> Any:
    """Convert a result tree of frozen dataclasses, tuples and mappings into JSON-ready values."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, Enum):
        return jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value) if f.repr}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def document(report: Any) -> dict[str, Any]:
    body = jsonable(report)
    if not isinstance(body, dict):
        raise TypeError("a report must be a dataclass")
    return {"schema": report.SCHEMA, "dtypecheck_version": __version__, **body}


def render_json(report: Any) -> str:
    return json.dumps(document(report), indent=2, allow_nan=False) + "\n"


def render_json_of_scans(reports: Sequence[ScanReport]) -> str:
    """Several checkpoints' scans as one document: each one's own ``dtypecheck.scan/1`` document under
    ``checkpoints``, in the order given, and a summary counting the checkpoints per level."""
    levels = [report.summary.level for report in reports]
    summary: dict[str, Any] = {"checkpoints": len(reports), **{level: levels.count(level) for level in LEVELS}}
    summary["level"] = worst(levels)
    summary["gate_level"] = worst(report.gate_level for report in reports)
    body = {
        "schema": SCAN_SET_SCHEMA,
        "dtypecheck_version": __version__,
        "checkpoints": [document(report) for report in reports],
        "summary": summary,
    }
    return json.dumps(body, indent=2, allow_nan=False) + "\n"
