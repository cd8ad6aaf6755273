"""The fork executor behind ``--fit``'s side-by-side traces: results in order, failures rerun by the caller."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from dtypecheck.memory.side_by_side import _shares, side_by_side


def test_each_result_comes_back_in_its_place_from_whichever_process_ran_it():
    # The pid shows which process ran each task: this one for its share, a child for the other.
    def square(i: int) -> Callable[[], tuple[int, int]]:
        return lambda: (i * i, os.getpid())

    results = side_by_side([square(i) for i in range(6)], workers=2)
    assert [r[0] for r in results if r] == [0, 1, 4, 9, 16, 25]
    pids = {r[1] for r in results if r}
    assert os.getpid() in pids
    assert len(pids) == 2


def test_a_task_that_raises_or_a_child_that_dies_gives_none_and_leaves_no_child():
    def boom() -> int:
        raise ValueError("no")

    def die() -> int:
        os._exit(3)

    before = _children()
    # By hand: this process takes boom (the heaviest) and the 2, the child the 1 and die; the child exits without
    # answering, so its 1 is lost with it and run again by the caller.
    results = side_by_side([boom, lambda: 1, lambda: 2, die], weights=[3, 1, 1, 2], workers=2)
    assert results == [None, None, 2, None]
    assert _children() <= before  # the child was reaped


def _children() -> set[str]:
    pid = os.getpid()
    return set(Path(f"/proc/{pid}/task/{pid}/children").read_text("ascii").split())


def test_shares_put_the_heaviest_first_on_the_least_loaded():
    # Weights 3, 2, 1, 3, 2, 1 (block counts of two checks), by hand: 0 and 3 (3 each) split, then 1 and 4, then
    # 2 and 5: 3 + 2 + 1 on each side.
    assert _shares([3, 2, 1, 3, 2, 1], 2) == [[0, 1, 2], [3, 4, 5]]
    assert _shares([1, 1], 1) == [[0, 1]]


def test_fit_workers_is_a_project_setting_of_positive_integers():
    from dtypecheck.config import validate
    from dtypecheck.errors import DtypecheckError

    settings = validate({"estimate-memory": {"fit-workers": 2}}, "pyproject.toml")
    assert settings.get("estimate-memory", "fit-workers") == 2
    for bad in (0, "two"):
        with pytest.raises(DtypecheckError, match="fit-workers"):
            validate({"estimate-memory": {"fit-workers": bad}}, "pyproject.toml")
