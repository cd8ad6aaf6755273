"""Class "tracebacks": hostile sizes, names and types end in one error line (or a report), never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.conftest import CliResult
from tests.security import corpus
from tests.security.harness import handled


def test_every_input_is_handled_per_contract(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    inputs = corpus.build(tmp_path, ("tracebacks",))
    assert len(inputs) == 15
    outcomes = {}
    for hostile in inputs:
        result = cli(*hostile.args)
        assert handled(result.exit_code, result.stderr, hostile.expect), (hostile.name, result.stderr)
        outcomes[hostile.name] = result.exit_code
    # sizes and offsets beyond int64 are refused; empty views of any size read nothing
    assert outcomes["shape-4300-digits"] == outcomes["offset-4300-digits"] == 3
    assert outcomes["huge-shape-empty"] == 0
    # more dimensions than torch's kernels are built for (64) is refused, empty or not
    assert outcomes["dims-1500"] == outcomes["dims-1500-empty"] == 3
    assert outcomes["deep-pyproject-toml"] == 2


def test_lone_surrogate_names_are_escaped_in_every_output(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    inputs = {h.name: h for h in corpus.build(tmp_path, ("tracebacks",))}
    cli(*inputs["surrogate-name-output"].args)
    document = json.loads((tmp_path / "tracebacks" / "surrogate.json").read_text(encoding="utf-8"))
    assert [t["name"] for t in document["tensors"]] == ["bad\udc80name"]  # JSON's own \udc80 escape
    cli(*inputs["surrogate-key-table"].args)
    assert "bad\\udc80name" in (tmp_path / "tracebacks" / "surrogate.txt").read_text(encoding="utf-8")


def test_unsupported_gguf_quantization_is_a_finding(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    inputs = {h.name: h for h in corpus.build(tmp_path, ("tracebacks",))}
    result = cli(*inputs["gguf-unsupported-quant"].args, "-f", "json")
    assert result.exit_code == 0
    (finding,) = result.json()["findings"]
    assert finding["kind"] == "gguf-quantized"
    assert finding["level"] == "warn"
    assert "cannot be dequantized" in finding["detail"]
