"""Each HTML report opened in a real browser (headless Chromium): the DOM after its script ran holds the run's key
facts (checked against the JSON of the same run), the page asks for nothing outside itself, and a screenshot of it
is kept in the test's folder (``docs/screenshots.py`` makes the ones in ``docs/``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.render.cells import fmt_bytes
from tests.render import _browser
from tests.render._html_dom import Element, parse, table_rows
from tests.render.test_html import HOSTILE

pytestmark = pytest.mark.skipif(
    _browser.chromium() is None,
    reason="headless Chromium is not installed: `make test` installs Debian's chromium package as root "
    "(apt-get install chromium); without root or apt it cannot, and only this browser test is skipped",
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _open(run_html: str, folder: Path, name: str) -> tuple[Element, _browser.Opened, Path]:
    page = folder / f"{name}.html"
    page.write_text(run_html, encoding="utf-8")
    shot = folder / f"{name}.png"
    opened = _browser.open_page(page, screenshot=shot)
    assert opened.requests == [], f"{name} asked for {opened.requests}"
    assert shot.read_bytes()[:8] == PNG_SIGNATURE
    assert shot.stat().st_size > 10_000  # a drawn page, not a blank one
    return parse(opened.dom), opened, shot


def test_scan_report_in_the_browser(html_runs, tmp_path: Path) -> None:
    run = html_runs["scan-model"]
    dom, _opened, _shot = _open(run.html, tmp_path, "scan-model")
    for verdict in run.document["summary"]["verdicts"]:
        (card,) = [d for d in dom.find_all("div") if d.attrs.get("data-target") == verdict["target"]]
        assert card.find_all("span", data_level=verdict["level"]), verdict["target"]
    assert dom.by_id("tensor-count").clean_text() == str(run.document["summary"]["tensors"]) == "3"
    summary = run.document["summary"]
    assert (
        dom.by_id("level-counts").clean_text()
        == f"{summary['ok']} ok · {summary['warn']} warn · {summary['fail']} fail"
    )
    (box,) = dom.find_all("div", data_filter_for="tensors")
    assert "hidden" not in box.attrs  # the page's script ran (the CSP lets inline script run, nothing else)
    assert box.attrs.get("data-bound") == "1"


def test_a_hostile_tensor_name_stays_text_in_the_browser(tmp_path: Path, cli) -> None:
    checkpoint = tmp_path / "m.safetensors"
    save_file({HOSTILE: torch.tensor([1.0, float("inf")])}, str(checkpoint))
    result = cli("scan-model", str(checkpoint), "--format", "html", "-q")
    assert result.exit_code == 1
    dom, _opened, _shot = _open(result.stdout, tmp_path, "hostile")
    assert dom.find_all("title")[0].clean_text() == "dtypecheck scan-model"  # the name's script did not run
    assert len(dom.find_all("script")) == 1
    assert dom.find_all("img") == []
    (row,) = dom.by_id("tensors").find_all("tr", data_level="fail")
    assert row.attrs["data-name"] == HOSTILE


def test_nantrace_report_in_the_browser(html_runs, tmp_path: Path) -> None:
    run = html_runs["nan-trace"]
    dom, _opened, _shot = _open(run.html, tmp_path, "nan-trace")
    first = run.document["first"]
    assert dom.by_id("status-value").clean_text() == run.document["status"]
    assert dom.by_id("first-op").clean_text() == first["op"]
    assert dom.by_id("culprit-line").clean_text() == f"{first['location']['file']}:{first['location']['line']}"
    (marked,) = dom.by_id("source").find_all("span", class_="culprit")
    assert marked.attrs["data-line"] == str(first["location"]["line"])


def test_memory_report_in_the_browser(html_runs, tmp_path: Path) -> None:
    run = html_runs["estimate-memory"]
    dom, _opened, _shot = _open(run.html, tmp_path, "estimate-memory")
    rows = table_rows(dom.by_id("estimates"))
    assert [row[-2] for row in rows] == [fmt_bytes(e["bytes"]["total"]) for e in run.document["estimates"]]


def test_info_report_in_the_browser(html_runs, tmp_path: Path) -> None:
    run = html_runs["info"]
    dom, _opened, _shot = _open(run.html, tmp_path, "info")
    sections = [s.attrs["id"] for s in dom.find_all("section") if s.attrs.get("class") == "dtype"]
    assert sections == [f"dtype-{d['name']}" for d in run.document["dtypes"]]
    assert dom.by_id("dtype-float16").find_all("span", class_="max")[0].clean_text() == "65504"


def test_the_request_check_sees_a_page_that_reaches_out(tmp_path: Path) -> None:
    # Without this, an empty request list could also mean the network log is not read right.
    page = tmp_path / "reaching.html"
    page.write_text('<html><body><img src="http://127.0.0.1:9/x.png"><p>hi</p></body></html>', encoding="utf-8")
    opened = _browser.open_page(page)
    assert opened.requests == ["http://127.0.0.1:9/x.png"]


STEP_FACTORY = """
import torch
from torch import nn


def two():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 4, bias=False))
    return model, torch.randn(2, 8)
"""

WEIGHTS_BLUE, GRADIENTS_RED = (0x4C, 0x72, 0xB0), (0xC4, 0x4E, 0x52)
"""memory_plot's fills for the resident bytes and the gradients (drawn at 85% over the phase shading)."""


def _pixels_near(shot: Path, colour: tuple[int, int, int], within: int = 45) -> int:
    from PIL import Image

    with Image.open(shot) as image:
        rgb = image.convert("RGB")
        return sum(
            count
            for count, pixel in rgb.getcolors(maxcolors=1 << 20) or ()
            if sum((a - b) ** 2 for a, b in zip(pixel, colour, strict=True)) <= within**2
        )


def test_memory_timeline_in_the_browser(cli, tmp_path: Path) -> None:
    # What a person looks at for "where in the step is the peak": the --plot page, drawn by a real browser. Its words
    # and numbers are text (selectable, searchable), as the JSON of the same run gives them; the bands are drawn.
    factory = tmp_path / "two.py"
    factory.write_text(STEP_FACTORY, encoding="utf-8")
    page = tmp_path / "step.html"
    args = ("estimate-memory", f"{factory}:two", "-d", "fp32", "--fit", "8KiB", "--reserve", "0", "--plot", str(page))
    result = cli(*args, "-f", "json", "-q")
    assert result.exit_code == 0, result.stderr
    (step,) = [s for s in result.json()["steps"] if s["mode"] == "training"]
    (fit,) = {e["fit"]["usable_bytes"] for e in result.json()["estimates"]}
    assert fit == 8192
    shot = tmp_path / "step.png"
    opened = _browser.open_page(page, screenshot=shot, width=1150, height=560)
    assert opened.requests == []
    texts = [t.clean_text() for t in parse(opened.dom).find_all("text")]
    assert f"peak {fmt_bytes(step['total'])}" in texts
    assert {"forward", "backward", "optim", "op of the traced step", "bytes alive (KiB)"} <= set(texts)
    assert f"8KiB usable {fmt_bytes(8192)}" in texts
    assert f"{factory}:two: float32 training (pure), estimated" in texts
    # The resident bytes (weights and AdamW's states) fill about half the axes up to the 8 KiB line, the gradients
    # a band above them in backward: both are on screen, not only their legend swatches (~200 pixels each).
    assert _pixels_near(shot, WEIGHTS_BLUE) > 20_000
    assert _pixels_near(shot, GRADIENTS_RED) > 1_000
