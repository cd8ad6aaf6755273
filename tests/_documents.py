"""One tiny real input per command, run through the CLI's JSON output, with volatile fields normalised.

The JSON goldens (``tests/render/test_json_golden.py``) and the check of ``docs/json.md`` against what the
renderer really writes (``tests/test_docs.py``) read the same documents.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from dtypecheck.cli import main
from tests.memory._fixtures import write_decoder_config

# A Linear whose outputs lie below 100: log(y - 100) is NaN from finite inputs, in forward, at the marked line.
NAN_SCRIPT = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
x = torch.ones(3, 4)
loss = torch.log(model(x) - 100).sum()  # the first NaN
loss.backward()
"""


def write_checkpoint(folder: Path) -> Path:
    """A float32 matrix with a NaN, an fp16 overflow (7e4) and values fp16 flushes or keeps subnormal, a bfloat16
    vector and an int64 vector: every scan verdict in a few values."""
    path = folder / "tiny.safetensors"
    tensors = {
        "layer.weight": torch.tensor([[1.0, 1e-10, float("nan"), 7e4], [0.5, -2.0, 1e-6, 3.0]]),
        "norm.weight": torch.ones(4, dtype=torch.bfloat16),
        "position_ids": torch.arange(4),
    }
    save_file(tensors, str(path))
    return path


def command_args(folder: Path) -> dict[str, list[str]]:
    """The argument lists of one run per command (and ``info --list``), on inputs written into ``folder``."""
    script = folder / "nan_step.py"
    script.write_text(NAN_SCRIPT, encoding="utf-8")
    return {
        "info": ["info", "fp16", "e8m0", "int4"],
        "info-list": ["info", "--list"],
        "scan-model": ["scan-model", str(write_checkpoint(folder)), "--target", "fp16,bf16,e4m3,int8", "--quiet"],
        "estimate-memory": ["estimate-memory", str(write_decoder_config(folder)), "--quiet"],
        "nan-trace": ["nan-trace", str(script), "--quiet"],
    }


EXIT_CODES = {"info": 0, "info-list": 0, "scan-model": 1, "estimate-memory": 0, "nan-trace": 1}
"""What each run of ``command_args`` exits with: the scan and the trace find something."""


def run_json(args: list[str]) -> tuple[int, dict[str, Any]]:
    """``dtypecheck ARGS --format json`` through the real error boundary; (exit code, document)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*args, "--format", "json"])
    document = json.loads(out.getvalue())
    assert isinstance(document, dict)
    return code, document


def normalise(value: Any, folder: Path) -> Any:
    """The document with what differs between machines and runs replaced: versions, the temporary folder, and
    devices other than the CPU (a machine with a GPU measures it too)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in ("dtypecheck_version", "torch_version"):
                out[key] = f"<{key}>"
            elif key == "devices" and isinstance(item, dict):
                out[key] = {"cpu": normalise(item["cpu"], folder)}
            elif key == "measured_devices":
                out[key] = ["cpu"]
            else:
                out[key] = normalise(item, folder)
        return out
    if isinstance(value, list):
        return [normalise(item, folder) for item in value]
    if isinstance(value, str):
        return value.replace(str(folder.resolve()), "<tmp>").replace(str(folder), "<tmp>")
    return value
