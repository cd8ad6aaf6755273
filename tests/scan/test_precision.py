"""``--precision``: SQNR, max relative error, per-channel and MX verdicts against plain numpy/ml_dtypes references.

The references round with numpy's float16 cast and ml_dtypes (from float32 inputs, where their casts are a single
rounding), compute MX scales with ``floor(log2(...))`` and the OCP spec's emax per element format, and sum in
float64 with numpy: nothing of ``dtypecheck.scan.quantize`` is used.
"""

from __future__ import annotations

import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.dtypes import lookup
from dtypecheck.scan import tensor as scan_tensor
from dtypecheck.scan.report import CastCounts, Float8CastCounts, SchemeVerdict, TensorScan
from dtypecheck.scan.run import scan_checkpoint
from tests._references import ML_DTYPES_SCALAR

SCALED = {
    # name: (ml_dtypes type, max, OCP MX emax of the element format, overflow tie, whether the tie overflows)
    # e4m3: 448 = 1.75 * 2**8, next grid value 480, tie 464 stays 448 (1.75 = 7/4: 7 odd? no: 448 = 14 * 32, even)
    "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0, 8, 464.0, False),
    # e5m2: 57344 = 7 * 2**13 (odd), next 65536, tie 61440 overflows
    "float8_e5m2": (ml_dtypes.float8_e5m2, 57344.0, 15, 61440.0, True),
    # e2m1: 6 = 3 * 2 (odd), next 8, tie 7 overflows
    "float4_e2m1fn_x2": (ml_dtypes.float4_e2m1fn, 6.0, 2, 7.0, True),
}


