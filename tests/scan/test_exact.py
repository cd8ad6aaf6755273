"""scan-model's statistics, checked against independent computations: the scalar rounding reference
(``rounding.judge_cast``), ml_dtypes/numpy casts, and plain numpy reductions."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.dtypes import float_specs, lookup
from dtypecheck.rounding import judge_cast
from dtypecheck.scan.kernel import NUMBA
from dtypecheck.scan.report import Float8CastCounts, TensorScan
from dtypecheck.scan.run import scan_checkpoint
from dtypecheck.scan.thresholds import FLOAT32, FLOAT64, cast_edges, target_patterns
from tests._references import ML_DTYPES_SCALAR

FLOAT_TARGETS = [s for s in float_specs() if s.name != "float64"]
ML_DTYPES = ML_DTYPES_SCALAR
BOTH_KERNELS = [pytest.param(True, id="numba"), pytest.param(False, id="numpy")]


def _scan(
    tmp_path: Path, tensors: dict[str, torch.Tensor], targets: list[str], compiled: bool = True
) -> dict[str, TensorScan]:
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path))
    if compiled and not NUMBA:
        pytest.skip("numba is not installed")
    report = scan_checkpoint(str(path), [lookup(t) for t in targets], compiled=compiled, workers=2)
    return {t.name: t for t in report.tensors}


# --- the rounding edges, against the scalar reference ---------------------------------------------------


@pytest.mark.parametrize("spec", FLOAT_TARGETS, ids=lambda s: s.name)
def test_cast_edges_agree_with_judge_cast(spec) -> None:
    """Probed in float64, so every format narrower than float64."""
    fmt = spec.fmt
    edges = cast_edges(fmt)
    flush = float(edges.flush_max)
    assert judge_cast(flush, fmt) == "underflow"
    assert judge_cast(math.nextafter(flush, math.inf), fmt) != "underflow"
    if fmt.has_subnormals:  # without them (e8m0) everything that survives is normal: normal_min is flush_max
        normal = float(edges.normal_min)
        assert judge_cast(normal, fmt) in ("ok", "overflow")
        assert judge_cast(math.nextafter(normal, 0), fmt) == "subnormal"
    tie = float(edges.overflow_at)
    assert judge_cast(tie, fmt) == ("overflow" if edges.overflow_inclusive else "ok")
    assert judge_cast(math.nextafter(tie, math.inf), fmt) == "overflow"
    assert judge_cast(math.nextafter(tie, 0), fmt) == "ok"


def test_named_boundaries() -> None:
    fp16 = cast_edges(lookup("float16").fmt)
    assert (fp16.overflow_at, fp16.overflow_inclusive) == (Fraction(65520), True)  # 65520 overflows, 65519.99 stays
    assert fp16.flush_max == Fraction(1, 2**25)  # half the smallest subnormal flushes (tie to even zero)
    e4m3 = cast_edges(lookup("e4m3").fmt)
    assert (e4m3.overflow_at, e4m3.overflow_inclusive) == (Fraction(464), False)  # max 448 has an even significand


@pytest.mark.parametrize("kernel", [FLOAT32, FLOAT64], ids=lambda k: k.name)
@pytest.mark.parametrize("spec", FLOAT_TARGETS, ids=lambda s: s.name)
def test_patterns_split_exactly_where_judge_cast_changes(kernel, spec) -> None:
    fmt = spec.fmt
    patterns = target_patterns(fmt, kernel)

    def verdict(pattern: int) -> str:
        return judge_cast(kernel.float_of_magnitude(pattern), fmt)

    assert verdict(patterns.survive - 1) == "underflow" or patterns.survive == 1
    assert verdict(patterns.survive) != "underflow"
    if patterns.normal > patterns.survive:
        assert verdict(patterns.normal - 1) == "subnormal"
        assert verdict(patterns.survive) == "subnormal"
    assert verdict(patterns.normal) in ("ok", "overflow")
    if patterns.overflow < kernel.inf_bits:
        assert verdict(patterns.overflow) == "overflow"
    assert verdict(patterns.overflow - 1) != "overflow"


# --- end to end: counts against ml_dtypes casts and the reference, at every boundary ----------------------


def _boundary_values(source: torch.dtype) -> torch.Tensor:
    """Each target's edges and the neighbouring values of the source dtype, both signs, plus ordinary values."""
    probes: list[float] = [0.0, 1.0, 3.0, 1e-3, 1e-30, 1e30]
    for spec in FLOAT_TARGETS:
        fmt = spec.fmt
        edges = cast_edges(fmt)
        probes += [float(edges.flush_max), float(edges.normal_min), float(edges.overflow_at)]
        probes += [fmt.max, fmt.smallest_normal, fmt.smallest_positive, fmt.smallest_positive * 1.5]
    values = torch.tensor(probes, dtype=torch.float64)
    info = torch.finfo(source)
    values = values[(values.abs() <= info.max)]
    in_source = values.to(source)
    up = torch.nextafter(in_source.to(torch.float32), torch.tensor(math.inf)).to(source)
    if source in (torch.float32, torch.float64):
        up = torch.nextafter(in_source, torch.tensor(math.inf, dtype=source))
        down = torch.nextafter(in_source, torch.tensor(0.0, dtype=source))
    else:  # no nextafter for narrow dtypes: step the bit pattern
        bits = in_source.view(torch.int16 if info.bits == 16 else torch.int8)
        up = (bits + 1).view(source)
        down = (bits - 1).view(source)
    everything = torch.cat([in_source, up, down]).to(torch.float64)
    everything = everything[torch.isfinite(everything)]
    return torch.cat([everything, -everything]).to(source)


