"""JSON rendering: one document, non-finite floats as strings, every other float round-trips (repr)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dtypecheck import __version__
from dtypecheck.findings import LEVELS, worst
from dtypecheck.output import document, jsonable

if TYPE_CHECKING:
    from dtypecheck.scan.report import ScanReport

SCAN_SET_SCHEMA = "dtypecheck.scan-set/1"
"""``scan-model A B --format json``: several checkpoints' reports in one document."""

__all__ = ["document", "jsonable", "render_json"]


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
