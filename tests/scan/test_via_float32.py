"""float64 sources: torch's ``.to()`` reaches 16- and 8-bit floats through float32, and the scan reports that.

Expected values are derived by hand (comments) or with ``fractions`` (an independent single-rounding reference),
and every one is checked against the installed torch's own cast.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.dtypes import FloatFormat, lookup
from dtypecheck.scan.quantize import round_magnitudes
from dtypecheck.scan.report import TensorScan
from dtypecheck.scan.run import scan_checkpoint

NARROW = ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"]


def _rne(value: Fraction, fmt: FloatFormat) -> Fraction:
    """Single round-to-nearest-even with an unbounded exponent, by exact rationals (CONTRACT's rule)."""
    magnitude = abs(value)
    if magnitude == 0:
        return Fraction(0)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    ulp = Fraction(2) ** (max(exponent, fmt.emin) - fmt.mantissa_bits)
    steps = magnitude / ulp
    whole = steps.numerator // steps.denominator
    rest = steps - whole
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2 == 1):
        whole += 1
    return whole * ulp * (1 if value > 0 else -1)


def _near_ties(fmt: FloatFormat, count: int, seed: int) -> np.ndarray:
    """float64 values within a few float64 ulps (and 2**-40 relative) of ``fmt``'s rounding ties."""
    rng = np.random.default_rng(seed)
    top = fmt.emax + 1
    values = []
    for _ in range(count):
        exponent = int(rng.integers(fmt.emin - fmt.mantissa_bits - 1, top))
        spacing = 2.0 ** (max(exponent, fmt.emin) - fmt.mantissa_bits)
        tie = (math.floor(2.0**exponent / spacing) + int(rng.integers(0, 1 << fmt.mantissa_bits)) + 0.5) * spacing
        for nudge in (-1, 1):
            values += [float(np.nextafter(tie, nudge * math.inf)), tie * (1 + nudge * 2.0**-40), tie]
    return np.array(values + [-v for v in values])


def _scan(tmp_path: Path, x: torch.Tensor, targets: list[str], compiled: bool = True) -> TensorScan:
    path = tmp_path / "t.safetensors"
    save_file({"x": x}, str(path))
    report = scan_checkpoint(str(path), [lookup(t) for t in targets], workers=2, compiled=compiled)
    return report.tensors[0]


@pytest.mark.parametrize("target", NARROW)
def test_torch_casts_float64_through_float32(target: str) -> None:
    """The premise, on this torch: ``x.to(T) == x.to(float32).to(T)`` bit for bit, near every kind of tie."""
    dtype = getattr(torch, target)
    x = torch.from_numpy(_near_ties(lookup(target).fmt, 3000, seed=1))
    direct = x.to(dtype).view(torch.uint8 if dtype.itemsize == 1 else torch.int16)
    twice = x.to(torch.float32).to(dtype).view(direct.dtype)
    assert torch.equal(direct, twice)


def test_the_issue_example_overflows_as_torch_says(tmp_path: Path) -> None:
    # 65520 * (1 - 2**-40) is 65520 - 5.96e-8: single rounding gives 65504 (below the tie 65520). float32's
    # spacing at 65520 is 2**-8, so float32 rounds it to 65520.0 exactly: a tie that float16 breaks to 65536 = inf.
    value = 65520 * (1 - 2.0**-40)
    assert _rne(Fraction(value), lookup("float16").fmt) == 65504
    assert torch.tensor([value], dtype=torch.float64).to(torch.float16).item() == math.inf
    cast = _scan(tmp_path, torch.tensor([value, 1.0], dtype=torch.float64), ["float16"]).casts["float16"]
    assert (cast.overflow, cast.double_rounding, cast.level) == (1, 1, "fail")


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
def test_float16_edges_of_the_cast_through_float32(tmp_path: Path, compiled: bool) -> None:
    # Overflow: float32 65520.0 is pattern 0x477FF000 (even), its lower neighbour 65520 - 2**-8 is odd, so the
    # midpoint 65520 - 2**-9 rounds up to 65520.0 (a float16 tie: inf) and anything below it to 65519.996 (65504).
    top = 65520 - 2.0**-9
    # Underflow: float16 flushes up to 2**-25 (the tie with 2**-24 goes to even 0). float32 2**-25 is even and its
    # upper neighbour 2**-25 * (1 + 2**-23) odd, so their midpoint 2**-25 * (1 + 2**-24) rounds down to 2**-25 in
    # float32 (then to 0), though single rounding gives 2**-24; the next float64 above it survives.
    low = 2.0**-25 * (1 + 2.0**-24)
    values = [top, float(np.nextafter(top, 0)), low, float(np.nextafter(low, 1))]
    x = torch.tensor(values + [-v for v in values], dtype=torch.float64)
    torch_result = x.to(torch.float16).to(torch.float64).tolist()
    assert torch_result[:4] == [math.inf, 65504.0, 0.0, 2.0**-24]
    fmt = lookup("float16").fmt
    assert [float(_rne(Fraction(v), fmt)) for v in values] == [65504.0, 65504.0, 2.0**-24, 2.0**-24]
    cast = _scan(tmp_path, x, ["float16"], compiled).casts["float16"]
    # Overflow: +-top; underflow: +-low; subnormal: +-(next above low) -> 2**-24.
    assert (cast.overflow, cast.underflow, cast.subnormal) == (2, 2, 2)
    assert cast.double_rounding == 4  # +-top and +-low differ from single rounding


@pytest.mark.parametrize("target", NARROW)
def test_double_rounding_count_against_fractions(tmp_path: Path, target: str) -> None:
    fmt = lookup(target).fmt
    values = _near_ties(fmt, 400, seed=2)
    dtype = getattr(torch, target)
    torch_cast = torch.from_numpy(values).to(dtype).to(torch.float64).numpy()
    differ = 0
    for value, got in zip(values.tolist(), torch_cast.tolist(), strict=True):
        single = _rne(Fraction(value), fmt)
        single_overflows = abs(single) > Fraction(fmt.max)
        via = _rne(Fraction(float(np.float32(value))), fmt)
        via_overflows = abs(via) > Fraction(fmt.max)
        # The premise again, value by value: torch's result is the float32-then-target rounding.
        if not via_overflows:
            assert Fraction(got) == via
        differ += (single_overflows, single if not single_overflows else 0) != (
            via_overflows,
            via if not via_overflows else 0,
        )
    assert differ > 0
    cast = _scan(tmp_path, torch.from_numpy(values), [target]).casts[target]
    assert cast.double_rounding == differ


def test_float32_sources_and_wide_targets_round_once(tmp_path: Path) -> None:
    x = torch.from_numpy(_near_ties(lookup("float16").fmt, 200, seed=3))
    scanned = _scan(tmp_path, x.to(torch.float32), ["float16", "bfloat16"])
    assert [c.double_rounding for c in scanned.casts.values()] == [0, 0]
    # float64 -> float32 is one rounding, and float4 has no torch cast: CONTRACT's rule, no double rounding.
    wide = _scan(tmp_path, x, ["float32", "fp4"])
    assert [c.double_rounding for c in wide.casts.values()] == [0, 0]


@pytest.mark.parametrize("target", [*NARROW, "fp4"])
def test_round_magnitudes_against_fractions(target: str) -> None:
    fmt = lookup(target).fmt
    values = np.abs(_near_ties(fmt, 300, seed=4))
    got = round_magnitudes(values, fmt)
    assert [Fraction(g) for g in got.tolist()] == [_rne(Fraction(v), fmt) for v in values.tolist()]