def _expected(values: np.ndarray, target: str) -> tuple[int, int, int]:
    """Counts from ml_dtypes' casts: non-finite after the cast is an overflow (its fn formats give NaN)."""
    finite = values[np.isfinite(values)]
    with np.errstate(over="ignore"):
        cast = finite.astype(ML_DTYPES[target]).astype(np.float64)
    smallest_normal = lookup(target).fmt.smallest_normal
    overflow = int(np.count_nonzero(~np.isfinite(cast)))
    underflow = int(np.count_nonzero((finite != 0) & (cast == 0)))
    subnormal = int(np.count_nonzero(np.isfinite(cast) & (cast != 0) & (np.abs(cast) < smallest_normal)))
    return overflow, underflow, subnormal


def _reference(values: np.ndarray, target: str) -> tuple[int, int, int]:
    verdicts = [judge_cast(float(v), lookup(target).fmt) for v in values]
    return verdicts.count("overflow"), verdicts.count("underflow"), verdicts.count("subnormal")


def _torch_counts(values: torch.Tensor, target: str) -> tuple[int, int, int]:
    """Counts read off torch's own cast (for targets whose overflow torch turns into inf)."""
    x = values.to(torch.float64)
    cast = x.to(getattr(torch, target)).to(torch.float64)
    finite = torch.isfinite(x)
    overflow = int((finite & torch.isinf(cast)).sum())
    underflow = int((finite & (x != 0) & (cast == 0)).sum())
    smallest_normal = lookup(target).fmt.smallest_normal
    subnormal = int((finite & (cast != 0) & (cast.abs() < smallest_normal)).sum())
    return overflow, underflow, subnormal


def _reference_via_float32(values: np.ndarray, target: str) -> tuple[int, int, int]:
    """The rule applied to what torch's cast gives from float64: rounded to float32 first (where a value that
    float32 already flushes, or sends to inf, is an underflow or an overflow of the whole cast)."""
    verdicts = []
    for value in values:
        with np.errstate(over="ignore"):
            once = float(np.float32(value))
        if math.isinf(once):
            verdicts.append("overflow")
        elif once == 0 and value != 0:
            verdicts.append("underflow")
        else:
            verdicts.append(judge_cast(once, lookup(target).fmt))
    return verdicts.count("overflow"), verdicts.count("underflow"), verdicts.count("subnormal")


