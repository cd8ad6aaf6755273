"""The one findings model: level order, the check rule table, and reading levels from outside."""

from __future__ import annotations

import pytest

from dtypecheck.findings import CAST_CHECKS, CHECK_LEVEL, LEVELS, as_level, at_least, level_of_counts, worst


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
