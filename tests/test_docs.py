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


# --- docs/json.md against what the JSON renderer writes -------------------------------------------------------

JSON_DOC = ROOT / "docs" / "json.md"
DATA_KEYED = frozenset({"casts", "census", "devices", "fraction", "constructors"})
"""Fields whose keys are data (target and dtype names, devices, checks, constructor calls), not schema words."""


def _report_types() -> dict[str, type]:
    from dtypecheck.info import InfoReport
    from dtypecheck.info.names import DtypeList
    from dtypecheck.memory.report import MemoryReport
    from dtypecheck.nantrace.report import NanTraceReport
    from dtypecheck.scan.report import ScanReport

    return {cls.SCHEMA: cls for cls in (InfoReport, DtypeList, ScanReport, MemoryReport, NanTraceReport)}


def _json_section(schema: str) -> str:
    text = JSON_DOC.read_text(encoding="utf-8")
    match = re.search(rf"^## `{re.escape(schema)}`\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"docs/json.md has no section for {schema}"
    return match.group(1)


def _names_a_key(section: str, key: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", section) is not None


def _dataclass_fields(cls: type) -> set[str]:
    """Every field the JSON renderer writes for ``cls``: its own and, through its annotations, those of every
    dataclass it holds (in optionals, tuples, lists and mapping values)."""
    import collections.abc
    import dataclasses
    import typing

    found: set[str] = set()
    seen: set[type] = set()

    def inner_types(annotation: object) -> list[type]:
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            return [annotation]
        origin = typing.get_origin(annotation)
        arguments = typing.get_args(annotation)
        if isinstance(origin, type) and issubclass(origin, collections.abc.Mapping):
            arguments = arguments[1:]  # the keys are data
        return [t for argument in arguments for t in inner_types(argument)]

    def walk(current: type) -> None:
        if current in seen:
            return
        seen.add(current)
        hints = typing.get_type_hints(current)
        for field in dataclasses.fields(current):
            if field.repr:  # what render.json.jsonable writes
                found.add(field.name)
                for nested in inner_types(hints[field.name]):
                    walk(nested)

    walk(cls)
    return found


def _document_keys(value: object, found: set[str]) -> set[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            found.add(key)
            if key in DATA_KEYED and isinstance(item, dict):
                for nested in item.values():
                    _document_keys(nested, found)
            else:
                _document_keys(item, found)
    elif isinstance(value, list):
        for item in value:
            _document_keys(item, found)
    return found


@pytest.fixture
def documents(command_documents: dict[str, tuple[Path, dict[str, object]]]) -> dict[str, dict[str, object]]:
    return {command: document for command, (_folder, document) in command_documents.items()}


@pytest.mark.parametrize("schema", sorted(_report_types()))
def test_json_doc_names_every_field_of_the_report_dataclasses(schema: str) -> None:
    section = _json_section(schema)
    fields = _dataclass_fields(_report_types()[schema])
    assert len(fields) > 5, schema
    missing = sorted(field for field in fields if not _names_a_key(section, field))
    assert missing == [], f"docs/json.md's {schema} section does not describe {missing}"


def test_json_doc_names_every_key_a_real_document_has(documents: dict[str, dict[str, object]]) -> None:
    missing = {}
    for document in documents.values():
        schema = document["schema"]
        assert isinstance(schema, str)
        section = _json_section(schema)
        keys = _document_keys(document, set()) - {"schema", "dtypecheck_version"}
        absent = sorted(key for key in keys if not _names_a_key(section, key))
        if absent:
            missing[schema] = absent
    assert set(documents) == {"info", "info-list", "scan-model", "estimate-memory", "nan-trace"}
    assert missing == {}, f"docs/json.md does not describe these keys: {missing}"


def test_json_doc_says_every_document_has_schema_and_version() -> None:
    preamble = JSON_DOC.read_text(encoding="utf-8").split("\n## ", 1)[0]
    assert '`"schema"`' in preamble
    assert '`"dtypecheck_version"`' in preamble


@pytest.mark.parametrize("schema", sorted(_report_types()))
def test_json_doc_skeleton_shows_only_real_fields(schema: str) -> None:
    # The converse: a field renamed or removed in the code must not live on in the document's outline.
    outline = re.search(r"^```\n(.*?)^```", _json_section(schema), re.MULTILINE | re.DOTALL)
    assert outline, f"docs/json.md's {schema} section has no outline"
    shown = set(re.findall(r'(?:^\s*|[{,]\s*)"(\w+)":', outline.group(1), re.MULTILINE))
    assert {"schema", "dtypecheck_version"} <= shown
    fields = _dataclass_fields(_report_types()[schema])
    assert shown - {"schema", "dtypecheck_version"} - fields == set()


def test_json_doc_names_every_checkpoint_format() -> None:
    from dtypecheck.loaders.formats import FORMATS

    section = _json_section("dtypecheck.scan/1")
    names = [f.name for f in FORMATS]
    assert "safetensors" in names
    assert [name for name in (*names, "folder", "live-model") if f"`{name}`" not in section] == []
