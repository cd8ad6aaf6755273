"""docs/walkthrough.md, a new user's first hour (CI gate, NaN hunt, fits-a-GPU), runs end to end as written: every
file it lists is written, every command it shows is run in order, and its exit codes and output are what it shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._console import run_document

ROOT = Path(__file__).resolve().parent.parent
WALKTHROUGH = ROOT / "docs" / "walkthrough.md"


def test_the_walkthrough_runs_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    monkeypatch.chdir(tmp_path)
    ran = run_document(WALKTHROUGH.read_text(encoding="utf-8"), tmp_path, cli)
    assert [command.split()[1] for command in ran if command.startswith("dtypecheck")] == [
        *["scan-model"] * 4,
        *["nan-trace"] * 2,
        "estimate-memory",
    ]
    assert (tmp_path / "scans.json").is_file()


def test_the_readme_links_the_walkthrough() -> None:
    assert "(docs/walkthrough.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