SOURCES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("compiled", BOTH_KERNELS)
@pytest.mark.parametrize("source", SOURCES, ids=str)
def test_cast_counts_at_every_boundary(tmp_path, source, compiled) -> None:
    values = _boundary_values(source)
    targets = list(ML_DTYPES)
    scanned = _scan(tmp_path, {"x": values}, targets, compiled)["x"]
    as_float = values.to(torch.float64).numpy()
    for target in targets:
        cast = scanned.casts[target]
        got = (cast.overflow, cast.underflow, cast.subnormal)
        # torch casts float64 to 16- and 8-bit floats through float32 (rounding twice): the counts are what that
        # cast gives, CONTRACT's rule applied to the float32-rounded values (float4 has no torch cast: direct).
        via_float32 = source == torch.float64 and target != "float4_e2m1fn_x2"
        reference = _reference_via_float32 if via_float32 else _reference
        assert got == reference(as_float, target), target
        # ml_dtypes saturates float4 (it has no inf or NaN to give), and casts float64 through float32 as torch
        # does, except numpy's float16 cast from float64, which is direct.
        if via_float32 and target in ("float16", "bfloat16", "float8_e5m2"):  # torch's cast gives inf: compare
            assert got == _torch_counts(values, target), target
        if target == "float16" and via_float32:
            pass  # numpy's float64 -> float16 is a single rounding: not what torch does
        elif target != "float4_e2m1fn_x2":
            assert got == _expected(as_float, target), target


def test_float16_named_values(tmp_path) -> None:
    values = torch.tensor([65519.99, 65520.0, -65520.0, 2.0**-25, 2.0**-24, 2.0**-14 - 2.0**-25, 2.0**-14])
    cast = _scan(tmp_path, {"x": values}, ["float16"])["x"].casts["float16"]
    assert (cast.overflow, cast.underflow, cast.subnormal, cast.level) == (2, 1, 1, "fail")


def test_e4m3_saturating_target_counts_overflow_by_the_rule(tmp_path) -> None:
    """torch's CPU cast saturates 1e6 and 465 to 448; the rule still calls them overflow, and 464 stays."""
    values = torch.tensor([448.0, 464.0, 465.0, 1e6])
    assert torch.equal(values.to(torch.float8_e4m3fn).float(), torch.tensor([448.0, 448.0, 448.0, 448.0]))
    cast = _scan(tmp_path, {"x": values}, ["e4m3"])["x"].casts["float8_e4m3fn"]
    assert cast.overflow == 2


# --- own statistics against numpy ----------------------------------------------------------------------


@pytest.mark.parametrize("compiled", BOTH_KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_own_statistics_against_numpy(tmp_path, compiled, dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    scale = 10.0 ** torch.randint(-45, 20, (50_000,), generator=generator, dtype=torch.float64)
    x = (torch.randn(50_000, generator=generator, dtype=torch.float64) * scale).to(dtype)
    x[:7] = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf, -math.inf, 1e-40])
    x[5000::7] = 0.0  # zeros in many blocks take the kernel's second loop
    got = _scan(tmp_path, {"x": x}, ["float16"], compiled)["x"]
    a = x.numpy()
    finite = a[~np.isnan(a)]
    nonzero = np.abs(finite[finite != 0])
    assert (got.min, got.max, got.absmax) == (float(finite.min()), float(finite.max()), math.inf)
    assert got.min_abs_nonzero == float(nonzero.min())
    assert (got.nan, got.posinf, got.neginf) == (1, 1, 2)
    assert got.zeros == int(np.count_nonzero(a == 0))
    tiny = np.finfo(a.dtype).tiny
    assert got.subnormal == int(np.count_nonzero((a != 0) & (np.abs(a) < tiny)))
    assert got.level == "fail"


def test_float16_source_subnormals_counted_in_its_own_dtype(tmp_path) -> None:
    x = torch.tensor([2.0**-24, 2.0**-15, 2.0**-14, 1.0], dtype=torch.float16)
    got = _scan(tmp_path, {"x": x}, ["bfloat16"])["x"]
    assert (got.subnormal, got.min_abs_nonzero) == (2, 2.0**-24)


