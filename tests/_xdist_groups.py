"""Which tests pytest-xdist must keep on one worker: those sharing an expensive fixture of this suite.

A test file that defines a module-scoped fixture (a hostile corpus written once for the module) is one group; the
files that use a session-scoped fixture of ``tests/conftest.py`` (the command documents) are one group per
fixture. Every other test is a group of its own, so it goes wherever a worker is free. The scheduler sees only
node ids (it does not collect), so the groups are read from the files' source.

The groups are handed out longest first (``LONG_S``), so that the run ends on short tests: xdist's own order (most
tests first) put the single tests that launch several interpreters last, and a 26 s one starting in the last
minute left the other worker idle for most of it.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _fixture_scope(node: ast.FunctionDef) -> str | None:
    """``"module"`` or ``"session"`` for a function decorated ``@pytest.fixture(scope=...)``, else None."""
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("fixture"):
            for keyword in decorator.keywords:
                if keyword.arg == "scope" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
    return None


def _fixtures(path: Path) -> dict[str, str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    scopes = {node.name: _fixture_scope(node) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    return {name: scope for name, scope in scopes.items() if scope in ("module", "session")}


@cache
def groups() -> dict[str, str]:
    """Test file (relative to the repository, as in node ids) -> its group."""
    shared = [name for name, scope in _fixtures(TESTS / "conftest.py").items() if scope == "session"]
    found: dict[str, str] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        key = path.relative_to(ROOT).as_posix()
        if "module" in _fixtures(path).values():
            found[key] = f"module:{key}"
            continue
        text = path.read_text(encoding="utf-8")
        used = [name for name in shared if re.search(rf"\b{re.escape(name)}\b", text)]
        if used:
            found[key] = f"session:{used[0]}"
    return found


LONG_S = {
    "tests/nantrace/test_distributed.py::test_fsdp2_nan_on_rank_1_and_a_clean_fsdp2_run": 26,
    "tests/test_release.py::test_the_readme_pre_commit_snippet_runs_as_written": 19,
    "tests/scan/test_ranks.py::test_ranks_under_their_own_launcher_exit_as_a_single_process": 18,
    "tests/security/test_robustness.py::test_lone_surrogates_are_escaped_in_every_format": 17,
    "tests/nantrace/test_distributed.py::test_torchrun_ddp_nan_born_on_rank_1_is_named_once_and_every_rank_stops": 13,
    "tests/memory/test_lazy_dynamo.py::test_a_config_estimate_does_not_import_dynamo_and_equals_one_made_with_it": 20,
    "tests/nantrace/test_distributed.py::test_a_gradient_nan_averaged_into_rank_0_is_blamed_on_rank_1": 12,
    "tests/nantrace/test_children.py::test_dataloader_workers_leave_one_document_and_a_quiet_stderr": 12,
    "tests/nantrace/test_children.py::test_a_value_made_in_a_worker_is_named_at_the_workers_line_in_both_modes": 12,
    "tests/security/test_gate_globals.py::test_every_payload_is_live": 12,
    "tests/nantrace/test_distributed.py::test_a_clean_ddp_run_through_nproc_exits_0": 11,
    "tests/nantrace/test_watch_distributed.py::test_watch_on_two_ddp_ranks_replays_on_the_rank_of_birth": 10,
    "tests/nantrace/test_watch_distributed.py::test_watch_on_a_clean_ddp_run_exits_0": 10,
    "tests/memory/test_diffusers.py::test_diffusers_configs_estimate_within_1_percent_of_memtracker": 9,
    "tests/render/test_notebook.py::test_the_notebook_has_one_report_cell_per_command": 8,
    "tests/security/test_other.py::test_every_input_is_handled_per_contract": 8,
    "tests/nantrace/test_consequences.py::test_a_nan_every_step_collapses_the_scale_and_fails": 8,
    "tests/scan/test_ranks.py::test_torchrun_writes_the_single_process_document": 8,
    "tests/nantrace/test_consequences.py::test_max_skipped_steps_comes_from_the_project_config": 8,
    "tests/security/test_globals.py::test_every_gadget_fails_the_gate_and_its_canary_is_live": 7,
    "tests/memory/test_lazy_dynamo.py::"
    "test_a_dynamo_submodule_imported_under_the_stand_in_is_loaded_once_by_the_real_package": 8,
    "tests/memory/test_lazy_dynamo.py::test_a_decorator_disabling_dynamo_under_the_stand_in_gets_the_real_disable": 7,
    "tests/security/test_gadgets.py::test_shipped_with_torch_gadgets_fail_and_sympy_lambda_is_live": 7,
    "tests/nantrace/test_children.py::test_a_nan_made_in_a_worker_is_named_at_the_workers_line": 7,
    "tests/memory/test_fit.py::test_traces_shared_among_forked_workers_give_the_same_report_as_one_process": 7,
    "tests/security/test_unread_pickles.py::test_hidden_pickles_fail_the_gate_and_their_canaries_are_live": 7,
    "tests/test_install.py::test_scan_model_runs_from_a_read_only_wheel_install_and_writes_nothing_into_it": 11,
}
"""Seconds a test (each of its parameters) took on one worker of a loaded 2-core machine, for the tests that take
several; the order they are handed out in, nothing more: a test missing here is only scheduled by its count."""

SHORT_S = 0.25
"""A test's seconds when it is not in ``LONG_S``: the suite's mean."""


def cost(nodeids: list[str]) -> float:
    """The expected seconds of a scheduling unit."""
    return sum(LONG_S.get(nodeid.split("[", 1)[0], SHORT_S) for nodeid in nodeids)


def group_of(nodeid: str) -> str:
    """The scheduling unit of a test: its file's group, or the test itself."""
    return groups().get(nodeid.split("::", 1)[0], nodeid)


class FixtureGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
    """xdist's scope scheduler with ``group_of`` as the scope, handing out the longest units (``cost``) first."""

    _ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)

    def _assign_work_unit(self, node: object) -> None:
        if not self._ordered:  # the first call: the queue is whole (xdist fills it, then assigns)
            units = sorted(self.workqueue.items(), key=lambda unit: -cost(list(unit[1])))
            self.workqueue.clear()
            self.workqueue.update(units)
            self._ordered = True
        super()._assign_work_unit(node)
