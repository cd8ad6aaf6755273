"""Class "robustness": configs, baselines, names and shapes that once ended in dtypecheck's own tracebacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult
from tests.security import corpus
from tests.security.harness import handled, run_hostile


def test_every_input_is_handled_per_contract(
    tmp_path: Path, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = corpus.build(tmp_path, ("robustness",))
    assert len(inputs) == 15
    here = Path.cwd()
    for hostile in inputs:
        monkeypatch.chdir(hostile.cwd or here)
        result = cli(*hostile.args)
        assert handled(result.exit_code, result.stderr, hostile.expect), (hostile.name, result.stderr)
        if result.exit_code in (2, 3):  # the error names the file it is about
            assert str(tmp_path) in result.stderr, (hostile.name, result.stderr)


def test_config_errors_say_what_is_wrong(
    tmp_path: Path, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = {h.name: h for h in corpus.build(tmp_path, ("robustness",))}
    expected = {
        "config-huge-integer": "not valid TOML (Exceeds the limit (4300 digits) for integer string conversion",
        "config-invalid-utf8-found": "pyproject.toml: not valid TOML (not UTF-8: invalid start byte at byte 20)",
        "config-fifo": "config-fifo.toml: a FIFO, not a regular file: refused before reading",
        "dims-65": "a tensor of 65 dimensions, over the 64 limit",
        "safetensors-dims-65": "tensor 'x' has 65 dimensions, over the 64 limit",
    }
    here = Path.cwd()
    for name, message in expected.items():
        monkeypatch.chdir(inputs[name].cwd or here)
        assert message in cli(*inputs[name].args).stderr, name


def test_lone_surrogates_are_escaped_in_every_format(tmp_path: Path) -> None:
    """In a fresh process, whose stdout really encodes (the SARIF fingerprint once raised UnicodeEncodeError)."""
    for hostile in corpus.build(tmp_path, ("robustness",)):
        if not hostile.name.startswith("surrogate-name-"):
            continue
        output = tmp_path / f"{hostile.name}.out"
        done = run_hostile(
            corpus.Hostile(hostile.name, hostile.klass, (*hostile.args, "-o", str(output)), hostile.expect), 120
        )
        assert done[0] == 1, (hostile.name, done[1])
        text = output.read_text(encoding="utf-8")
        assert "bad\\udc80name" in text, hostile.name
        if hostile.name.endswith(("json", "sarif")):
            json.loads(text)
