"""``dtypecheck estimate-memory`` on bad input: one clear line on stderr and exit 2 or 3, nothing on stdout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.memory._fixtures import DECODER, write_factories


@pytest.fixture
def factories(tmp_path):
    return write_factories(tmp_path)


def test_measure_refuses_what_cannot_fit(cli, tmp_path):
    config = dict(DECODER, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64)
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    result = cli("estimate-memory", str(tmp_path), "-d", "fp32", "-m", "training", "--seq-len", "4", "--measure")
    assert result.exit_code == 2
    assert "--measure would need about" in result.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("{f}:missing",), 3, "defines no 'missing'"),
        (("{f}:not_callable",), 3, "is not callable"),
        (("{f}:wrong",), 3, "must return an nn.Module"),
        (("{f}:raises",), 3, "raised ValueError: boom in user code"),
        (("{f}",), 2, "name the factory that builds the model"),
        (("{d}/nothing.py:f",), 3, "no such file"),
        (("{f}:mlp", "-d", "int4", "-m", "training"), 2, "cannot estimate training in int4"),
        (("{f}:mlp", "-d", "int8", "-m", "training"), 2, "cannot estimate training in int8"),
        (("{f}:mlp", "--world-size", "4"), 2, "--world-size needs a --strategy"),
        (("{f}:mlp", "--context", "10"), 2, "--context needs a decoder model"),
        (("{f}:mlp", "--seq-len", "10"), 2, "--seq-len applies to a config"),
        (("{f}:mlp", "-d", "fp17"), 2, "unknown dtype 'fp17'"),
        (("{f}:mlp", "--optimizer", "lion", "-m", "training", "--measure"), 2, "--measure runs torch's own optimizers"),
        (("{f}:no_inputs", "--measure"), 2, "--measure needs a model to run"),
        (("{f}:mlp", "--group-size", "0"), 2, "--group-size must be at least 1"),
        (("{d}/missing_dir",), 3, "no such file or directory"),
        (("{f}:mlp", "-f", "sarif"), 2, "'sarif' is not one of 'table', 'json', 'html'"),
    ],
)
def test_bad_input_is_one_line(cli, factories, tmp_path, args, code, message):
    formatted = [a.format(f=factories, d=tmp_path) for a in args]
    result = cli("estimate-memory", *formatted)
    assert result.exit_code == code, result.stderr
    assert result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ")
    assert message in last


def test_user_traceback_shows_only_user_frames(cli, factories):
    result = cli("estimate-memory", f"{factories}:raises")
    assert result.exit_code == 3
    text = Path(factories).read_text(encoding="utf-8")
    line = next(n for n, row in enumerate(text.splitlines(), 1) if 'raise ValueError("boom in user code")' in row)
    assert result.stderr.count("\n") == 1
    assert result.stderr.endswith(
        f"raised ValueError: boom in user code (at line {line} in helper; --traceback shows the traceback)\n"
    )
    result = cli("estimate-memory", f"{factories}:raises", "--traceback")
    assert result.exit_code == 3
    assert "in helper" in result.stderr
    assert 'raise ValueError("boom in user code")' in result.stderr
    assert "dtypecheck/memory" not in result.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"model_type": "dtypecheck-decoder", "hidden_size": 8}', "config lacks integer vocab_size"),
    ],
)
def test_unreadable_config(cli, tmp_path, content, message):
    (tmp_path / "config.json").write_text(content, encoding="utf-8")
    result = cli("estimate-memory", str(tmp_path))
    assert result.exit_code == 3
    assert result.stderr.strip().startswith("error: ")
    assert message in result.stderr


def test_unknown_config_without_transformers(cli, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)
    (tmp_path / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    result = cli("estimate-memory", str(tmp_path))
    assert result.exit_code == 3
    assert "needs transformers" in result.stderr


def test_checkpoint_rejects_batch_options(cli, tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(4, 4)}, str(path))
    result = cli("estimate-memory", str(path), "--batch-size", "8")
    assert result.exit_code == 2
    result = cli("estimate-memory", str(path), "--measure")
    assert result.exit_code == 2
    assert "--measure needs a model to run" in result.stderr
