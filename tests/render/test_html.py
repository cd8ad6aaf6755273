"""``--format html``: each page states the facts of the JSON document of the same run, with the numbers derived
by hand from the tiny inputs (``tests/_documents.py``); every name from the input is escaped; nothing is fetched."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.render import OutputFormat, render
from dtypecheck.render.html.memory import memory_page
from dtypecheck.render.html.nantrace import nantrace_page
from dtypecheck.render.html.page import CSP, page
from tests._documents import NAN_SCRIPT
from tests.render._html_dom import external_references, parse, table_rows

HOSTILE = '</code><script>document.title="pwned"</script><img src=x onerror="alert(1)">" onmouseover="x'
"""A tensor name that would run script, load an image and add a handler if it reached the page unescaped."""


def test_scan_page_leads_with_each_targets_verdict(html_runs) -> None:
    run = html_runs["scan-model"]
    dom = parse(run.html)
    cards = {card.attrs["data-target"]: card for card in dom.find_all("div") if "data-target" in card.attrs}
    verdicts = {v["target"]: v for v in run.document["summary"]["verdicts"]}
    assert list(cards) == ["float16", "bfloat16", "float8_e4m3fn", "int8"] == list(verdicts)
    # layer.weight = [1, 1e-10, nan, 7e4, 0.5, -2, 1e-6, 3]: float16 overflows 7e4 (> 65520), flushes 1e-10
    # (< 2**-25) and keeps 1e-6 subnormal (2**-25 <= 1e-6 < 2**-14); bfloat16 holds them all; e4m3 overflows 7e4
    # (> 464) and flushes 1e-10 and 1e-6 (< 2**-10); int8 overflows 7e4. Every target fails on the NaN.
    expected = {"float16": (1, 1, 1), "bfloat16": (0, 0, 0), "float8_e4m3fn": (1, 2, 0), "int8": (1, 0, 0)}
    for target, (overflow, underflow, subnormal) in expected.items():
        verdict = verdicts[target]
        assert (verdict["overflow"], verdict["underflow"], verdict["subnormal"]) == (overflow, underflow, subnormal)
        text = cards[target].clean_text()
        assert f"{overflow} overflow · {underflow} underflow · {subnormal} subnormal" in text
        assert cards[target].find_all("span", data_level="fail")
        assert verdict["advice"] in text
    # the verdicts come before the tensor table
    assert run.html.index('id="verdicts"') < run.html.index('id="tensor-table"') < run.html.index('id="histograms"')


def test_scan_page_table_has_every_tensor_with_its_level(html_runs) -> None:
    run = html_runs["scan-model"]
    dom = parse(run.html)
    rows = dom.by_id("tensors").find_all("tr", data_level="fail") + dom.by_id("tensors").find_all("tr", data_level="ok")
    names = {row.attrs["data-name"]: row.attrs["data-level"] for row in rows}
    assert names == {t["name"]: t["level"] for t in run.document["tensors"]}
    assert names == {"layer.weight": "fail", "norm.weight": "ok", "position_ids": "ok"}
    (first,) = [row for row in table_rows(dom.by_id("tensors")) if row[1] == "layer.weight"]
    # absmax 7e4; min |x| > 0 is 1e-10; one NaN, no inf, no zero
    assert first[6:11] == ["7e+04", "1e-10", "1", "0", "0"]
    assert dom.by_id("tensor-count").clean_text() == "3"
    assert dom.by_id("level-counts").clean_text() == "2 ok · 0 warn · 1 fail"
    assert dom.by_id("tensors").attrs["class"] == "sortable"
    assert dom.find_all("div", data_filter_for="tensors")  # the filter, shown by the script


def test_scan_histogram_bars_and_bands_are_the_values_binades_and_each_targets_limits(html_runs) -> None:
    run = html_runs["scan-model"]
    dom = parse(run.html)
    histogram = dom.by_id("h0")  # layer.weight, the worst tensor, first
    assert "layer.weight" in histogram.find_all("summary")[0].clean_text()
    bars = {}
    for rect in histogram.find_all("rect"):
        match = re.fullmatch(r"2\^(-?\d+): (\d+) values", rect.clean_text())
        if match:
            bars[int(match.group(1))] = int(match.group(2))
    values = np.array([1.0, 1e-10, 0.5, -2.0, 1e-6, 3.0, 7e4])  # the finite ones
    binades, counts = np.unique(np.floor(np.log2(np.abs(values))).astype(int), return_counts=True)
    assert bars == dict(zip(binades.tolist(), counts.tolist(), strict=True))
    bands = {
        (r.attrs["data-target"], r.attrs["data-band"]): (float(r.attrs["data-from"]), float(r.attrs["data-to"]))
        for r in histogram.find_all("rect")
        if "data-band" in r.attrs
    }
    # float16: subnormals 2**-24.., flush below half of it (binade -25 and lower), normals from 2**-14, max 65504
    # in binade 15, so binade 16 overflows. e4m3fn: subnormals 2**-9, normals 2**-6, max 448 in binade 8.
    assert bands["float16", "subnormal"] == (-25.0, -14.0)
    assert bands["float16", "normal"] == (-14.0, 16.0)
    assert bands["float16", "overflow"][0] == 16
    assert bands["float8_e4m3fn", "subnormal"] == (-10.0, -6.0)
    assert bands["float8_e4m3fn", "normal"] == (-6.0, 9.0)
    assert ("int8", "normal") not in bands  # integer targets have no bands
    assert math.log2(torch.finfo(torch.float16).max) < 16  # the edge as torch knows it


def test_nantrace_page_shows_the_producer_its_line_the_chain_and_consequence(html_runs) -> None:
    run = html_runs["nan-trace"]
    dom = parse(run.html)
    first = run.document["first"]
    line = NAN_SCRIPT.splitlines().index("loss = torch.log(model(x) - 100).sum()  # the first NaN") + 1
    assert dom.by_id("status-value").clean_text() == run.document["status"] == "nonfinite"
    assert dom.by_id("first-op").clean_text() == first["op"] == "aten.log.default"
    script = Path(first["location"]["file"])
    assert dom.by_id("culprit-line").clean_text() == f"{script}:{line}"
    (marked,) = dom.by_id("source").find_all("span", class_="culprit")
    assert marked.attrs["data-line"] == str(line)
    assert marked.clean_text().endswith("loss = torch.log(model(x) - 100).sum() # the first NaN")
    assert len(dom.by_id("source").find_all("span")) == 7  # three lines either side (the file has 7 lines + 2)
    chain = table_rows(dom.by_id("chain").find_all("table")[0])
    assert [row[0] for row in chain] == [h["op"] for h in first["history"]] + [first["op"]]
    assert chain[-2][0] == "aten.sub.Tensor"  # model(x) - 100, the op that fed log its negative inputs
    assert first["consequence"] == "loss"
    assert "reached the loss" in dom.by_id("consequence").clean_text()
    assert "outside every module" in dom.by_id("modules").clean_text()
    assert "No op came close" in dom.by_id("came-close").clean_text()


def test_nantrace_module_tree_highlights_the_culprit_and_its_parents() -> None:
    location = {"file": "train.py", "line": 3, "function": "step", "code": "y = attn(x)"}
    event = {
        "kind": "inf", "phase": "forward", "op": "aten.exp.default", "grad_fn": None, "module": "blocks.1.attn",
        "dtype": "float16", "location": location, "counts": {"nan": 0, "posinf": 2, "neginf": 0, "zeros": 0,
        "subnormal": 0}, "absmax": "inf", "limit": 65504.0, "cause": "range_overflow", "step": 1, "op_index": 4,
        "level": "fail", "consequence": "loss",
        "history": [{"op": "aten.mm.default", "phase": "forward", "module": "blocks.0.mlp", "dtype": "float16",
                     "absmax": 100.0, "limit": 65504.0, "ratio": 0.0015, "location": location}],
    }  # fmt: skip
    warning = {**event, "kind": "near_overflow", "module": "blocks.1.norm", "history": [], "absmax": 6e4}
    document = {"status": "nonfinite", "first": event, "warnings": [warning], "events": [event], "ops": 9,
                "steps": 1, "source": "train.py"}  # fmt: skip
    dom = parse(page(*nantrace_page(document)))
    tree = dom.by_id("modules")
    marked = [e.clean_text() for e in tree.find_all("code", class_="culprit")]
    assert marked == ["blocks", "1", "attn"]
    assert dom.by_id("culprit-module").clean_text() == "attn"
    named = sorted(e.clean_text() for e in tree.find_all("code"))
    assert named == sorted(["(model)", "blocks", "0", "mlp", "1", "attn", "norm"])
    close = table_rows(dom.by_id("came-close").find_all("table")[0])
    assert [(row[0], row[3], row[5]) for row in close] == [("near_overflow", "blocks.1.norm", "60000")]


def test_memory_page_has_a_bar_and_a_row_per_estimate_with_its_peak(html_runs) -> None:
    run = html_runs["estimate-memory"]
    dom = parse(run.html)
    estimates = run.document["estimates"]
    rows = table_rows(dom.by_id("estimates"))
    assert len(rows) == len(estimates) == 9
    for row, estimate in zip(rows, estimates, strict=True):
        total = estimate["bytes"]["total"]
        assert row[-2] == f"{total / 1024:.2f} KiB" if total < 1024**2 else f"{total / 1024**2:.2f} MiB"
    assert rows[0][0] == "float32 inference pure, batch 1"
    # float32 inference: 26,784 parameters x 4 bytes = 107,136 B of weights
    assert estimates[0]["bytes"]["parameters"] == 26784 * 4
    assert rows[0][1] == f"{26784 * 4 / 1024:.2f} KiB"
    bars = dom.by_id("bars")
    peaks = [e.clean_text() for e in bars.find_all("line")]
    assert len(peaks) == len(estimates)
    segments = bars.find_all("rect")
    nonzero = sum(1 for e in estimates for k, v in e["bytes"].items() if k != "total" and isinstance(v, int) and v)
    assert len(segments) == nonzero


def test_memory_page_draws_a_timeline_where_the_report_has_one() -> None:
    estimate = {"dtype": "float32", "mode": "training", "optimizer": "adamw", "precision": "pure",
                "sharding": {"strategy": "none", "world_size": 1}, "batch_size": 2,
                "bytes": {"parameters": 4096, "gradients": 4096, "total": 12288},
                "timeline": [{"label": "forward", "total": 6144}, {"label": "backward", "total": 12288},
                             {"label": "step", "total": 8192}]}  # fmt: skip
    document = {"model": {"source": "m.json", "parameters": 1024, "trainable_parameters": 1024, "buffers": 0,
                          "buffer_bytes": 0}, "estimates": [estimate], "measured": None}  # fmt: skip
    dom = parse(page(*memory_page(document)))
    timeline = dom.by_id("timeline-0")
    points = [c.clean_text() for c in timeline.find_all("circle")]
    assert points == ["forward: 6.00 KiB", "backward: 12.00 KiB", "step: 8.00 KiB"]


def test_info_page_draws_each_float_dtypes_number_line(html_runs) -> None:
    run = html_runs["info"]
    dom = parse(run.html)
    float16 = dom.by_id("dtype-float16")
    marks = [t.clean_text() for t in float16.find_all("svg")[0].find_all("text") if not t.attrs.get("fill")]
    # float16: smallest subnormal 2**-24, smallest normal 2**-14, eps 2**-10, max 65504 = 2**16 - 2**5
    assert marks == ["sub 2^-24", "tiny 2^-14", "eps 2^-10", "1 2^0", f"max 2^{math.log2(65504):.4g}"]
    assert float16.find_all("span", class_="max")[0].clean_text() == "65504"
    assert run.document["dtypes"][0]["max"] == 65504.0
    int4 = dom.by_id("dtype-int4")
    assert "[-8, 7]" in int4.clean_text()  # 4-bit two's complement
    e8m0 = dom.by_id("dtype-float8_e8m0fnu")
    facts = {row.find_all("th")[0].clean_text(): row.find_all("td")[0].clean_text() for row in e8m0.find_all("tr")[:6]}
    assert facts["smallest subnormal"] == "none"  # e8m0 has no mantissa bits, so no subnormals
    assert facts["max"] == f"{2.0**127:.8g}"  # exponent 254 - 127, the all-ones exponent being NaN


def test_every_name_from_the_input_is_escaped(tmp_path: Path, cli) -> None:
    checkpoint = tmp_path / "m.safetensors"
    save_file({HOSTILE: torch.tensor([1.0, float("inf")]), "plain": torch.ones(2)}, str(checkpoint))
    result = cli("scan-model", str(checkpoint), "--format", "html", "-q")
    assert result.exit_code == 1, result.stderr
    dom = parse(result.stdout)
    assert len(dom.find_all("script")) == 1  # only the page's own
    assert dom.find_all("img") == []
    assert all("onerror" not in e.attrs and "onmouseover" not in e.attrs for e in dom.iter())
    (row,) = dom.by_id("tensors").find_all("tr", data_level="fail")
    assert row.attrs["data-name"] == HOSTILE
    assert HOSTILE in row.clean_text()
    assert parse(result.stdout).find_all("title")[0].clean_text() == "dtypecheck scan-model"


def test_a_source_line_from_the_traced_script_is_escaped(tmp_path: Path, cli) -> None:
    script = tmp_path / "step.py"
    script.write_text("import torch\nx = torch.zeros(2)\ny = torch.log(x - 1)  # </pre><script>alert(1)</script>\n")
    result = cli("nan-trace", str(script), "--format", "html", "-q")
    assert result.exit_code == 1, result.stderr
    dom = parse(result.stdout)
    assert len(dom.find_all("script")) == 1
    assert "# </pre><script>alert(1)</script>" in dom.by_id("source").clean_text()


def test_no_page_refers_to_anything_outside_itself(html_runs) -> None:
    for command, run in html_runs.items():
        assert external_references(run.html) == [], command
        assert f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' in run.html, command
    assert "default-src 'none'" in CSP
    assert external_references('<img src="https://example.com/a.png">') == ['src="https:']  # the check can fail


def test_reports_show_themselves_in_a_notebook_with_the_same_renderer(html_runs) -> None:
    for command, run in html_runs.items():
        cell = run.report._repr_html_()
        assert cell.startswith('<div class="dtypecheck-report">'), command
        assert "<!DOCTYPE" not in cell
        style = re.search(r"<style>(.*?)</style>", cell, re.DOTALL)
        assert style is not None
        selectors = [s.strip() for rule in re.findall(r"([^{}]+)\{", style.group(1)) for s in rule.split(",")]
        assert all(s.startswith(".dtypecheck-report") for s in selectors), command  # the notebook keeps its look
        page_main = parse(run.html).find_all("main")[0].clean_text()
        assert parse(cell).find_all("main")[0].clean_text() == page_main, command


def test_html_is_written_to_output_and_refuses_several_checkpoints(tmp_path: Path, cli, html_runs) -> None:
    folder = html_runs["scan-model"].folder
    report = tmp_path / "report.html"
    result = cli("scan-model", str(folder / "tiny.safetensors"), "-f", "html", "-o", str(report), "-q")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert report.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    both = cli("scan-model", str(folder / "tiny.safetensors"), str(folder / "tiny.safetensors"), "-f", "html", "-q")
    assert both.exit_code == 2
    assert "one checkpoint per HTML document" in both.stderr


@pytest.mark.parametrize(
    ("command", "formats"),
    [
        ("info", "<table|json|sarif|github|html>"),
        ("scan-model", "<table|json|sarif|github|html>"),
        ("nan-trace", "<table|json|sarif|github|html>"),
        ("estimate-memory", "<table|json|html>"),
    ],
)
def test_help_lists_only_the_formats_a_command_writes(cli, monkeypatch, command: str, formats: str) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    result = cli(command, "--help")
    assert result.exit_code == 0
    (line,) = [line for line in result.stdout.splitlines() if line.lstrip("│ ").startswith("--format")]
    assert formats in line
    if command == "estimate-memory":
        assert "sarif" not in line
        assert "github" not in line


def test_a_format_a_command_cannot_write_is_a_usage_error(cli, html_runs) -> None:
    config = html_runs["estimate-memory"].folder / "decoder"
    refused = cli("estimate-memory", str(config), "-f", "sarif", "-q")
    assert refused.exit_code == 2
    assert "'sarif' is not one of 'table', 'json', 'html'" in refused.stderr
    listed = cli("info", "--list", "-f", "github")
    assert (listed.exit_code, listed.stdout) == (2, "")
    assert "--list writes table, json or html, not github" in listed.stderr


def test_the_render_registry_and_the_page_agree(html_runs) -> None:
    for command, run in html_runs.items():
        assert render(run.report, OutputFormat.html) == run.html, command


def test_a_configured_format_it_cannot_write_says_where_it_came_from(cli, html_runs, tmp_path, monkeypatch) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.dtypecheck]\nformat = "github"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    refused = cli("estimate-memory", str(html_runs["estimate-memory"].folder / "decoder"), "-q")
    assert refused.exit_code == 2
    assert "'github' is not one of 'table', 'json', 'html'" in refused.stderr
    assert "[tool.dtypecheck.estimate-memory]" in refused.stderr
    written = cli("estimate-memory", str(html_runs["estimate-memory"].folder / "decoder"), "-q", "-f", "html")
    assert written.exit_code == 0  # the command line wins over the config
    assert written.stdout.startswith("<!DOCTYPE html>")
