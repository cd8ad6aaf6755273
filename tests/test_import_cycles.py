"""The package has no import circle: every ``import`` of a dtypecheck module, wherever it is written (module level,
inside a function, under ``TYPE_CHECKING``), is an edge, and the graph of ``dtypecheck/`` must be acyclic.

A function-level import still ties two modules together (one cannot be understood, tested or moved without the
other); deferring it only hides the circle from Python, not from the reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dtypecheck"


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``package`` (a package is its ``__init__``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` is, or the package it is an attribute of (``from a.b import C``: ``a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of the package that ``module``'s source imports, anywhere in the file."""
    root = next(iter(modules)).split(".")[0]
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(_known(alias.name, modules) for alias in node.names if alias.name.split(".")[0] == root)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            if base.split(".")[0] != root:
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else _known(base, modules))
    found.discard(module)
    found.discard(None)
    return {m for m in found if m is not None}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; self-loops excluded."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so that a deep chain cannot hit the recursion limit.
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_cycle_finder_finds_a_planted_circle_and_nothing_else(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub import b  # the package re-exports its module\n")
    (package / "sub" / "a.py").write_text("def f():\n    from pkg.sub.b import g\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\nimport os\n"
    )
    (package / "sub" / "c.py").write_text("from .a import f\n")
    (package / "leaf.py").write_text("import pkg.sub.a\n")
    modules = module_files(package)
    graph = {m: imports_of(m, p, modules) for m, p in modules.items()}
    assert graph["pkg.sub.b"] == {"pkg.sub.c"}
    assert graph["pkg.leaf"] == {"pkg.sub.a"}
    # a -> b (in a function), b -> c (TYPE_CHECKING, relative), c -> a: one circle of three; the package's
    # re-export of b is an edge out of it, not into it.
    assert cycles(graph) == [["pkg.sub.a", "pkg.sub.b", "pkg.sub.c"]]


def test_dtypecheck_has_no_import_circle() -> None:
    modules = module_files(PACKAGE)
    assert "dtypecheck.nantrace.tracer" in modules
    graph = {m: imports_of(m, p, modules) for m, p in modules.items()}
    assert cycles(graph) == []


# --- layering: the cores stand on the ground floor, never on render/ or cli/ or each other's internals ---------

PACKAGE_CORES = ("dtypecheck.scan", "dtypecheck.memory", "dtypecheck.nantrace")
ABOVE = ("dtypecheck.render", "dtypecheck.cli")

LAYER_RULES: dict[str, tuple[str, ...]] = {
    **{core: (*ABOVE, *(other for other in PACKAGE_CORES if other != core)) for core in PACKAGE_CORES},
    "dtypecheck.config": (*ABOVE, *PACKAGE_CORES),
}
"""What each core may not import: the atomic writer and the JSON form of a result live in ``dtypecheck.output``
and the cast-target rule in ``dtypecheck.targets`` (the ground floor), so ``scan.gate``/``scan.baseline`` no longer
reach up into ``render`` nor ``config`` into ``scan.targets``. What two cores share stands there too: the launcher's
rank and store (``dtypecheck.launcher``, for nan-trace's and scan-model's ranks) and estimate-memory's word lists
(``dtypecheck.memory_words``, which the config validates). ``scan`` still reads the project config's
``ScanPolicy``: the config is the one place a project's policy is parsed, and it imports no core."""

LAYER_EXCEPTIONS: set[tuple[str, str]] = set()
"""None left: nan-trace's launcher is handed its renderer by the CLI."""


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    found = set()
    for module, imported in graph.items():
        for core, forbidden in LAYER_RULES.items():
            if _within(module, core):
                found |= {(module, dep) for dep in imported if any(_within(dep, f) for f in forbidden)}
    return found


def test_the_layer_rule_catches_the_old_upward_imports() -> None:
    old = {
        "dtypecheck.scan.gate": {"dtypecheck.render"},
        "dtypecheck.scan.baseline": {"dtypecheck.render.json"},
        "dtypecheck.config": {"dtypecheck.scan.targets", "dtypecheck.memory.names"},
        "dtypecheck.scan.ranks": {"dtypecheck.nantrace.distributed"},
    }
    assert layer_violations(old) == {(m, d) for m, deps in old.items() for d in deps}


def test_cores_do_not_import_render_cli_or_each_other() -> None:
    modules = module_files(PACKAGE)
    graph = {m: imports_of(m, p, modules) for m, p in modules.items()}
    assert layer_violations(graph) == LAYER_EXCEPTIONS  # an exception no longer needed must be removed too
