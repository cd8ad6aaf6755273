"""The dynamic-range number line fits a narrow console instead of wrapping its range labels."""

from __future__ import annotations

import dtypecheck
from dtypecheck.render.table import render_table


def test_number_line_rows_fit_100_columns() -> None:
    names = ["fp16", "bf16", "e4m3", "fp4", "e8m0"]
    report = dtypecheck.describe_dtypes([dtypecheck.lookup(n) for n in names])
    text = render_table(report, width=100)
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dynamic range"))
    rows = lines[start + 1 : start + 1 + len(names)]
    # each row keeps its range label on the same line: 2^-24 .. 65504 is float16's (2^-24 = smallest subnormal)
    assert rows[0].startswith("float16")
    assert rows[0].endswith("2^-24 .. 65504")
    assert rows[1].startswith("bfloat16")
    assert rows[1].endswith("2^-133 .. 3.3895e+38")
    assert all(len(line) <= 100 for line in lines[start:])
