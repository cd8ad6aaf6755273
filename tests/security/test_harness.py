"""The harness's one reading of a command's standard error (``read_stderr``), which every verdict is taken from."""

from __future__ import annotations

from tests.security.harness import code_under_test, handled, one_error_line, own_traceback, read_stderr

USERS_OWN = 'Traceback (most recent call last):\n  File "/tmp/user/model.py", line 3, in factory\nValueError: no\n'
OURS = f'Traceback (most recent call last):\n  File "{code_under_test()}/dtypecheck/cli.py", line 9\nKeyError\n'


def test_one_error_line_is_the_contracts_failure_output() -> None:
    assert one_error_line("error: x.pt: corrupt zip archive\n")
    assert not one_error_line("error: one\nerror: two\n")
    assert not one_error_line("warning: x\n")
    assert not one_error_line("error: Traceback follows\n")  # "Traceback" anywhere: never the contract's line


def test_a_traceback_is_ours_only_through_our_frames() -> None:
    assert own_traceback(OURS)
    assert not own_traceback(USERS_OWN + "error: model.py:factory raised ValueError: no\n")
    assert own_traceback("Traceback (most recent call last):\nMemoryError\n")  # no frame: cannot be the user's
    assert not own_traceback("error: fine\n")


def test_handled_follows_the_exit_code_and_the_one_line() -> None:
    assert handled(1, "", frozenset({1}))
    assert handled(3, "error: bad\n", frozenset({3}))
    assert not handled(3, "error: bad\nerror: worse\n", frozenset({3}))
    assert not handled(0, "", frozenset({1}))
    assert not handled(1, OURS, frozenset({1}))


def test_the_last_line_is_that_of_the_stripped_text() -> None:
    read = read_stderr(USERS_OWN + "error: model.py:factory raised ValueError: no  \n\n")
    assert read.last == "error: model.py:factory raised ValueError: no"
    assert read.lines[-1] == "error: model.py:factory raised ValueError: no  "
    assert read_stderr("").last == ""
