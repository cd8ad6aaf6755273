"""Compare a scan with an earlier one and gate only on what is new or worse.

A checkpoint that always had 3 subnormals should not fail CI forever: with ``--baseline report.json`` the exit
code follows the checks that appeared or grew since the baseline, while the report still shows everything.
A baseline is an earlier scan JSON document (the contract), read back into the report types, so a baseline
written by any earlier version can be read.
"""

from __future__ import annotations

import json
from pathlib import Path

from dtypecheck.errors import InputError
from dtypecheck.findings import CHECK_LEVEL, Level, worst
from dtypecheck.scan.scan_document import read_scan_document
from dtypecheck.scan.scan_report import (
    GATED_STATES,
    STATES,
    BaselineComparison,
    Change,
    ScanReport,
    State,
    finding_key,
    gated_checks,
)

__all__ = ["BaselineComparison", "Change", "State", "compare", "load_baseline"]


def _checks(report: ScanReport) -> dict[tuple[str | None, str], tuple[int, Level]]:
    """``{(tensor, check): (count, level)}`` for every check that gates: nonzero and not passed by the policy."""
    found: dict[tuple[str | None, str], tuple[int, Level]] = {}
    for tensor in report.tensors:
        for key, check, _, count in gated_checks(tensor):
            found[(tensor.name, key)] = (count, CHECK_LEVEL[check])
    for finding in report.findings:
        if finding.level != "ok":
            found[(finding.tensor, finding_key(finding))] = (1, finding.level)
    return found


def _state(before: int, after: int) -> State:
    if before == 0:
        return "new"
    if after > before:
        return "worse"
    return "improved" if after < before else "unchanged"


def compare(current: ScanReport, baseline: ScanReport, source: str = "") -> BaselineComparison:
    before = _checks(baseline)
    after = _checks(current)
    changes: list[Change] = []
    for key, (count, level) in after.items():
        old = before.get(key, (0, "ok"))[0]
        changes.append(Change(key[0], key[1], old, count, _state(old, count), level))
    for key, (count, level) in before.items():
        if key not in after:
            changes.append(Change(key[0], key[1], count, 0, "fixed", level))
    gate = worst(c.level for c in changes if c.state in GATED_STATES)
    counts: dict[str, int] = {state: sum(1 for c in changes if c.state == state) for state in STATES}
    return BaselineComparison(source, tuple(changes), counts, gate)


MAX_BASELINE_BYTES = 1 << 30
"""A scan report of a million tensors is well under this."""


def load_baseline(path: Path) -> ScanReport:
    """Read an earlier ``scan-model --format json`` document."""
    where = f"--baseline {path}"
    try:
        if path.exists() and not path.is_file():  # /dev/zero, a FIFO: reading would never end
            raise InputError(f"{where}: not a regular file")
        if path.exists() and path.stat().st_size > MAX_BASELINE_BYTES:
            raise InputError(f"{where}: larger than {MAX_BASELINE_BYTES} bytes; not a scan report")
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise InputError(f"{where}: not a JSON report ({exc})") from None
    except RecursionError:
        raise InputError(f"{where}: not a JSON report (nested too deeply)") from None
    return read_scan_document(doc, where)
