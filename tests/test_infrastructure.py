"""The test suite's own set-up: parallel workers keep the tests of an expensive fixture together."""

from __future__ import annotations

import re
from pathlib import Path

from tests._xdist_groups import group_of, groups

ROOT = Path(__file__).resolve().parent.parent


def test_tests_of_a_module_fixture_share_one_worker() -> None:
    assert group_of("tests/security/test_hangs.py::test_baseline_from_a_device_is_refused") == (
        "module:tests/security/test_hangs.py"
    )
    assert group_of("tests/security/test_hangs.py::test_a_million_names_of_one_tensor_are_scanned_once") == (
        "module:tests/security/test_hangs.py"
    )


def test_users_of_a_session_fixture_share_one_worker_and_the_rest_go_anywhere() -> None:
    assert group_of("tests/test_docs.py::test_json_doc_names_every_key_a_real_document_has") == (
        "session:command_documents"
    )
    assert group_of("tests/render/test_json_golden.py::test_json_document_golden[info]") == "session:command_documents"
    alone = "tests/cli/test_cli.py::test_version"
    assert group_of(alone) == alone
    assert all(key.startswith("tests/") and key.endswith(".py") for key in groups())


def test_make_unit_runs_parallel_workers_with_the_grouping_scheduler() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^\t\$\(BIN\)/pytest -q -n \$\(PYTEST_WORKERS\) --dist loadgroup", makefile, re.MULTILINE)
    pins = (ROOT / "requirements-dev.txt").read_text(encoding="utf-8").splitlines()
    assert "pytest-xdist==3.8.0" in pins
