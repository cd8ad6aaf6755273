"""``--by-module`` and ``--plot``: a row by module, and the step drawn."""

from __future__ import annotations

import pytest

TWO_LAYERS = """
import torch
from torch import nn


def two():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 4, bias=False))
    return model, torch.randn(2, 8)
"""


@pytest.fixture
def two(tmp_path):
    path = tmp_path / "two.py"
    path.write_text(TWO_LAYERS, encoding="utf-8")
    return f"{path}:two"


def test_inference_by_module_by_hand(cli, two):
    doc = cli("estimate-memory", two, "-d", "fp32", "-m", "inference", "--by-module", "-f", "json").json()
    (breakdown,) = doc["modules"]
    rows = {m["module"]: m for m in breakdown["modules"]}
    # Weights: 8x16 and 16x4 float32 matrices; the ReLU holds none.
    assert [(m["module"], m["parameters"], m["weight_bytes"]) for m in breakdown["modules"]] == [
        ("0", 128, 512),
        ("2", 64, 256),
        ("1", 0, 0),
        ("(outside modules)", 0, 0),
    ]
    # The peak is the ReLU: the batch (2x8 floats, 64 B), the first Linear's output and the ReLU's own (2x16
    # floats, 128 B each) alive at once, before the first Linear's output is dropped.
    assert breakdown["peak"] == {
        "op": "aten.relu.default",
        "module": "1",
        "phase": "forward",
        "index": breakdown["peak"]["index"],
        "ops": breakdown["peak"]["ops"],
        "activation_bytes": 320,
        "gradient_bytes": 0,
    }
    assert (rows["(outside modules)"]["activation_bytes"], rows["0"]["activation_bytes"]) == (64, 128)
    assert (rows["1"]["activation_bytes"], rows["2"]["activation_bytes"]) == (128, 0)
    assert doc["estimates"][0]["bytes"]["activations"] == 320


def test_training_by_module_sums_equal_the_totals(cli, two):
    args = ("estimate-memory", two, "-d", "bf16", "-m", "training", "--by-module", "--depth", "1", "-f", "json")
    for extra in ((), ("--strategy", "zero3", "--world-size", "3")):
        doc = cli(*args, *extra).json()
        (breakdown,) = doc["modules"]
        totals = doc["estimates"][0]["bytes"]
        modules = breakdown["modules"]
        assert sum(m["weight_bytes"] for m in modules) == totals["parameters"]
        assert sum(m["gradient_bytes"] for m in modules) == totals["gradients"]
        assert sum(m["optimizer_bytes"] for m in modules) == totals["optimizer_states"] + totals["master_weights"]
        assert sum(m["activation_bytes"] for m in modules) == breakdown["peak"]["activation_bytes"]
        assert breakdown["peak"]["phase"] in ("forward", "backward")
    # Unsharded amp: float32 weights and gradients, AdamW's two float32 states per weight and a float32 step each.
    doc = cli(*args).json()
    rows = {m["module"]: m for m in doc["modules"][0]["modules"]}
    assert (rows["0"]["weight_bytes"], rows["0"]["gradient_bytes"], rows["0"]["optimizer_bytes"]) == (512, 512, 1028)
    table = cli("estimate-memory", two, "-d", "fp32", "--by-module").stdout
    assert "by module (depth 2): float32 train pure" in table
    assert "peak: op " in table


def test_plot_png_and_self_contained_html(cli, two, tmp_path):
    png, page = tmp_path / "step.png", tmp_path / "step.html"
    assert (
        cli("estimate-memory", two, "-d", "fp32", "--plot", str(png), "--fit", "1MiB", "--reserve", "0").exit_code == 0
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = cli("estimate-memory", two, "-d", "fp32", "--plot", str(page), "-f", "json")
    assert result.exit_code == 0, result.stderr
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert "<svg" in text
    assert "<script" not in text
    assert "src=" not in text
    # As the --format html pages: a policy that lets the page load nothing; and no timestamp, so the same step
    # draws the same file.
    assert '<meta http-equiv="Content-Security-Policy" content="default-src \'none\';' in text
    assert "<dc:date>" not in text
    (step,) = [s for s in result.json()["steps"] if s["mode"] == "training"]
    assert step["total"] == result.json()["estimates"][1]["bytes"]["total"]
    bad = cli("estimate-memory", two, "--plot", str(tmp_path / "step.pdf"))
    assert bad.exit_code == 2
    assert "--plot" in bad.stderr
