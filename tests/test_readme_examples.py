"""The README's examples run as written: the Python API block, and nan-trace's train.py and mixed.py with the
output the README shows for them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests._console import run_document

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(title)
    end = re.compile(r"\n#{2,4} ").search(README, start + len(title))
    assert end is not None
    return README[start : end.start()]


def test_the_python_api_block_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (code,) = re.findall(r"```python\n(.*?)```", _section("## Python API"), re.DOTALL)
    monkeypatch.chdir(tmp_path)
    names: dict[str, Any] = {}
    exec(compile(code, "README.md (Python API)", "exec"), names)
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


def test_nan_trace_examples_run_as_written_with_the_output_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    section = _section("### `dtypecheck nan-trace SCRIPT`")
    start = section.index("```python\n# train.py")
    mixed = section.index("```python\n# mixed.py")
    end = section.index("```\n", section.index("```console", mixed) + 3) + 4
    monkeypatch.chdir(tmp_path)
    ran = run_document(section[start:end], tmp_path, cli)
    assert ran == [
        "dtypecheck nan-trace train.py --autocast fp16 --history 6",
        "dtypecheck nan-trace train.py",
        "dtypecheck nan-trace mixed.py",
    ]