def _weights(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """float32 values like a weight matrix, with rows of very different scales and a few exact zeros."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-12, 4, (shape[0],) + (1,) * (len(shape) - 1)))
    x = x.astype(np.float32)
    x.reshape(-1)[::97] = 0.0
    return x


def _scan(tmp_path: Path, x: np.ndarray, targets: list[str]) -> TensorScan:
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.from_numpy(x)}, str(path))
    report = scan_checkpoint(str(path), [lookup(t) for t in targets], workers=2, precision=True)
    return report.tensors[0]


def _loss(x: np.ndarray, cast: np.ndarray, unit: np.ndarray | float = 1.0) -> tuple[float, float]:
    """(SQNR dB, max relative error) of ``cast`` against ``x`` (both in the scaled unit; ``unit`` undoes it)."""
    x64, c64 = x.astype(np.float64), cast.astype(np.float64)
    error = (x64 - c64) / unit
    signal = x64 / unit
    nonzero = x64 != 0
    sqnr = 10 * math.log10(float(np.sum(signal * signal)) / float(np.sum(error * error)))
    return sqnr, float(np.max(np.abs(x64 - c64)[nonzero] / np.abs(x64[nonzero])))


def _close(got: float | None, want: float) -> None:
    assert got is not None
    assert got == pytest.approx(want, rel=1e-9, abs=0)


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_plain_cast_precision_against_numpy(tmp_path: Path, target: str) -> None:
    x = _weights((48, 80), seed=1)
    x[0, :3] = [1e-9, 3e-8, -2e-10]  # flushed by float16 (relative error 1) but not by bfloat16
    cast = _scan(tmp_path, x, [target]).casts[target]
    sqnr, max_rel = _loss(x, x.astype(ML_DTYPES_SCALAR[target]))
    _close(cast.sqnr_db, sqnr)
    _close(cast.max_rel_error, max_rel)
    assert (cast.max_rel_error == 1.0) == (target == "float16")


def test_plain_cast_leaves_out_overflows_and_nonfinite(tmp_path: Path) -> None:
    x = _weights((16, 64), seed=2)
    kept = x.copy()
    x[3, 5], x[4, 6], x[5, 7] = 1e6, np.nan, -np.inf  # overflow (fails the tensor), non-finite: not in the measures
    kept[3, 5] = kept[4, 6] = kept[5, 7] = 0.0
    cast = _scan(tmp_path, x, ["float16"]).casts["float16"]
    sqnr, max_rel = _loss(kept, kept.astype(np.float16))
    _close(cast.sqnr_db, sqnr)
    _close(cast.max_rel_error, max_rel)


def _per_tensor(x: np.ndarray, target: str) -> tuple[float, float]:
    kind, top = SCALED[target][0], SCALED[target][1]
    scale = top / float(np.max(np.abs(x)))
    y = x.astype(np.float64) * scale
    # ml_dtypes rounds float64 through float32: the same grid point except where float32 lands on a tie (the
    # values here are not near one); the error is still taken against the float64 value.
    return _loss(y, y.astype(np.float32).astype(kind))


def _per_channel(x: np.ndarray, target: str) -> SchemeVerdict:
    kind, top = SCALED[target][0], SCALED[target][1]
    rows = x.reshape(x.shape[0], -1).astype(np.float64)
    rowmax = np.max(np.abs(rows), axis=1, keepdims=True)
    scale = np.where(rowmax > 0, top / rowmax, 1.0)
    y = rows * scale
    cast = y.astype(np.float32).astype(kind).astype(np.float64)
    sqnr, max_rel = _loss(y, cast, scale)
    underflow = int(np.count_nonzero((rows != 0) & (cast == 0)))
    return SchemeVerdict(underflow, 0, sqnr, max_rel)


def _mx(x: np.ndarray, target: str) -> SchemeVerdict:
    kind, top, emax, tie, tie_overflows = SCALED[target]
    rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
    pad = -rows.shape[1] % 32
    blocks = np.pad(rows, ((0, 0), (0, pad))).reshape(-1, 32)
    amax = np.max(np.abs(blocks), axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        exponent = np.where(amax > 0, np.floor(np.log2(amax)) - emax, 0.0)
    scale = 2.0 ** np.clip(exponent, -127, 127)
    v = blocks / scale  # exact: a power of two
    overflow = np.abs(v) >= tie if tie_overflows else np.abs(v) > tie
    cast = np.clip(v, -top, top).astype(np.float32).astype(kind).astype(np.float64)
    sqnr, max_rel = _loss(v, cast, 1 / scale)
    underflow = int(np.count_nonzero((blocks != 0) & (cast == 0)))
    return SchemeVerdict(underflow, int(np.count_nonzero(overflow)), sqnr, max_rel)


def _check(got: SchemeVerdict | None, want: SchemeVerdict) -> None:
    assert got is not None
    assert (got.underflow, got.overflow) == (want.underflow, want.overflow)
    assert want.sqnr_db is not None
    assert want.max_rel_error is not None
    _close(got.sqnr_db, want.sqnr_db)
    _close(got.max_rel_error, want.max_rel_error)


@pytest.mark.parametrize("target", list(SCALED))
@pytest.mark.parametrize("shape", [(24, 96), (8, 3, 40)], ids=["blocks-fit", "ragged-last-dim"])
@pytest.mark.parametrize("chunk_bytes", [None, 1000], ids=["one-chunk", "rows-cut-across-chunks"])
def test_scaled_schemes_against_numpy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, shape: tuple[int, ...], chunk_bytes: int | None
) -> None:
    if chunk_bytes is not None:  # 250 values a chunk: rows of 96 or 120 values straddle chunks and are regrouped
        monkeypatch.setattr(scan_tensor, "KERNEL_CHUNK_BYTES", chunk_bytes)
    x = _weights(shape, seed=3)
    x.reshape(-1)[5] = 300.0 * SCALED[target][1]  # one outlier: per-tensor scaling flushes the small rows
    cast = _scan(tmp_path, x, [target]).casts[target]
    assert isinstance(cast, Float8CastCounts)
    sqnr, max_rel = _per_tensor(x, target)
    _close(cast.sqnr_db, sqnr)
    _close(cast.max_rel_error, max_rel)
    _check(cast.per_channel, _per_channel(x, target))
    _check(cast.mx, _mx(x, target))
    assert cast.mx is not None
    assert cast.mx.overflow > 0  # blocks whose max lands above the element's max after a power-of-two scale


def test_per_channel_is_for_matrices_and_mx_for_any_last_dimension(tmp_path: Path) -> None:
    x = _weights((100,), seed=4)
    cast = _scan(tmp_path, x, ["e4m3"]).casts["float8_e4m3fn"]
    assert isinstance(cast, Float8CastCounts)
    assert cast.per_channel is None
    _check(cast.mx, _mx(x.reshape(1, -1), "float8_e4m3fn"))


def test_exact_and_all_zero_tensors(tmp_path: Path) -> None:
    exact = np.array([[1.0, -0.5, 2.0, 0.0]] * 2, dtype=np.float32)  # every value on every grid
    cast = _scan(tmp_path, exact, ["fp16", "e4m3"]).casts
    assert (cast["float16"].sqnr_db, cast["float16"].max_rel_error) == (math.inf, 0.0)
    zeros = _scan(tmp_path, np.zeros((2, 32), dtype=np.float32), ["fp16", "e4m3"]).casts
    assert (zeros["float16"].sqnr_db, zeros["float16"].max_rel_error) == (None, None)
    e4m3 = zeros["float8_e4m3fn"]
    assert isinstance(e4m3, Float8CastCounts)
    assert e4m3.mx == SchemeVerdict(0, 0, None, None)


def test_without_the_flag_nothing_is_measured(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.from_numpy(_weights((4, 32), seed=5))}, str(path))
    cast = scan_checkpoint(str(path), [lookup("e4m3")]).tensors[0].casts["float8_e4m3fn"]
    assert isinstance(cast, Float8CastCounts)
    assert (cast.sqnr_db, cast.max_rel_error, cast.per_channel, cast.mx) == (None, None, None, None)
    assert isinstance(cast, CastCounts)
