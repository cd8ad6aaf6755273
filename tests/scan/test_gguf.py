"""GGUF tensors shown as stored (issue 21.6): the quantization type and the bytes the file holds, in the census and
the rows, beside the statistics of the dequantized values."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest


@pytest.fixture
def gguf_file(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    raw = np.linspace(-1, 1, 256, dtype=np.float32).reshape(8, 32)
    q8 = gguf.quants.quantize(raw, gguf.GGMLQuantizationType.Q8_0)
    tensors = {"f32": np.arange(12, dtype=np.float32).reshape(3, 4), "f16": np.ones((2, 2), np.float16)}
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    writer.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, {**tensors, "q8": q8, "dequantized": gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)}


def test_stored_type_and_bytes_in_rows_and_census(
    cli: Callable[..., Any], gguf_file: tuple[Path, dict[str, Any]]
) -> None:
    import gguf

    path, data = gguf_file
    doc = cli("scan-model", str(path), "--format", "json").json()
    rows = {t["name"]: t for t in doc["tensors"]}
    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0]
    stored_bytes = 256 // block * type_size
    assert stored_bytes == data["q8"].nbytes == 272
    assert (rows["q8"]["stored"], rows["q8"]["stored_bytes"]) == ("Q8_0", stored_bytes)
    assert (rows["q8"]["dtype"], rows["q8"]["bytes"], rows["q8"]["numel"]) == ("float32", 1024, 256)
    assert rows["q8"]["absmax"] == float(np.abs(data["dequantized"]).max())  # statistics of the dequantized values
    assert (rows["f32"]["stored"], rows["f32"]["stored_bytes"]) == (None, None)
    assert doc["summary"]["census"] == {
        "Q8_0": {"tensors": 1, "numel": 256, "bytes": 272},
        "float32": {"tensors": 1, "numel": 12, "bytes": 48},
        "float16": {"tensors": 1, "numel": 4, "bytes": 8},
    }
    table = cli("scan-model", str(path)).stdout
    assert "Q8_0→fp32 8x32" in table
    assert "dtypes: Q8_0 1 (272 B, 83%), float32 1 (48 B, 15%), float16 1 (8 B, 2%)" in table
