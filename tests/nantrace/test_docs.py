"""docs/json.md documents every field the nan-trace document holds, so that the docs cannot drift."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from dtypecheck.nantrace import report

DOCS = Path(__file__).resolve().parents[2] / "docs" / "json.md"


def test_every_nantrace_json_field_is_documented() -> None:
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## `dtypecheck.nantrace/1`") : text.index("## `dtypecheck.memory/1`")]
    classes = [
        report.NanTraceReport,
        report.Event,
        report.Location,
        report.ValueCounts,
        report.HistoryEntry,
        report.RaisedException,
        report.SkippedStep,
        report.ScaleCollapse,
        report.RankSummary,
        report.DefaultDtype,
        report.DefaultDtypeChange,
        report.Promotion,
        report.TensorArg,
        report.DtypeError,
    ]
    missing = [
        f"{cls.__name__}.{field.name}"
        for cls in classes
        for field in dataclasses.fields(cls)
        if not re.search(rf"\b{field.name}\b", section)
    ]
    assert missing == []
