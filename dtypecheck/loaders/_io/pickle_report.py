"""What the pickles of one file reference (``pickle_files`` finds them in any file, ``legacy_tar`` in torch's
tar format)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtypecheck.findings import Finding
from dtypecheck.loaders._io.pickle_vm import GlobalRef


@dataclass(frozen=True)
class PickleReport:
    """What the pickles of one file reference."""

    globals: tuple[GlobalRef, ...]
    problem: str | None
    """Why reading stopped early (a malformed pickle), or None."""
    limited: bool = False
    """Reading stopped at one of dtypecheck's own limits (or a reader disagreed) where ``torch.load`` might go on:
    what the rest would run is unknown, which a scan reports instead of passing in silence."""
    differential: tuple[Finding, ...] = ()
    """``zip-differential`` findings (``zip_records``)."""


def lenient_persistent_id(pid: Any) -> Any:
    """A ``persistent_load`` that returns the id itself: the pickle is read for its globals, not its storages."""
    return pid


def merged(*reports: PickleReport) -> PickleReport:
    """One report of several readings of a file (``torch.load``'s, ``joblib.load``'s): every global once, with
    every use any reading saw; the first reading's problem first."""
    uses: dict[GlobalRef, frozenset[str]] = {}
    for report in reports:
        for ref in report.globals:
            uses[ref] = uses.get(ref, frozenset()) | ref.uses
    problems = [report.problem for report in reports if report.problem]
    return PickleReport(
        tuple(GlobalRef(ref.module, ref.name, kinds) for ref, kinds in uses.items()),
        problems[0] if problems else None,
        any(report.limited for report in reports),
        tuple(finding for report in reports for finding in report.differential),
    )
