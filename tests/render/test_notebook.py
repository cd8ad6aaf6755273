"""examples/notebook.ipynb run for real (nbclient and an ipykernel): each report cell shows the HTML report, whose
facts match the same call made here, in the test's own process."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from dtypecheck.scan import scan_checkpoint
from tests.render._html_dom import Element, parse, table_rows

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"


@pytest.fixture(scope="module")
def cells(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Element]]:
    """The notebook executed in a fresh folder; the HTML each code cell displayed, parsed (None-like: empty)."""
    folder = tmp_path_factory.mktemp("notebook")
    shutil.copy(NOTEBOOK, folder / NOTEBOOK.name)
    notebook = nbformat.read(folder / NOTEBOOK.name, as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    ).execute()
    shown = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert errors == [], cell.source
        html = [
            o.data["text/html"] for o in cell.outputs if o.output_type == "execute_result" and "text/html" in o.data
        ]
        shown.append(parse(html[0]) if html else Element("#empty", {}))
    return folder, shown


def test_the_notebook_has_one_report_cell_per_command(cells) -> None:
    _folder, shown = cells
    reports = [cell for cell in shown if cell.find_all("div", class_="dtypecheck-report")]
    titles = [cell.find_all("h1")[0].clean_text().split()[1] for cell in reports]
    assert titles == ["scan-model", "nan-trace", "estimate-memory", "info"]


def test_the_scan_cell_shows_the_scan_report(cells) -> None:
    folder, shown = cells
    cell = shown[1]
    report = scan_checkpoint(str(folder / "tiny.safetensors"))
    verdicts = {v.target: v for v in report.summary.verdicts}
    for card in (d for d in cell.find_all("div") if "data-target" in d.attrs):
        verdict = verdicts[card.attrs["data-target"]]
        assert card.find_all("span", data_level=verdict.level)
    # float16 overflows 7e4 and flushes 1e-10 (below 2**-25); bfloat16 (the default's other target) holds both
    assert (verdicts["float16"].overflow, verdicts["float16"].underflow) == (1, 1)
    assert (verdicts["bfloat16"].overflow, verdicts["bfloat16"].underflow) == (0, 0)
    rows = {row.attrs["data-name"]: row.attrs["data-level"] for row in cell.by_id("tensors").find_all("tr")[1:]}
    assert rows == {"layer.weight": "fail", "norm.weight": "ok"}


def test_the_trace_cell_shows_the_first_producer(cells) -> None:
    _folder, shown = cells
    cell = shown[2]
    assert cell.by_id("status-value").clean_text() == "nonfinite"
    assert cell.by_id("first-op").clean_text() == "aten.log.default"
    (marked,) = cell.by_id("source").find_all("span", class_="culprit")
    assert "torch.log(model(torch.ones(3, 4)) - 100)" in marked.clean_text()


def test_the_memory_cell_shows_each_estimate(cells) -> None:
    _folder, shown = cells
    cell = shown[3]
    # 64*64 + 64 + 64*8 + 8 = 4,680 parameters; float32 inference holds 4,680 x 4 bytes of weights
    assert "4,680 parameters" in cell.find_all("header")[0].clean_text()
    rows = table_rows(cell.by_id("estimates"))
    assert rows[0][:2] == ["float32 inference pure, batch 4", f"{4680 * 4 / 1024:.2f} KiB"]  # torch.randn(4, 64)
    assert len(rows) == 9


def test_the_info_cell_shows_each_dtype(cells) -> None:
    _folder, shown = cells
    cell = shown[4]
    sections = [s.attrs["id"] for s in cell.find_all("section") if s.attrs.get("class") == "dtype"]
    assert sections == ["dtype-float16", "dtype-float8_e4m3fn"]
    assert cell.by_id("dtype-float8_e4m3fn").find_all("span", class_="max")[0].clean_text() == "448"
