"""Readable tables at any width (issue 21.5) and levels where the eye looks (21.4)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.dtypes import lookup
from dtypecheck.render import OutputFormat, render
from dtypecheck.render.scan_table import DottedName
from dtypecheck.scan.run import scan_checkpoint
from examples import make_example_checkpoint
from tests.scan import _training_ckpts as ckpts

LONG = "encoder.layer.5.attention.output.LayerNorm.bias"


@pytest.mark.parametrize("width", [10, 12, 17, 20, 30, 60])
def test_names_fold_only_after_dots(width: int) -> None:
    lines = DottedName(LONG).lines(width)
    assert "".join(lines) == LONG
    assert all(line.endswith(".") for line in lines[:-1])
    assert all(len(line) <= width for line in lines)
    assert DottedName(LONG).lines(len(LONG)) == [LONG]


def test_a_part_longer_than_the_column_is_shortened_from_the_left() -> None:
    assert DottedName("model.averyveryverylongname.w").lines(10) == ["model.", "…longname.", "w"]
    assert DottedName(LONG).lines(8) == ["encoder.", "layer.5.", "…ention.", "output.", "…erNorm.", "bias"]


def _rows(text: str) -> dict[str, list[str]]:
    """Each tensor row of a rendered table by its whole name (put back together from its folded lines): the cells
    of its first line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("tensor"))
    rows: dict[str, list[str]] = {}
    name, first = "", list[str]()
    for line in lines[start + 2 :]:
        if "│" not in line:
            break
        cells = [cell.strip() for cell in line.split("│")]
        if cells[0] and name and not name.endswith("."):
            rows[name] = first
            name = ""
        if cells[0] and not name:
            first = cells
        name += cells[0]
    rows[name] = first
    return rows


def _checkpoint(tmp_path: Path) -> str:
    path = tmp_path / "enc.safetensors"
    save_file(
        {
            LONG: torch.tensor([1e-6, 1.0]),
            "encoder.layer.5.attention.output.dense.weight": torch.tensor([1.0, float("nan")]),
            "optimizer.state.0.step": torch.tensor(1e6),
        },
        str(path),
    )
    return str(path)


@pytest.mark.parametrize("width", [60, 80, 120])
def test_no_name_is_split_mid_word_at_any_width(tmp_path: Path, width: int) -> None:
    text = render(scan_checkpoint(_checkpoint(tmp_path)), OutputFormat.table, width=width)
    assert max(len(line) for line in text.splitlines()) <= width
    names = [LONG, "encoder.layer.5.attention.output.dense.weight", "optimizer.state.0.step"]
    assert sorted(_rows(text)) == sorted(names)


@pytest.mark.parametrize("width", [80, 120])
def test_each_row_shows_its_level_and_a_nan_source_fails_in_its_row(tmp_path: Path, width: int) -> None:
    rows = _rows(render(scan_checkpoint(_checkpoint(tmp_path)), OutputFormat.table, width=width))
    assert rows["encoder.layer.5.attention.output.dense.weight"][1] == "fail"  # 1 nan: fail, though fp16 is ok
    assert rows["encoder.layer.5.attention.output.LayerNorm.bias"][1] == "warn"
    assert rows["optimizer.state.0.step"][1] == "ok"
    assert "not judged" in rows["optimizer.state.0.step"]


def test_columns_is_honoured_when_stdout_is_not_a_terminal(
    cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _checkpoint(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    narrow = cli("scan-model", path).stdout.splitlines()
    assert max(len(line) for line in narrow) == 80
    monkeypatch.delenv("COLUMNS")
    assert max(len(line) for line in cli("scan-model", path).stdout.splitlines()) == 120  # the default for a pipe


def test_tiny_model_golden_at_80_columns(tmp_path: Path, golden: Callable[[str, str], None]) -> None:
    # at 120 columns: scan_tiny_model.txt (test_cli.py)
    width = 80
    path = tmp_path / "tiny_model.safetensors"
    save_file(make_example_checkpoint.build(), str(path))
    report = dataclasses.replace(scan_checkpoint(str(path)), source="tiny_model.safetensors")
    golden(f"scan_tiny_model_{width}.txt", render(report, OutputFormat.table, width=width))


@pytest.mark.parametrize("width", [80, 120])
def test_training_checkpoint_golden_at_each_width(
    tmp_path: Path, golden: Callable[[str, str], None], width: int
) -> None:
    report = scan_checkpoint(str(ckpts.plain(tmp_path, "adam")))
    report = dataclasses.replace(report, source="plain.pt")
    golden(f"scan_adam_checkpoint_{width}.txt", render(report, OutputFormat.table, width=width, limit=6))


@pytest.mark.parametrize("width", [80, 90, 100])
def test_three_targets_fit_the_width_without_cropping_a_cell(tmp_path: Path, width: int) -> None:
    """At 80 columns with ``--target fp16,bf16,e4m3`` (the README's example) the table came out 84 wide: rich
    shrank the names below their minimum, put it back after the layout, and the console cropped the last column
    at the edge (``170 u``, ``0.073``, ``unf@a``)."""
    path = tmp_path / "tiny_model.safetensors"
    save_file(make_example_checkpoint.build(), str(path))
    report = scan_checkpoint(str(path), [lookup("fp16"), lookup("bf16"), lookup("e4m3")])
    text = render(report, OutputFormat.table, width=width, limit=2)
    assert max(len(line) for line in text.splitlines()) <= width
    lines = text.splitlines()
    rows = lines[next(i for i, line in enumerate(lines) if line.startswith("tensor ")) :]
    column = [cell.strip() for cell in rows[0].split("┃")].index("e4m3")
    # every cell of the e4m3 column whole: each word a cast cell can hold
    e4m3 = [line.split("│")[column].strip() for line in rows if line.count("│") >= column]
    assert set(" ".join(e4m3).split()) == {
        "fail", "ok", "3", "ovf", "0.073%", "170", "unf", "4.2%", "2026", "sub", "49%", "4093", "unf@amax", "100%",
        "168", "4.1%", "2047", "50%",
    }  # fmt: skip
    if width >= 100:  # the sparkline, shown from 100 columns, is whole: it was cut to 5 of its 12 characters
        wide = render(report, OutputFormat.table, width=200, limit=2).splitlines()
        wide_rows = wide[next(i for i, line in enumerate(wide) if line.startswith("tensor ")) :]
        assert [line.rsplit("│", 1)[1] for line in rows[2:4]] == [line.rsplit("│", 1)[1] for line in wide_rows[2:4]]