@pytest.mark.skipif(not NUMBA, reason="numba is not installed")
def test_chunked_parallel_scan_equals_one_chunk(tmp_path, monkeypatch) -> None:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(300_001, generator=generator) * 1e-3
    x[100_000:200_000:3] = 0.0
    x[::9973] = 7e4
    x[12345] = math.nan
    whole = _scan(tmp_path, {"x": x}, ["fp16", "e4m3", "int8"])["x"]
    monkeypatch.setattr("dtypecheck.scan.tensor.KERNEL_CHUNK_BYTES", 4096 * 3 + 4)
    chunked = _scan(tmp_path, {"x": x}, ["fp16", "e4m3", "int8"])["x"]
    numpy_kernel = _scan(tmp_path, {"x": x}, ["fp16", "e4m3", "int8"], compiled=False)["x"]
    assert whole == chunked == numpy_kernel
    assert whole.casts["float16"].overflow == len(range(0, 300_001, 9973))


# --- float8 scaling ------------------------------------------------------------------------------------


def test_scaled_underflow_hand_derived(tmp_path) -> None:
    """absmax = 448 * 2**-20 scales by 2**20; e4m3 flushes |x| * 2**20 <= 2**-10, i.e. |x| <= 2**-30."""
    edge = 2.0**-30
    above = math.nextafter(edge, 1.0)
    x = torch.tensor([448 * 2.0**-20, edge, -edge, above, 0.0, 2.0**-40], dtype=torch.float64)
    cast = _scan(tmp_path, {"x": x}, ["e4m3"])["x"].casts["float8_e4m3fn"]
    assert isinstance(cast, Float8CastCounts)
    assert cast.scaled_underflow == 3  # edge, -edge (ties to zero) and 2**-40; not the value just above
    assert cast.underflow == 5


def test_scaled_underflow_ignores_infinities_for_the_scale(tmp_path) -> None:
    x = torch.tensor([math.inf, 448.0, 2.0**-10, 2.0**-9])
    cast = _scan(tmp_path, {"x": x}, ["e4m3"])["x"].casts["float8_e4m3fn"]
    assert isinstance(cast, Float8CastCounts)
    assert cast.scaled_underflow == 1  # scale 1: 2**-10 is half the smallest subnormal


# --- other dtypes --------------------------------------------------------------------------------------


def test_integer_and_bool_tensors(tmp_path) -> None:
    ints = torch.tensor([-300, -1, 0, 0, 5, 127, 128, 40000], dtype=torch.int64)
    flags = torch.tensor([True, False, False])
    got = _scan(tmp_path, {"i": ints, "b": flags}, ["float16", "int8", "uint8"])
    i = got["i"]
    assert (i.min, i.max, i.absmax, i.min_abs_nonzero, i.zeros) == (-300, 40000, 40000, 1, 2)
    assert set(i.casts) == {"int8", "uint8"}  # integers are judged against integer targets only
    assert (i.casts["int8"].overflow, i.casts["uint8"].overflow) == (3, 3)  # -300, 128, 40000; -300, -1, 40000
    assert i.level == "fail"
    b = got["b"]
    assert (b.min, b.max, b.zeros, b.nan, b.casts["int8"].overflow, b.level) == (0, 1, 2, 0, 0, "ok")


def test_float_to_integer_target_truncates(tmp_path) -> None:
    x = torch.tensor([127.9, 128.0, -128.9, -129.0, math.inf, -math.inf, math.nan, 0.5])
    cast = _scan(tmp_path, {"x": x}, ["int8"])["x"].casts["int8"]
    assert (cast.overflow, cast.underflow, cast.subnormal) == (2, 0, 0)


