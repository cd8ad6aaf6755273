"""The one findings model every command emits and every output reads: levels, their order, the check rules.

A *check* is something counted on a tensor or an operator (``nonfinite``, ``overflow``, ``underflow``...). Its
level comes from ``CHECK_LEVEL`` and nowhere else, so "overflow fails, the rest warns" is written once; a
project's policy may lower a level (ignore, tolerate) but never invent one. A ``Finding`` is a non-numeric fact
about an input (a pickle global, a missing shard, mixed dtypes). Scan, nan-trace and the dtype-consistency
checks emit them; the table, JSON, SARIF, GitHub and baseline code read them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

Level = Literal["ok", "warn", "fail"]
"""How bad something is. ``fail`` gates CI by default; ``--fail-on warn`` also gates on ``warn``."""

LEVELS: Final[tuple[Level, ...]] = get_args(Level)
"""Every level, best first: the one order the whole program uses."""

_RANK: Final[Mapping[str, int]] = {level: rank for rank, level in enumerate(LEVELS)}


def rank(level: str) -> int:
    """Position of ``level`` in ``LEVELS`` (0 for ``ok``); an unknown level is a bug."""
    return _RANK[level]


def worst(levels: Iterable[Level]) -> Level:
    """The worst of ``levels``; ``ok`` when there are none."""
    return max(levels, key=rank, default="ok")


def as_level(value: object, default: Level = "fail") -> Level:
    """A level read from outside (a JSON baseline, a config): itself when valid, else ``default``."""
    return value if isinstance(value, str) and value in _RANK else default  # type: ignore[return-value]


def at_least(level: Level, threshold: Level) -> bool:
    """Whether ``level`` reaches ``threshold`` (``--fail-on``)."""
    return rank(level) >= rank(threshold)


Check = Literal["nonfinite", "overflow", "underflow", "subnormal", "scaled_underflow"]
"""The numeric checks on a tensor's values: its own non-finite values, and what a cast to a target does."""

CHECK_LEVEL: Final[Mapping[Check, Level]] = {
    "nonfinite": "fail",
    "overflow": "fail",
    "underflow": "warn",
    "subnormal": "warn",
    "scaled_underflow": "warn",
}
"""The level a nonzero count of each check carries (docs/contract.md "Levels")."""

CAST_CHECKS: Final[tuple[Check, ...]] = ("overflow", "underflow", "subnormal", "scaled_underflow")
"""The checks a cast to a target can fail, in the order reports list them."""


def level_of_counts(counts: Mapping[str, int | None]) -> Level:
    """The level of a set of check counts (``{"overflow": 3, "underflow": 0}``): the worst nonzero check."""
    return worst(CHECK_LEVEL[check] for check, count in counts.items() if count)  # type: ignore[index]


@dataclass(frozen=True)
class Finding:
    """A non-numeric finding about an input: a pickle global, a missing shard, an index mismatch, mixed dtypes."""

    kind: str
    """What was found, e.g. ``pickle-global``, ``missing-shard``, ``dtype-consistency``."""
    level: Level
    detail: str
    """One line for a person: what, where, and why it matters."""
    tensor: str | None = None
    """The tensor it is about, when it is about one."""
