"""Chunks of dtypes numpy reads come as numpy arrays, so a scan of such a safetensors file never imports torch.

The reports must be those of the torch chunks (the path every other test also checks against references), and
the layout the loader reads (bytes per element) must be torch's for every dtype torch has.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.dtypes import lookup
from dtypecheck.loaders._io import mapped
from dtypecheck.scan.run import scan_checkpoint
from tests.security.harness import run_python


def _mixed(path: Path) -> Path:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((96, 70)) * np.exp2(rng.uniform(-30, 18, (96, 70)))
    x[0, :5] = [0.0, -0.0, np.nan, np.inf, -np.inf]
    tensors = {
        "f32": torch.from_numpy(x.astype(np.float32)),
        "f16": torch.from_numpy(np.where(np.isinf(x), x, np.clip(x, -6e4, 6e4)).astype(np.float16)),
        "f64": torch.from_numpy(x),
        "bf16": torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16),  # (numpy: bit patterns, widened)
        "e4m3": torch.from_numpy(np.clip(x, -400, 400).astype(np.float32)).to(torch.float8_e4m3fn),  # (torch)
        "i8": torch.from_numpy(rng.integers(-128, 128, 300, dtype=np.int8)),
        "u16": torch.from_numpy(rng.integers(0, 2**16, 300, dtype=np.uint16)),
        "i64": torch.from_numpy(rng.integers(-(2**40), 2**40, 300, dtype=np.int64)),
        "mask": torch.from_numpy(rng.integers(0, 2, 300).astype(bool)),
    }
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("precision", [False, True])
def test_numpy_chunks_give_the_reports_of_torch_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: bool
) -> None:
    path = _mixed(tmp_path / "mixed.safetensors")
    targets = [lookup(t) for t in ("float16", "bfloat16", "float8_e4m3fn", "int8")]
    arrays = scan_checkpoint(str(path), targets, precision=precision, workers=2)
    monkeypatch.setattr(mapped, "NUMPY_DTYPES", frozenset())  # every chunk a torch tensor, as before
    tensors = scan_checkpoint(str(path), targets, precision=precision, workers=2)
    assert arrays == tensors
    assert {t.name for t in arrays.tensors} == {"f32", "f16", "f64", "bf16", "e4m3", "i8", "u16", "i64", "mask"}
    f16 = next(t for t in arrays.tensors if t.name == "f16")
    assert f16.nan == 1
    assert f16.posinf == 1


SCAN_WITHOUT_TORCH = textwrap.dedent(
    """
    import sys
    sys.modules["torch"] = None  # an import of torch now raises ImportError
    from dtypecheck.cli import main
    sys.argv = ["dtypecheck", "scan-model", sys.argv[1], "--format", "json", "--precision", "--traceback"]
    main()
    """
)


def test_a_scan_of_numpy_dtypes_never_imports_torch(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    x = np.random.default_rng(2).standard_normal((64, 48)).astype(np.float32) * np.float32(1e3)
    w, h, b = torch.from_numpy(x), torch.from_numpy(x.astype(np.float16)), torch.from_numpy(x).to(torch.bfloat16)
    save_file({"w": w, "h": h, "b": b, "n": torch.arange(7)}, str(path))
    done = run_python(SCAN_WITHOUT_TORCH, str(path))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    w = next(t for t in report["tensors"] if t["name"] == "w")
    assert w["absmax"] == float(np.abs(x).max())
    assert w["casts"]["float16"]["sqnr_db"] is not None
    b_values = b.float().numpy()
    (b_report,) = [t for t in report["tensors"] if t["name"] == "b"]
    assert (b_report["min"], b_report["max"]) == (float(b_values.min()), float(b_values.max()))
    assert b_report["casts"]["bfloat16"]["sqnr_db"] == "inf"  # bfloat16 to bfloat16: exact


def test_bytes_per_element_are_torchs() -> None:
    dtypes = [getattr(torch, name) for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype)]
    assert len(dtypes) > 20
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        assert mapped.itemsize_of(name) == dtype.itemsize, name
