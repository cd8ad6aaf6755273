"""SARIF 2.1.0: one rule per check, the tensor or module as logical location, the file as physical location."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dtypecheck import __version__
from dtypecheck.diagnostics import RULES, Diagnostic, diagnostics, report_level
from dtypecheck.findings import worst
from dtypecheck.scan.report import ScanReport

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_SARIF_LEVEL = {"fail": "error", "warn": "warning", "note": "note"}
_BASELINE_STATE = {"new": "new", "worse": "updated", "unchanged": "unchanged", "fixed": "absent"}


def _uri(file: str) -> str:
    path = Path(file)
    if path.is_absolute():
        try:
            return path.relative_to(Path.cwd()).as_posix()
        except ValueError:
            return path.as_uri()
    return path.as_posix()


def _result(diagnostic: Diagnostic, rule_index: int) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": diagnostic.rule_id,
        "ruleIndex": rule_index,
        "level": _SARIF_LEVEL[diagnostic.level],
        "message": {"text": diagnostic.message},
        "partialFingerprints": {"dtypecheck/v1": diagnostic.fingerprint},
    }
    location: dict[str, Any] = {}
    if diagnostic.file:
        physical: dict[str, Any] = {"artifactLocation": {"uri": _uri(diagnostic.file)}}
        physical["region"] = {"startLine": diagnostic.line or 1}
        location["physicalLocation"] = physical
    if diagnostic.logical:
        location["logicalLocations"] = [{"name": diagnostic.logical, "fullyQualifiedName": diagnostic.logical}]
    if location:
        result["locations"] = [location]
    if diagnostic.baseline_state in _BASELINE_STATE:
        result["baselineState"] = _BASELINE_STATE[diagnostic.baseline_state]
    return result


def sarif_log(report: object) -> dict[str, Any]:
    """The SARIF log of a report: one result per diagnostic (with a baseline, only the new and worse ones)."""
    properties = {"schema": getattr(report, "SCHEMA", None), "level": report_level(report)}
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [_run(diagnostics(report), properties)]}


def sarif_log_of_scans(reports: Sequence[ScanReport]) -> dict[str, Any]:
    """One SARIF log for several scanned checkpoints (as pre-commit passes them): one run holding every report's
    results, one artifact per checkpoint, and the worst level as the run's property."""
    found = [diagnostic for report in reports for diagnostic in diagnostics(report)]
    properties = {"schema": ScanReport.SCHEMA, "level": worst(report.summary.level for report in reports)}
    run = _run(found, properties)
    run["artifacts"] = [{"location": {"uri": _uri(report.source)}} for report in reports]
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def _run(found: list[Diagnostic], properties: dict[str, Any]) -> dict[str, Any]:
    index = {rule.id: i for i, rule in enumerate(RULES)}
    rules = [
        {
            "id": rule.id,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "defaultConfiguration": {"level": _SARIF_LEVEL[rule.default_level]},
        }
        for rule in RULES
    ]
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "dtypecheck",
                "version": __version__,
                "rules": rules,
            }
        },
        "results": [_result(d, index[d.rule_id]) for d in found],
        "properties": properties,
    }
    return run


def render_sarif(report: object) -> str:
    return json.dumps(sarif_log(report), indent=2, allow_nan=False) + "\n"


def render_sarif_of_scans(reports: Sequence[ScanReport]) -> str:
    return json.dumps(sarif_log_of_scans(reports), indent=2, allow_nan=False) + "\n"
