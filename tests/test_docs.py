"""The project's documents stand on their own: the contract lives in docs/, and nothing points outside the repo."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from dtypecheck.cli import INTERRUPTED
from dtypecheck.errors import ExitCode
from dtypecheck.findings import LEVELS

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "docs" / "contract.md"
OUTSIDE = ("../" + "shared", "shared/" + "CONTRACT.md")  # spelled in parts: this file must not match itself
_SKIPPED_PARTS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules"}


def _project_files() -> list[Path]:
    """The files git tracks or would track (untracked, not ignored: a reference added before ``git add`` counts
    too), or, outside a git checkout, every file below the root except caches and the venv."""
    try:
        command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        listed = subprocess.run(command, cwd=ROOT, capture_output=True, check=True, timeout=60).stdout.decode()
        files = [ROOT / name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in ROOT.rglob("*") if p.is_file() and not _SKIPPED_PARTS & set(p.relative_to(ROOT).parts)]
    return [p for p in files if p.is_file()]  # a file deleted but not yet staged is still listed


def test_no_file_points_outside_the_repository() -> None:
    offenders = []
    for path in _project_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary fixtures (example checkpoints)
        for number, line in enumerate(text.splitlines(), 1):
            if any(needle in line for needle in OUTSIDE):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == [], "point to docs/contract.md instead:\n" + "\n".join(offenders)


def test_readme_points_to_the_contract_in_the_repository() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/contract.md)" in readme
    assert CONTRACT.is_file()


def _section(markdown: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", markdown, re.MULTILINE | re.DOTALL)
    assert match, f"docs/contract.md has no section {title!r}"
    return match.group(1)


def test_contract_lists_every_exit_code_with_its_name() -> None:
    table = _section(CONTRACT.read_text(encoding="utf-8"), "Exit codes")
    rows = dict(re.findall(r"^\| (\d+) \| `?\(?`?([A-Za-z_.]+)", table, re.MULTILINE))
    assert rows == {**{str(int(code)): code.name for code in ExitCode}, str(INTERRUPTED): "cli.INTERRUPTED"}


def test_contract_states_the_level_order_and_each_command_schema() -> None:
    contract = CONTRACT.read_text(encoding="utf-8")
    assert " < ".join(LEVELS) in _section(contract, "Levels")
    for command, schema in [
        ("info", "dtypecheck.info/1"),
        ("scan-model", "dtypecheck.scan/1"),
        ("estimate-memory", "dtypecheck.memory/1"),
        ("nan-trace", "dtypecheck.nantrace/1"),
    ]:
        assert f'"schema": "{schema}"' in _section(contract, f"`{command}`"), command


@pytest.mark.parametrize("document", ["README.md", "docs/json.md", "docs/contract.md"])
def test_relative_links_in_documents_resolve(document: str) -> None:
    path = ROOT / document
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    assert local, document
    missing = [link for link in local if not (path.parent / link).exists()]
    assert missing == [], f"{document} links to missing files: {missing}"
