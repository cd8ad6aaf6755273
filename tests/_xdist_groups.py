"""Which tests pytest-xdist must keep on one worker: those sharing an expensive fixture of this suite.

A test file that defines a module-scoped fixture (a hostile corpus written once for the module) is one group; the
files that use a session-scoped fixture of ``tests/conftest.py`` (the command documents) are one group per
fixture. Every other test is a group of its own, so it goes wherever a worker is free. The scheduler sees only
node ids (it does not collect), so the groups are read from the files' source.
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


def group_of(nodeid: str) -> str:
    """The scheduling unit of a test: its file's group, or the test itself."""
    return groups().get(nodeid.split("::", 1)[0], nodeid)


class FixtureGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
    """xdist's scope scheduler (largest units first) with ``group_of`` as the scope."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)
