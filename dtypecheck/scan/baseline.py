"""Compare a scan with an earlier one and gate only on what is new or worse.

A checkpoint that always had 3 subnormals should not fail CI forever: with ``--baseline report.json`` the exit
code follows the checks that appeared or grew since the baseline, while the report still shows everything.
Works on scan JSON documents (the contract), so a baseline written by any earlier version can be read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dtypecheck.errors import InputError
from dtypecheck.findings import CAST_CHECKS, CHECK_LEVEL, as_level, worst

State = Literal["new", "worse", "unchanged", "improved", "fixed"]
STATES: tuple[State, ...] = ("new", "worse", "unchanged", "improved", "fixed")


@dataclass(frozen=True)
class Change:
    """One check on one tensor (or one non-numeric finding) compared with the baseline."""

    tensor: str | None
    check: str
    """``nonfinite``, ``overflow:float16`` (check:target), or ``finding:<kind>:<detail>``."""
    before: int
    after: int
    state: State
    level: str
    """The level this check carries now (for ``fixed``: the level it had)."""


@dataclass(frozen=True)
class BaselineComparison:
    source: str
    changes: tuple[Change, ...]
    counts: Mapping[str, int]
    """How many changes are in each state."""
    level: str
    """The gate: the worst level among new and worse checks."""


def _checks(doc: Mapping[str, Any]) -> Iterator[tuple[str | None, str, int, str]]:
    """``(tensor, check, count, level)`` for every nonzero check of a scan document."""
    for tensor in doc.get("tensors", []):
        name = tensor.get("name")
        nonfinite = sum(int(tensor.get(k) or 0) for k in ("nan", "posinf", "neginf"))
        if nonfinite:
            yield name, "nonfinite", nonfinite, CHECK_LEVEL["nonfinite"]
        for target, cast in (tensor.get("casts") or {}).items():
            if cast.get("level") == "ok":
                continue  # tolerated or ignored by the project's policy: not a finding to gate on
            for check in CAST_CHECKS:
                count = int(cast.get(check) or 0)
                if count:
                    yield name, f"{check}:{target}", count, CHECK_LEVEL[check]
    for finding in doc.get("findings", []):
        level = str(finding.get("level"))
        if level in ("warn", "fail"):
            yield finding.get("tensor"), f"finding:{finding.get('kind')}:{finding.get('detail')}", 1, level


def compare(current: Mapping[str, Any], baseline: Mapping[str, Any], source: str = "") -> BaselineComparison:
    before = {(t, c): (n, lvl) for t, c, n, lvl in _checks(baseline)}
    after = {(t, c): (n, lvl) for t, c, n, lvl in _checks(current)}
    changes: list[Change] = []
    for key, (count, level) in after.items():
        old = before.get(key, (0, "ok"))[0]
        state: State
        if old == 0:
            state = "new"
        elif count > old:
            state = "worse"
        elif count < old:
            state = "improved"
        else:
            state = "unchanged"
        changes.append(Change(key[0], key[1], old, count, state, level))
    for key, (count, level) in before.items():
        if key not in after:
            changes.append(Change(key[0], key[1], count, 0, "fixed", level))
    gated = [c.level for c in changes if c.state in ("new", "worse")]
    level = worst(as_level(g) for g in gated)
    counts: dict[str, int] = {state: sum(1 for c in changes if c.state == state) for state in STATES}
    return BaselineComparison(source, tuple(changes), counts, level)


def load_baseline(path: Path) -> dict[str, Any]:
    """Read an earlier ``scan-model --format json`` document."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"--baseline {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"--baseline {path}: not a JSON report ({exc})") from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("dtypecheck.scan/"):
        raise InputError(f"--baseline {path}: not a dtypecheck scan-model JSON report")
    return doc
