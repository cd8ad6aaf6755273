"""Which baseline file each checkpoint of a ``scan-model`` run reads or updates, and writing it back.

A checkpoint's baseline is ``--baseline FILE`` or the ``baseline`` of its own configuration (relative to that
file); its entry in the file is its path relative to the configuration's folder (the working folder without one).
Every baseline file is read once, before any scan, so a missing or malformed one fails fast; updates are written
only after every scan has finished, each file atomically and once.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dtypecheck import __version__
from dtypecheck.render import write_atomically
from dtypecheck.render.json import document
from dtypecheck.scan.baseline import BASELINE_SCHEMA, Baseline, checkpoint_key, load_baseline

if TYPE_CHECKING:
    from dtypecheck.config import Config
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


@dataclass
class Baselines:
    """The baseline files of one run, each read once; with ``update``, the reports that will replace entries."""

    update: bool
    files: dict[Path, Baseline] = field(default_factory=dict)
    written: dict[Path, dict[str, ScanReport]] = field(default_factory=dict)

    def open(self, path: Path, where: str) -> None:
        """Read ``path`` now (a missing file is an empty baseline when it is being written)."""
        if path in self.files:
            return
        if self.update and not path.exists():
            self.files[path] = Baseline(str(path), {})
            return
        self.files[path] = load_baseline(path, where)

    def earlier(self, path: Path, key: str, *, alone: bool) -> ScanReport | None:
        return self.files[path].report_for(key, alone=alone)

    def record(self, path: Path, key: str, report: ScanReport) -> None:
        self.written.setdefault(path, {})[key] = report

    def write(self, *, quiet: bool) -> None:
        """Write every updated file: its earlier entries (not an old single report's) with the new ones replaced."""
        for path, fresh in self.written.items():
            before = self.files[path]
            kept = {} if before.single else {k: d for k, d in before.documents.items() if k not in fresh}
            entries = {**kept, **{key: document(report) for key, report in fresh.items()}}
            text = {
                "schema": BASELINE_SCHEMA,
                "dtypecheck_version": __version__,
                "checkpoints": {key: entries[key] for key in sorted(entries)},
            }
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, json.dumps(text, indent=2, allow_nan=False) + "\n")
            if not quiet:
                names = ", ".join(sorted(fresh))
                print(
                    f"wrote baseline {shown(path)}: {len(fresh)} checkpoint(s) updated ({names}), {len(kept)} kept",
                    file=sys.stderr,
                )
