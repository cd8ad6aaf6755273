"""The Python API example runs as written (docs/api.md, where the README's Python API block moved; the README's
short block is a subset of it). nan-trace's train.py and mixed.py outputs are made by the docs build from their own
listings (docs/hooks/examples.py, checked by tests/test_docs_site.py), so their line numbers cannot drift again."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
API = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")


def test_the_python_api_block_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = re.findall(r"```python\n(.*?)```", API, re.DOTALL)[0]
    monkeypatch.chdir(tmp_path)
    names: dict[str, Any] = {}
    exec(compile(code, "docs/api.md (Python API)", "exec"), names)
    # What its comments say each line gives:
    info, scan, gated, traced = (names[n] for n in ("info", "scan", "gated", "t"))
    assert info.dtypes[0].guidance.adam_eps_1e_8 == 0.0
    assert (scan.summary.level, [t.name for t in scan.tensors if t.level == "fail"]) == ("ok", [])
    assert (tmp_path / "ci" / "baseline.json").is_file()
    assert gated.gate_level == "ok"
    assert traced.report.first is None
    api = names["dtypecheck"]
    estimate = api.estimate_memory(names["subject"], api.EstimateOptions()).estimates[0]
    assert (estimate.dtype, estimate.mode, estimate.bytes.total) == ("float32", "inference", (256 * 256 + 256) * 4)


def test_the_readme_block_is_part_of_the_api_example() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (short,) = re.findall(r"## Python API.*?```python\n(.*?)```", readme, re.DOTALL)
    lines = [line for line in short.splitlines() if line.strip()]
    assert all(line in API for line in lines), [line for line in lines if line not in API]
