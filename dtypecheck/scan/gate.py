"""The gate of a ``scan-model`` run over one or several checkpoints: which baseline file each reads or updates,
what the exit code follows, and writing the updated files back.

A checkpoint's baseline is a file given by the caller or the ``baseline`` of its own configuration (relative to that
file); its entry in the file is its path relative to the configuration's folder (the working folder without one).
Every baseline file is read once, when the gate opens, before any scan, so a missing or malformed one fails fast;
updates are written only after every scan has finished (``Gate.write``), each file atomically and once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dtypecheck import __version__
from dtypecheck.findings import Level, at_least, is_security, worst
from dtypecheck.output import write_atomically
from dtypecheck.scan.baseline import (
    BASELINE_SCHEMA,
    Baseline,
    checkpoint_key,
    compact_document,
    compare,
    load_baseline,
    nothing_before,
)
from dtypecheck.scan.keep_float32 import DEFAULT_MIN_SQNR_DB
from dtypecheck.scan.select import EVERYTHING, Selection

if TYPE_CHECKING:
    from dtypecheck.config import Config, ScanPolicy
    from dtypecheck.dtypes import DtypeSpec
    from dtypecheck.scan.report import ScanReport


def configured_path(settings: Config, key: str) -> Path | None:
    """A path from the config file is relative to the folder of that file, as ruff and mypy read theirs."""
    value = settings.get("scan-model", key)
    if value is None:
        return None
    path = Path(str(value))
    return path if path.is_absolute() or settings.path is None else settings.path.parent / path


def shown(path: Path) -> str:
    """A path as messages show it: relative to the working folder when it lies inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def entry_key(checkpoint: str, settings: Config) -> str:
    """The checkpoint's entry in a baseline: relative to its configuration's folder, else the working folder."""
    root = settings.path.parent if settings.path is not None else Path.cwd()
    return checkpoint_key(checkpoint, root)


@dataclass(frozen=True)
class CheckpointPlan:
    """One checkpoint of a run and everything its scan and its gate need, already resolved."""

    checkpoint: str
    """A file, folder, ``file.py:factory`` or Hub id, as given."""
    targets: tuple[DtypeSpec, ...] | None = None
    """The dtypes to judge casts to (checked by ``check_targets``); None for float16 and bfloat16."""
    policy: ScanPolicy | None = None
    """The project's ignore rules and tolerances."""
    keep_float32_sqnr_db: float = DEFAULT_MIN_SQNR_DB
    """The SQNR below which a cast loses too much for ``keep_float32``."""
    selection: Selection = EVERYTHING
    """Which tensors are read (include/exclude globs, weights only)."""
    fail_on: Level = "fail"
    """The lowest gate level that counts as findings (``fail`` or ``warn``)."""
    baseline: Path | None = None
    """The baseline file it is compared with (or, when the gate updates, written into); None without one."""
    where: str = ""
    """How errors name the baseline file (default ``baseline PATH``)."""
    key: str = ""
    """The checkpoint's entry in the baseline file (default: ``checkpoint_key`` from the working folder)."""

    def baseline_where(self) -> str:
        return self.where or f"baseline {self.baseline}"

    def baseline_key(self) -> str:
        return self.key or checkpoint_key(self.checkpoint, Path.cwd())


@dataclass(frozen=True)
class GateResult:
    """What the gate made of one checkpoint's report."""

    report: ScanReport
    """The report, compared with its baseline entry when it has a baseline and the gate does not update."""
    missing_entry: bool
    """Compared with a baseline file that has no entry for this checkpoint: everything it finds counts as new."""
    findings: bool
    """Whether it counts as findings (exit 1): its gate level reaches ``fail_on``; when the gate updates, only its
    security findings (which no baseline accepts) do."""


@dataclass(frozen=True)
class BaselineWritten:
    """One baseline file ``Gate.write`` wrote."""

    path: Path
    updated: tuple[str, ...]
    """The entries replaced or added (the checkpoints scanned), sorted."""
    kept: int
    """Earlier entries kept as they were."""


_MISSING_HINT = "write it with update_baseline"


@dataclass
class Gate:
    """One run's baseline files, each read once when the gate opens; with ``update``, the reports that will replace
    their entries when ``write`` is called. ``missing_hint`` says how to create a missing baseline file."""

    plans: Sequence[CheckpointPlan]
    update: bool = False
    missing_hint: str = _MISSING_HINT
    files: dict[Path, Baseline] = field(default_factory=dict, init=False)
    written: dict[Path, dict[str, ScanReport]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for plan in self.plans:
            if plan.baseline is not None:
                self._open(plan.baseline, plan.baseline_where())

    def _open(self, path: Path, where: str) -> None:
        """Read ``path`` now (a missing file is an empty baseline when it is being written)."""
        if path in self.files:
            return
        if self.update and not path.exists():
            self.files[path] = Baseline(str(path), {})
            return
        self.files[path] = load_baseline(path, where, missing_hint=self.missing_hint)

    def judge(self, plan: CheckpointPlan, report: ScanReport) -> GateResult:
        """Compare ``report`` with its baseline entry (or, when updating, record it) and say whether it gates."""
        if plan.baseline is None:
            return GateResult(report, False, self._gates(plan, report))
        key = plan.baseline_key()
        if self.update:
            self.written.setdefault(plan.baseline, {})[key] = report
            return GateResult(report, False, self._gates_security(plan, report))
        earlier = self.files[plan.baseline].report_for(key, alone=len(self.plans) == 1)
        comparison = compare(report, earlier or nothing_before(key), str(plan.baseline))
        compared = replace(report, baseline=comparison)
        return GateResult(compared, earlier is None, self._gates(plan, compared))

    def _gates(self, plan: CheckpointPlan, report: ScanReport) -> bool:
        return not self.update and at_least(report.gate_level, plan.fail_on)

    @staticmethod
    def _gates_security(plan: CheckpointPlan, report: ScanReport) -> bool:
        """Writing a baseline accepts the numbers it records, never a security finding: those still gate."""
        return at_least(worst(f.level for f in report.findings if is_security(f)), plan.fail_on)

    def write(self) -> tuple[BaselineWritten, ...]:
        """Write every updated file: its earlier entries (not an old single report's) with the new ones replaced."""
        done: list[BaselineWritten] = []
        for path, fresh in self.written.items():
            before = self.files[path]
            kept = {} if before.single else {k: d for k, d in before.documents.items() if k not in fresh}
            entries = {**kept, **{key: compact_document(report) for key, report in fresh.items()}}
            text = {
                "schema": BASELINE_SCHEMA,
                "dtypecheck_version": __version__,
                "checkpoints": {key: entries[key] for key in sorted(entries)},
            }
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, json.dumps(text, indent=2, allow_nan=False) + "\n")
            done.append(BaselineWritten(path, tuple(sorted(fresh)), len(kept)))
        return tuple(done)


__all__ = ["BaselineWritten", "CheckpointPlan", "Gate", "GateResult", "configured_path", "entry_key", "shown"]
