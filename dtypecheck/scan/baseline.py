"""Compare a scan with an earlier one and gate only on what is new or worse.

A checkpoint that always had 3 subnormals should not fail CI forever: with a baseline (``--baseline report.json``,
``scan_checkpoint(..., baseline="report.json")``) the exit code follows the checks that appeared or grew since
the baseline, while the report still shows everything.
A baseline file is a ``dtypecheck.baseline/1`` document holding the reports of several checkpoints (so that
pre-commit can pass any number of changed files), each under its path relative to the project's configuration;
an earlier single scan JSON document (the contract) still works as the baseline of one checkpoint. Either is read
back into the report types, so a baseline written by any earlier version can be read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtypecheck.errors import InputError
from dtypecheck.findings import CHECK_LEVEL, Level, is_security, worst
from dtypecheck.output import document
from dtypecheck.scan.document import read_scan_document
from dtypecheck.scan.report import (
    GATED_STATES,
    STATES,
    BaselineComparison,
    Change,
    ScanReport,
    State,
    finding_key,
    gated_checks,
    summarise,
)
from dtypecheck.usercode import python_target

__all__ = [
    "BASELINE_SCHEMA",
    "Baseline",
    "BaselineComparison",
    "Change",
    "State",
    "checkpoint_key",
    "compact_document",
    "compare",
    "load_baseline",
    "nothing_before",
]

BASELINE_SCHEMA = "dtypecheck.baseline/1"


@dataclass(frozen=True)
class Baseline:
    """A baseline file: the earlier reports of one or several checkpoints."""

    path: str
    """The file it was read from, as given."""
    checkpoints: Mapping[str, ScanReport]
    """Each checkpoint's report by its ``checkpoint_key``."""
    documents: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)
    """Each entry's JSON document as read: kept verbatim when other entries are updated."""
    single: bool = False
    """Read from an old single scan report (keyed by its ``source``): the baseline of whichever one checkpoint is
    scanned alone; among several, only of the one whose key its ``source`` equals."""

    def report_for(self, key: str, *, alone: bool) -> ScanReport | None:
        """The earlier report of the checkpoint named ``key`` (``alone``: the only one scanned), if there is one."""
        if self.single and alone:
            return next(iter(self.checkpoints.values()))
        return self.checkpoints.get(key)


def checkpoint_key(target: str, root: Path) -> str:
    """How a baseline names a checkpoint: its path relative to ``root`` (the configuration file's folder) with
    ``/`` separators, ``../`` where it lies outside (``file.py:factory`` keeps its ``:factory``); what is not a
    local path (a Hub id ``org/name@rev``) as typed."""
    python = python_target(target)
    path = python[0] if python is not None else Path(target)
    if not path.exists():
        return target
    key = Path(os.path.relpath(path.resolve(), root.resolve())).as_posix()
    return f"{key}:{python[1]}" if python is not None and python[1] else key


_KEPT_TENSOR_KEYS = ("name", "dtype", "nan", "posinf", "neginf", "level", "passed")
_KEPT_CAST_KEYS = ("overflow", "underflow", "subnormal", "scaled_underflow", "level")


def compact_document(report: ScanReport) -> dict[str, Any]:
    """What a baseline entry needs: a ``dtypecheck.scan/1`` document holding only what the gate compares (the
    tensors with a check that gates, their counts and levels, and the findings above ``ok``), a few KB where the
    whole report of a large checkpoint is megabytes. ``read_scan_document`` reads it back like any report."""
    whole = document(report)
    gating = {tensor.name for tensor in report.tensors if any(True for _ in gated_checks(tensor))}
    tensors = []
    for entry in whole["tensors"]:
        if entry["name"] not in gating:
            continue
        kept = {key: entry[key] for key in _KEPT_TENSOR_KEYS if key in entry}
        kept["casts"] = {t: {k: c[k] for k in _KEPT_CAST_KEYS if k in c} for t, c in entry["casts"].items()}
        tensors.append(kept)
    findings = [finding for finding in whole["findings"] if finding["level"] != "ok"]
    keys = ("schema", "dtypecheck_version", "source", "format", "targets")
    return {**{key: whole[key] for key in keys}, "tensors": tensors, "findings": findings}


def nothing_before(source: str = "") -> ScanReport:
    """The baseline of a checkpoint the baseline file has no entry for: every check it gates is new."""
    return ScanReport(source, "", (), (), (), summarise((), ()))


def _checks(report: ScanReport, *, accepts: bool = False) -> dict[tuple[str | None, str], tuple[int, Level]]:
    """``{(tensor, check): (count, level)}`` for every check that gates: nonzero and not passed by the policy.
    ``accepts``: read as a baseline, which never holds a security finding (``findings.is_security``)."""
    found: dict[tuple[str | None, str], tuple[int, Level]] = {}
    for tensor in report.tensors:
        for key, check, _, count in gated_checks(tensor):
            found[(tensor.name, key)] = (count, CHECK_LEVEL[check])
    for finding in report.findings:
        if finding.level != "ok" and not (accepts and is_security(finding)):
            found[(finding.tensor, finding_key(finding))] = (1, finding.level)
    return found


def _state(before: int, after: int) -> State:
    if before == 0:
        return "new"
    if after > before:
        return "worse"
    return "improved" if after < before else "unchanged"


def compare(current: ScanReport, baseline: ScanReport, source: str = "") -> BaselineComparison:
    """What is new, worse, unchanged, improved or fixed in ``current`` against ``baseline``. A security finding
    (code-running globals, differentials, code in archives) is new whatever the baseline recorded: no baseline
    accepts one, however it came to hold it."""
    before = _checks(baseline, accepts=True)
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


def load_baseline(
    path: Path, where: str | None = None, *, missing_hint: str = "write it with update_baseline"
) -> Baseline:
    """Read a baseline file: a ``dtypecheck.baseline/1`` document, or an earlier ``scan-model --format json`` one.

    ``where`` names it in errors (default ``baseline PATH``); ``missing_hint`` says how to create a missing one."""
    where = where or f"baseline {path}"
    try:
        if path.exists() and not path.is_file():  # /dev/zero, a FIFO: reading would never end
            raise InputError(f"{where}: not a regular file")
        if path.exists() and path.stat().st_size > MAX_BASELINE_BYTES:
            raise InputError(f"{where}: larger than {MAX_BASELINE_BYTES} bytes; not a scan report")
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{where}: no such file ({missing_hint})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise InputError(f"{where}: not a JSON report ({exc})") from None
    except RecursionError:
        raise InputError(f"{where}: not a JSON report (nested too deeply)") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if isinstance(schema, str) and schema.startswith("dtypecheck.baseline/"):
        entries = doc.get("checkpoints")
        if not isinstance(entries, dict):
            raise InputError(f"{where}: malformed baseline (checkpoints is not an object)")
        reports = {str(key): read_scan_document(entry, f"{where} [{key}]") for key, entry in entries.items()}
        return Baseline(str(path), reports, entries)
    report = read_scan_document(doc, where)
    return Baseline(str(path), {report.source: report}, {report.source: doc}, single=True)
