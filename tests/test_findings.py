"""The one findings model: level order, the check rule table, and reading levels from outside."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

import pytest

from dtypecheck.findings import (
    CAST_CHECKS,
    CHECK_LEVEL,
    CHECK_RULE,
    FINDING_RULE,
    LEVELS,
    RULE_BY_ID,
    RULES,
    Check,
    Finding,
    as_level,
    at_least,
    finding_rule,
    level_of_counts,
    worst,
)
from dtypecheck.nantrace.checks import CHECKS, check_of
from dtypecheck.nantrace.report import EventKind


def test_levels_are_ordered_best_first():
    assert LEVELS == ("ok", "warn", "fail")
    assert worst([]) == "ok"
    assert worst(["warn", "ok"]) == "warn"
    assert worst(["ok", "fail", "warn"]) == "fail"


@pytest.mark.parametrize(
    ("level", "threshold", "expected"),
    [("fail", "fail", True), ("warn", "fail", False), ("warn", "warn", True), ("ok", "warn", False)],
)
def test_at_least(level, threshold, expected):
    assert at_least(level, threshold) is expected


def test_contract_levels_for_every_check():
    # docs/contract.md "Levels": non-finite values and any overflow fail; underflow and subnormals warn.
    assert CHECK_LEVEL == {
        "nonfinite": "fail",
        "overflow": "fail",
        "underflow": "warn",
        "subnormal": "warn",
        "scaled_underflow": "warn",
    }
    assert set(CAST_CHECKS) == set(CHECK_LEVEL) - {"nonfinite"}


def test_level_of_counts_takes_the_worst_nonzero_check():
    assert level_of_counts({"overflow": 0, "underflow": 0, "subnormal": None}) == "ok"
    assert level_of_counts({"overflow": 0, "scaled_underflow": 2}) == "warn"
    assert level_of_counts({"overflow": 1, "underflow": 5}) == "fail"


def test_as_level_defaults_for_foreign_values():
    assert as_level("warn") == "warn"
    assert as_level("bogus") == "fail"
    assert as_level(None, "ok") == "ok"


# --- rule ids: every check and finding kind has one, from its registry ---------------------------------------

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dtypecheck"


def _finding_kinds_in_the_code() -> set[str]:
    """Every kind the package builds a finding with: the literal first argument (or ``kind=``) of each
    ``Finding(...)`` and ``ConsistencyFinding(...)`` call."""
    kinds: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name not in ("Finding", "ConsistencyFinding"):
                continue
            given = [k.value for k in node.keywords if k.arg == "kind"] or node.args[:1]
            for value in given:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    kinds.add(value.value)
    return kinds


def test_every_finding_kind_the_code_emits_has_a_rule() -> None:
    emitted = _finding_kinds_in_the_code()
    assert {"pickle-global", "no-tensors", "missing-shard", "dtype-consistency"} <= emitted  # the walk finds them
    assert emitted - set(FINDING_RULE) == set()
    assert set(FINDING_RULE) - emitted == {"finfo-mismatch"}  # info's mismatches are not Finding objects


def test_every_check_has_a_rule_and_every_rule_a_kind() -> None:
    assert set(CHECK_RULE) == set(get_args(Check))
    nantrace_rules = {check.name: check.rule for check in CHECKS.values()}
    used = {*CHECK_RULE.values(), *FINDING_RULE.values(), *(r for r in nantrace_rules.values() if r)}
    assert used == set(RULE_BY_ID)
    assert len(RULE_BY_ID) == len(RULES)  # ids are unique


def test_nan_trace_checks_carry_their_rule_and_only_notes_have_none() -> None:
    for check in CHECKS.values():
        if check.level == "ok":
            assert check.rule is None, check.name
        else:
            assert check.rule in RULE_BY_ID, check.name
    for kind in get_args(EventKind):
        assert check_of(kind).rule in RULE_BY_ID, kind
    assert {check_of(k).rule for k in ("nan", "inf", "near_overflow", "underflow")} == {"DTC201", "DTC202", "DTC203"}


def test_a_rule_level_is_its_check_level() -> None:
    for numeric, rule_id in CHECK_RULE.items():
        assert RULE_BY_ID[rule_id].default_level == CHECK_LEVEL[numeric]
    for check in CHECKS.values():
        if check.rule is not None and check.name != "scale_collapse":  # reported as its first producer, DTC201
            assert RULE_BY_ID[check.rule].default_level == check.level, check.name


def test_the_ci_guide_lists_every_rule_with_its_name() -> None:
    guide = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(DTC\d{3})` \| `([a-z0-9-]+)` \|", guide, re.MULTILINE))
    assert rows == {rule.id: rule.name for rule in RULES}


def test_json_doc_names_every_finding_kind() -> None:
    scan = (ROOT / "docs" / "json.md").read_text(encoding="utf-8").split("## `dtypecheck.scan/1`")[1]
    scan = scan.split("\n## ")[0]
    assert [kind for kind in FINDING_RULE if kind != "finfo-mismatch" and f"`{kind}`" not in scan] == []


def test_diagnostics_refuse_a_kind_without_a_rule() -> None:
    from dtypecheck.diagnostics import diagnostics
    from dtypecheck.scan.report import ScanReport, summarise

    finding = Finding("made-up-kind", "warn", "nothing")
    report = ScanReport("m.safetensors", "safetensors", ("float16",), (), (finding,), summarise((), (finding,)))
    with pytest.raises(ValueError, match="finding kind 'made-up-kind' has no SARIF rule"):
        diagnostics(report)
    with pytest.raises(ValueError, match="has no SARIF rule"):
        finding_rule("made-up-kind")
