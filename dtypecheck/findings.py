"""The one findings model every command emits and every output reads: levels, their order, the check rules.

A *check* is something counted on a tensor or an operator (``nonfinite``, ``overflow``, ``underflow``...). Its
level comes from ``CHECK_LEVEL`` and nowhere else, so "overflow fails, the rest warns" is written once; a
project's policy may lower a level (ignore, tolerate) but never invent one. A ``Finding`` is a non-numeric fact
about an input (a pickle global, a missing shard, mixed dtypes). Scan, nan-trace and the dtype-consistency
checks emit them; the table, JSON, SARIF, GitHub and baseline code read them.

Every check and every finding kind has one SARIF rule id (``RULES``): ``CHECK_RULE`` and ``FINDING_RULE`` here,
``rule`` on each nan-trace check (``nantrace.checks``). ``diagnostics`` refuses a kind without one, and a test
checks that every kind the code emits has one and that the README lists every rule.
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

CHECK_RULE: Final[Mapping[Check, str]] = {
    "nonfinite": "DTC101",
    "overflow": "DTC102",
    "underflow": "DTC103",
    "subnormal": "DTC104",
    "scaled_underflow": "DTC105",
}
"""The SARIF rule of each numeric check."""

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


FINDING_RULE: Final[Mapping[str, str]] = {
    "finfo-mismatch": "DTC001",
    "pickle-global": "DTC110",
    "pickle-polyglot": "DTC111",
    "contains-code": "DTC111",
    "duplicate-entry": "DTC111",
    "zip-differential": "DTC111",
    "unreadable-file": "DTC111",
    "no-tensors": "DTC111",
    "missing-shard": "DTC111",
    "index-mismatch": "DTC111",
    "index-total-size": "DTC111",
    "dcp-chunks": "DTC111",
    "gguf-quantized": "DTC111",
    "unsupported-tensor": "DTC111",
    "aliases": "DTC111",
    "dtype-consistency": "DTC120",
}
"""The SARIF rule of each finding kind (``Finding.kind``; ``finfo-mismatch``: info's ``mismatches``). A new kind
is added here, or ``diagnostics`` refuses it."""


SECURITY_KINDS: Final[frozenset[str]] = frozenset(
    {"pickle-global", "pickle-polyglot", "contains-code", "zip-differential", "duplicate-entry"}
)
"""Finding kinds that say a checkpoint can run code or reads differently to another reader (code-running globals,
polyglots and zip differentials, code in archives). No baseline and no ignore rule ever accepts one above ``ok``:
they gate whatever an earlier report recorded. A new kind of that sort is added here."""


def is_security(finding: Finding) -> bool:
    """Whether a baseline must never accept ``finding``: a security kind above ``ok``."""
    return finding.kind in SECURITY_KINDS and finding.level != "ok"


def finding_rule(kind: str) -> str:
    """The rule id of a finding kind; a kind missing from ``FINDING_RULE`` is a bug, never a silent default."""
    try:
        return FINDING_RULE[kind]
    except KeyError:
        raise ValueError(f"finding kind {kind!r} has no SARIF rule: add it to findings.FINDING_RULE") from None


Severity = Literal["fail", "warn", "note"]
"""A diagnostic's level: a finding's level, with ``ok`` facts worth telling shown as notes."""


@dataclass(frozen=True)
class Rule:
    """One SARIF rule (and GitHub annotation title)."""

    id: str
    name: str
    summary: str
    default_level: Severity


RULES: Final[tuple[Rule, ...]] = (
    Rule("DTC001", "finfo-mismatch", "torch.finfo disagrees with the dtype's true value", "note"),
    Rule("DTC101", "nonfinite-values", "The tensor already holds NaN or infinite values", "fail"),
    Rule("DTC102", "cast-overflow", "Values beyond the target dtype's max: inf (or silent saturation) on cast", "fail"),
    Rule("DTC103", "cast-underflow", "Nonzero values that round to zero in the target dtype", "warn"),
    Rule("DTC104", "cast-subnormal", "Values that become subnormal in the target dtype, losing precision", "warn"),
    Rule("DTC105", "scaled-underflow", "Values lost to zero in float8 even after per-tensor amax scaling", "warn"),
    Rule(
        "DTC110", "pickle-global", "The checkpoint's pickle references a global (code it would import or run)", "warn"
    ),
    Rule("DTC111", "checkpoint-structure", "The checkpoint's structure is inconsistent (index, shards, sizes)", "warn"),
    Rule("DTC120", "dtype-consistency", "Mixed or surprising dtypes in the model or its optimizer state", "warn"),
    Rule("DTC201", "nonfinite-producer", "An operator produced NaN or Inf from finite inputs", "fail"),
    Rule("DTC202", "near-overflow", "An operator's output came close to its dtype's max", "warn"),
    Rule("DTC203", "half-precision-underflow", "An operator's half-precision output was mostly lost to zero", "warn"),
    Rule("DTC204", "float64-promotion", "float64 entered a lower-precision program (memory and time double)", "warn"),
    Rule("DTC205", "dtype-mismatch", "The traced code died of a dtype mismatch between an op's inputs", "fail"),
)
"""Every rule, in the order SARIF's ``tool.driver.rules`` lists them."""

RULE_BY_ID: Final[Mapping[str, Rule]] = {rule.id: rule for rule in RULES}
