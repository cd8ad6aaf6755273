"""One JSON golden per command: the document a tiny real input gives, with versions and paths normalised.

``pytest --overwrite-golden`` rewrites them after an intended change; review the diff like any other output.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests._documents import normalise


@pytest.mark.parametrize("command", ["info", "info-list", "scan-model", "estimate-memory", "nan-trace"])
def test_json_document_golden(
    command: str,
    command_documents: dict[str, tuple[Path, dict[str, Any]]],
    golden: Callable[[str, str], None],
) -> None:
    folder, document = command_documents[command]
    text = json.dumps(normalise(document, folder), indent=2, ensure_ascii=False) + "\n"
    assert "<tmp>" in text or command.startswith("info")  # the inputs' paths were normalised, not left in
    golden(f"json_{command}.json", text)


def test_scan_golden_counts_agree_with_numpy(command_documents: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    # The golden's float16 verdicts, recomputed by numpy's own float32 -> float16 cast (one RNE rounding).
    import numpy as np
    import torch
    from safetensors.torch import load_file

    folder, document = command_documents["scan-model"]
    values = load_file(str(folder / "tiny.safetensors"))["layer.weight"].to(torch.float64).numpy().ravel()
    finite = values[np.isfinite(values)].astype(np.float32)
    with np.errstate(over="ignore"):  # 7e4 becomes inf: the overflow counted below
        half = finite.astype(np.float16)
    expected = {
        "overflow": int(np.count_nonzero(np.isinf(half))),
        "underflow": int(np.count_nonzero((half == 0) & (finite != 0))),
        "subnormal": int(np.count_nonzero((half != 0) & (np.abs(half) < np.finfo(np.float16).tiny))),
    }
    (tensor,) = [t for t in document["tensors"] if t["name"] == "layer.weight"]
    assert (
        {check: tensor["casts"]["float16"][check] for check in expected}
        == expected
        == {
            "overflow": 1,
            "underflow": 1,
            "subnormal": 1,
        }
    )
    assert (tensor["nan"], tensor["absmax"], tensor["level"]) == (1, 70000.0, "fail")