def test_complex_scans_real_and_imaginary_parts(tmp_path) -> None:
    z = torch.tensor([complex(1.0, 7e4), complex(-2.0, 0.0)], dtype=torch.complex64)
    got = _scan(tmp_path, {"z": z}, ["float16"])["z"]
    assert (got.numel, got.min, got.max, got.zeros) == (2, -2.0, 7e4, 1)
    assert got.casts["float16"].overflow == 1


def test_empty_and_scalar_tensors(tmp_path) -> None:
    got = _scan(tmp_path, {"e": torch.zeros(0, 3), "s": torch.tensor(2.5)}, ["float16", "e4m3"])
    empty = got["e"]
    assert (empty.numel, empty.min, empty.nan, empty.zeros, empty.level) == (0, None, None, None, "ok")
    assert empty.casts["float16"].overflow is None
    scalar = got["s"]
    assert (scalar.shape, scalar.numel, scalar.min, scalar.max, scalar.level) == ((), 1, 2.5, 2.5, "ok")


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"])
def test_float8_tensors(tmp_path, dtype) -> None:
    values = torch.tensor([0.5, 1.0, 2.0, 4.0]).to(getattr(torch, dtype))
    got = _scan(tmp_path, {"x": values}, ["float16"])["x"]
    assert (got.min, got.max, got.numel, got.level) == (0.5, 4.0, 4, "ok")


def test_log2_histogram_counts_binades(tmp_path) -> None:
    x = torch.tensor([0.0, 1.0, 1.5, 2.0, 3.0, 0.25, -0.3])
    histogram = _scan(tmp_path, {"x": x}, ["float16"])["x"].log2_histogram
    assert histogram is not None
    assert (histogram.start, histogram.counts, histogram.sampled_every) == (-2, (2, 0, 2, 2), 1)


def test_float4_values_are_decoded_two_per_byte(tmp_path) -> None:
    """Each byte holds two e2m1 values: 0x21 is 0.5 (low nibble 1: a subnormal) and 1.0; 0xF7 is 6.0 and -6.0."""
    packed = torch.tensor([0x21, 0xF7], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    got = _scan(tmp_path, {"x": packed}, ["float16", "e4m3"])["x"]
    assert (got.min, got.max, got.min_abs_nonzero, got.subnormal, got.zeros) == (-6.0, 6.0, 0.5, 1, 0)
    assert got.casts["float8_e4m3fn"].overflow == 0


# --- orchestration: parts scanned together, progress in bytes -------------------------------------------


class _TwoShards:
    """A stand-in for a sharded checkpoint: its parts are the two files, scanned in parallel threads."""

    def __init__(self, first: str, second: str) -> None:
        from dtypecheck.loaders import open_checkpoint

        self.shards = [open_checkpoint(first), open_checkpoint(second)]
        self.source, self.format = "two-shards", "test"
        self.findings: list[Any] = []

    def parts(self) -> list[Any]:
        return self.shards

    def records(self):
        for shard in self.shards:
            yield from shard.records()

    def close(self) -> None:
        for shard in self.shards:
            shard.close()


def test_parts_are_scanned_together_in_order_with_byte_progress(tmp_path, monkeypatch) -> None:
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"a.0": torch.arange(300_000.0), "a.1": torch.tensor([7e4])}, str(first))
    save_file({"b.0": torch.full((200_000,), 1e-9)}, str(second))
    monkeypatch.setattr("dtypecheck.scan.tensor.KERNEL_CHUNK_BYTES", 65536)
    monkeypatch.setattr("dtypecheck.scan.run.open_checkpoint", lambda _: _TwoShards(str(first), str(second)))
    seen: list[tuple[int, int]] = []
    report = scan_checkpoint("ignored", progress=lambda done, total, what: seen.append((done, total)), workers=2)
    assert [t.name for t in report.tensors] == ["a.0", "a.1", "b.0"]
    assert report.tensors[1].casts["float16"].overflow == 1
    assert report.tensors[2].casts["float16"].underflow == 200_000
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert seen[-1] == (report.summary.bytes, report.summary.bytes)
    assert len(seen) > 10  # one report per chunk
