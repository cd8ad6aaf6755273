"""The compiled ``--precision`` loops against the numpy functions they replace (``precision``, ``blockscale``).

Counts and the largest relative error must be equal; the float64 sums may differ only by their order of addition.
The data holds what each branch handles: zeros, NaN, +-inf, float32 subnormals, values a plain cast overflows,
values flushed to zero, whole rows and MX blocks of zeros, and rows whose length is not a multiple of 32.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.dtypes import lookup
from dtypecheck.scan.blockscale import compiled_mx_loss, compiled_per_channel_loss, mx_loss, per_channel_loss
from dtypecheck.scan.kernel import NUMBA
from dtypecheck.scan.precision import Loss, compiled_cast_loss, plain_or_tensor_scaled
from dtypecheck.scan.run import scan_checkpoint

pytestmark = pytest.mark.skipif(not NUMBA, reason="the compiled loops need numba")

TARGETS = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")
ROW = 70  # not a multiple of 32: every row ends with a 6-value MX block


def _values(dtype: type[np.floating]) -> np.ndarray:
    rng = np.random.default_rng(7)
    n = 300 * ROW
    x = rng.standard_normal(n) * np.exp2(rng.uniform(-150, 20, n))
    x[::97] = 0.0
    x[5], x[6], x[7] = np.nan, np.inf, -np.inf
    x[11], x[12] = 1e5, -7e4  # beyond float16's max
    x[ROW : 2 * ROW] = 0.0  # a whole row of zeros
    x[2 * ROW : 2 * ROW + 32] = 1e-42  # float32 subnormals filling one MX block
    return x.astype(dtype)


def _same(got: Loss, want: Loss) -> None:
    assert (got.underflow, got.overflow, got.max_rel) == (want.underflow, want.overflow, want.max_rel)
    assert got.signal == pytest.approx(want.signal, rel=1e-12, abs=0)
    assert got.noise == pytest.approx(want.noise, rel=1e-12, abs=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("target", TARGETS)
def test_compiled_losses_equal_numpys(dtype: type[np.floating], target: str) -> None:
    x = _values(dtype)
    spec = lookup(target)
    for absmax in (1e5, 3.0):  # the scaled targets' factor both ways (3.0: most values clip at the max)
        _same(compiled_cast_loss(x, spec, absmax), plain_or_tensor_scaled(x, spec, absmax))
    if spec.scaled:
        _same(compiled_per_channel_loss(x, ROW, spec), per_channel_loss(x, ROW, spec))
        _same(compiled_mx_loss(x, ROW, spec), mx_loss(x, ROW, spec))
        whole = x[: 64 * 300]  # a last dimension of whole MX blocks
        _same(compiled_mx_loss(whole, 64, spec), mx_loss(whole, 64, spec))


def test_the_loops_were_exercised_on_every_branch() -> None:
    """The data above really overflows, flushes and clips (else the equalities would prove little)."""
    x = _values(np.float32)
    plain = plain_or_tensor_scaled(x, lookup("float16"), 0.0)
    finite = x[np.isfinite(x)]
    with np.errstate(over="ignore"):
        half = finite.astype(np.float16)  # numpy's cast: one rounding from float32
    assert plain.overflow == np.count_nonzero(np.isinf(half)) > 2
    assert plain.underflow == np.count_nonzero((finite != 0) & (half == 0)) > 0
    clipped = plain_or_tensor_scaled(x, lookup("float8_e4m3fn"), 3.0)
    assert clipped.overflow > 100
    assert mx_loss(x, ROW, lookup("float8_e4m3fn")).underflow > 0


def _without_sqnr(value: object) -> tuple[object, list[float | None]]:
    """(the value with every SQNR set to None, the SQNRs taken out), for a CastCounts or a SchemeVerdict."""
    sqnrs: list[float | None] = []
    if value is None or not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value, sqnrs
    changes: dict[str, object] = {}
    for field in dataclasses.fields(value):
        inner = getattr(value, field.name)
        if field.name == "sqnr_db":
            sqnrs.append(inner)
            changes[field.name] = None
        elif dataclasses.is_dataclass(inner):
            changes[field.name], more = _without_sqnr(inner)
            sqnrs += more
    return dataclasses.replace(value, **changes), sqnrs


def test_a_whole_scan_with_either_kernel_gives_the_same_measures(tmp_path: Path) -> None:
    x = _values(np.float32).reshape(300, ROW)
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.from_numpy(x), "v": torch.from_numpy(x[:3].astype(np.float64))}, str(path))
    targets = [lookup(t) for t in ("float16", "bfloat16", "float8_e4m3fn")]
    fast, slow = (scan_checkpoint(str(path), targets, precision=True, workers=2, compiled=c) for c in (True, False))
    assert [t.name for t in fast.tensors] == ["v", "w"]
    for compiled, reference in zip(fast.tensors, slow.tensors, strict=True):
        assert compiled.level == reference.level
        for name, cast in compiled.casts.items():
            got, got_sqnrs = _without_sqnr(cast)
            want, want_sqnrs = _without_sqnr(reference.casts[name])
            assert got == want
            assert len(got_sqnrs) == (3 if name == "float8_e4m3fn" else 1)  # the cast, per channel, MX
            assert all(s is not None for s in got_sqnrs)
            assert got_sqnrs == pytest.approx(want_sqnrs, rel=1e-12)
