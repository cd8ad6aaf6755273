"""The dtype registry and the scalar rounding rule, checked against numpy, ml_dtypes and bit-level decoding."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

from dtypecheck.dtypes import REGISTRY, float_specs, lookup, parse_dtype_list
from dtypecheck.errors import UnknownDtypeError
from dtypecheck.rounding import judge_cast, round_to_format
from tests._references import ML_DTYPES_SCALAR

# Independent references: numpy for IEEE types, ml_dtypes for the others.
REFERENCE_FINFO = {
    "float64": np.finfo(np.float64),
    "float32": np.finfo(np.float32),
    "float16": np.finfo(np.float16),
    "bfloat16": ml_dtypes.finfo(ml_dtypes.bfloat16),
    "float8_e4m3fn": ml_dtypes.finfo(ml_dtypes.float8_e4m3fn),
    "float8_e4m3fnuz": ml_dtypes.finfo(ml_dtypes.float8_e4m3fnuz),
    "float8_e5m2": ml_dtypes.finfo(ml_dtypes.float8_e5m2),
    "float8_e5m2fnuz": ml_dtypes.finfo(ml_dtypes.float8_e5m2fnuz),
    "float8_e8m0fnu": ml_dtypes.finfo(ml_dtypes.float8_e8m0fnu),
    "float4_e2m1fn_x2": ml_dtypes.finfo(ml_dtypes.float4_e2m1fn),
}


@pytest.mark.parametrize("name", sorted(REFERENCE_FINFO))
def test_float_limits_match_numpy_and_ml_dtypes(name: str) -> None:
    fmt = lookup(name).fmt
    ref = REFERENCE_FINFO[name]
    assert fmt.eps == float(ref.eps)
    assert fmt.max == float(ref.max)
    assert fmt.smallest_normal == float(ref.smallest_normal)
    assert fmt.max_exponent == int(ref.maxexp)
    assert fmt.min_exponent == int(ref.minexp)
    assert fmt.exponent_bits == int(ref.nexp)
    assert fmt.mantissa_bits == int(ref.nmant)
    assert fmt.bits == int(ref.bits)
    if name == "float8_e8m0fnu":
        assert fmt.smallest_subnormal is None  # ml_dtypes reports the smallest normal: there are no subnormals
    else:
        assert fmt.smallest_subnormal == float(ref.smallest_subnormal)


def _decode_minifloat(pattern: int, exp_bits: int, man_bits: int, bias: int, nan: str) -> float:
    """Decode one bit pattern by hand: independent of dtypecheck's derivations."""
    sign = -1.0 if pattern >> (exp_bits + man_bits) & 1 else 1.0
    e = (pattern >> man_bits) & ((1 << exp_bits) - 1)
    m = pattern & ((1 << man_bits) - 1)
    all_e = (1 << exp_bits) - 1
    if nan == "ieee" and e == all_e:
        return math.nan if m else sign * math.inf
    if nan == "fn" and e == all_e and m == (1 << man_bits) - 1:
        return math.nan
    if nan == "fnuz" and pattern == 1 << (exp_bits + man_bits):
        return math.nan
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - man_bits)
    return sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)


@pytest.mark.parametrize(
    ("name", "layout"),
    [
        ("float8_e4m3fn", (4, 3, 7, "fn")),
        ("float8_e4m3fnuz", (4, 3, 8, "fnuz")),
        ("float8_e5m2", (5, 2, 15, "ieee")),
        ("float8_e5m2fnuz", (5, 2, 16, "fnuz")),
        ("float4_e2m1fn_x2", (2, 1, 1, "none")),
        ("float16", (5, 10, 15, "ieee")),
    ],
)
def test_limits_match_every_decoded_bit_pattern(name: str, layout: tuple[int, int, int, str]) -> None:
    exp_bits, man_bits, bias, nan = layout
    total = 1 + exp_bits + man_bits
    values = [_decode_minifloat(p, exp_bits, man_bits, bias, nan) for p in range(1 << total)]
    finite = [v for v in values if math.isfinite(v)]
    positive = sorted(v for v in finite if v > 0)
    fmt = lookup(name).fmt
    assert fmt.max == max(finite)
    assert fmt.min == min(finite)
    assert fmt.smallest_subnormal == positive[0]
    assert fmt.eps == min(v for v in positive if v > 1) - 1
    assert fmt.has_inf == any(math.isinf(v) for v in values)
    assert fmt.has_nan == any(math.isnan(v) for v in values)
    zeros = [p for p, v in enumerate(values) if v == 0]
    assert fmt.has_negative_zero == (len(zeros) == 2)


def test_bfloat16_limits_from_float32_bit_patterns() -> None:
    patterns = np.arange(1 << 16, dtype=np.uint32) << 16
    with np.errstate(invalid="ignore"):  # the NaN patterns
        values = patterns.view(np.float32).astype(np.float64)
    finite = values[np.isfinite(values)]
    fmt = lookup("bf16").fmt
    assert fmt.max == finite.max()
    assert fmt.smallest_subnormal == finite[finite > 0].min()


@pytest.mark.parametrize(
    ("typed", "canonical"),
    [
        ("fp16", "float16"),
        ("HALF", "float16"),
        ("torch.float16", "float16"),
        ("bf16", "bfloat16"),
        ("float", "float32"),
        ("double", "float64"),
        ("e4m3", "float8_e4m3fn"),
        ("fp8_e4m3fn", "float8_e4m3fn"),
        ("fp8", "float8_e4m3fn"),
        ("e5m2", "float8_e5m2"),
        ("fp8-e5m2", "float8_e5m2"),
        ("e8m0", "float8_e8m0fnu"),
        ("fp4", "float4_e2m1fn_x2"),
        ("int4", "int4"),
        ("long", "int64"),
        ("cfloat", "complex64"),
    ],
)
def test_aliases_resolve(typed: str, canonical: str) -> None:
    assert lookup(typed).name == canonical


def test_unknown_name_suggests_closest() -> None:
    with pytest.raises(UnknownDtypeError) as caught:
        lookup("fp61")
    assert "fp16" in caught.value.suggestions
    assert caught.value.message().startswith("unknown dtype 'fp61'; did you mean")


def test_parse_dtype_list_splits_commas_and_drops_repeats() -> None:
    assert [s.name for s in parse_dtype_list(["fp16,bf16", "half", " e4m3 "])] == [
        "float16",
        "bfloat16",
        "float8_e4m3fn",
    ]


def test_registry_covers_every_dtype_of_this_torch() -> None:
    import torch

    torch_names = {str(v).removeprefix("torch.") for v in vars(torch).values() if isinstance(v, torch.dtype)}
    opaque = {n for n in torch_names if n.startswith("bits")}
    assert torch_names - opaque <= {s.name for s in REGISTRY}
    assert [s.name for s in float_specs()][:4] == ["float64", "float32", "bfloat16", "float16"]


def test_integer_ranges_match_numpy_and_ml_dtypes() -> None:
    numpy_ints: list[tuple[str, Any]] = [
        ("int8", np.int8),
        ("int64", np.int64),
        ("uint16", np.uint16),
        ("uint64", np.uint64),
    ]
    for name, ref in numpy_ints:
        assert lookup(name).int_range == (int(np.iinfo(ref).min), int(np.iinfo(ref).max))
    for name, mref in [("int4", ml_dtypes.int4), ("uint4", ml_dtypes.uint4), ("int2", ml_dtypes.int2)]:
        assert lookup(name).int_range == (int(ml_dtypes.iinfo(mref).min), int(ml_dtypes.iinfo(mref).max))
    assert lookup("int3").int_range == (-4, 3)
    assert lookup("uint7").int_range == (0, 127)


@pytest.mark.parametrize("name", sorted(ML_DTYPES_SCALAR))
def test_round_to_format_matches_library_casts_inside_the_range(name: str) -> None:
    fmt = lookup(name).fmt
    scalar = ML_DTYPES_SCALAR[name]
    rng = np.random.default_rng(0)
    exponents = rng.uniform(math.log2(fmt.smallest_positive) - 3, math.log2(fmt.max), 4000)
    samples = np.concatenate([np.exp2(exponents), -np.exp2(exponents)])
    for x in samples.astype(np.float32).astype(np.float64):
        expected = float(scalar(np.float32(x)))
        assert round_to_format(float(x), fmt) == expected, x


@pytest.mark.parametrize(
    ("name", "value", "verdict"),
    [
        ("float16", 65519.99, "ok"),
        ("float16", 65520.0, "overflow"),
        ("float16", -65520.0, "overflow"),
        ("float16", 2.0**-25, "underflow"),  # exactly half the smallest subnormal: ties to even, zero
        ("float16", 2.0**-25 * (1 + 2**-20), "subnormal"),
        ("float16", 2.0**-14 - 2.0**-25, "ok"),  # ties up to the smallest normal (even mantissa)
        ("float16", 2.0**-14 - 2.0**-24, "subnormal"),
        ("float8_e4m3fn", 464.0, "ok"),  # midpoint above 448: 448's mantissa is even, so it stays
        ("float8_e4m3fn", 464.0001, "overflow"),
        ("float8_e5m2", 61440.0, "overflow"),  # midpoint above 57344: odd mantissa, rounds up
        ("bfloat16", 1e-45, "underflow"),
        ("float32", math.inf, "nonfinite"),
        ("float16", 0.0, "ok"),
    ],
)
def test_judge_cast_boundaries(name: str, value: float, verdict: str) -> None:
    assert judge_cast(value, lookup(name).fmt) == verdict


# --- the per-dtype facts the loaders, the scanner and the tables read ----------------------------------


def test_safetensors_codes_map_back_and_match_what_safetensors_writes(tmp_path) -> None:
    import json
    import struct

    import torch
    from safetensors.torch import save_file

    from dtypecheck.dtypes import SAFETENSORS_DTYPES

    coded = [s for s in REGISTRY if s.safetensors]
    assert len(SAFETENSORS_DTYPES) == len(coded)  # no code claimed twice
    checked = 0
    for spec in coded:
        assert SAFETENSORS_DTYPES[spec.safetensors] == spec.name  # type: ignore[index]
        dtype = spec.torch_dtype()
        if dtype is None:
            continue
        path = tmp_path / f"{spec.name}.safetensors"
        try:
            nbytes = max(1, spec.itemsize_bits // 8) * 2
            save_file({"t": torch.zeros(nbytes, dtype=torch.uint8).view(dtype)}, str(path))
        except (ValueError, TypeError, KeyError, RuntimeError):
            continue  # this safetensors release cannot write the dtype
        raw = path.read_bytes()
        (length,) = struct.unpack("<Q", raw[:8])
        assert json.loads(raw[8 : 8 + length])["t"]["dtype"] == spec.safetensors, spec.name
        checked += 1
    assert checked >= 15  # floats, float8, complex, ints, bool on any torch this project supports


def test_gguf_type_ids_match_the_gguf_package() -> None:
    gguf = pytest.importorskip("gguf")
    from dtypecheck.dtypes import GGUF_PLAIN_TYPES

    expected = {t.value: t.name for t in gguf.GGMLQuantizationType}
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
    names |= {f"I{b}": f"int{b}" for b in (8, 16, 32, 64)}
    assert {ggml: names[expected[ggml]] for ggml in GGUF_PLAIN_TYPES} == GGUF_PLAIN_TYPES
    assert len(GGUF_PLAIN_TYPES) == 8


def test_scaled_targets_short_names_and_storage_views() -> None:
    import torch

    scaled = {s.name for s in REGISTRY if s.scaled}
    assert scaled == {s.name for s in REGISTRY if s.name.startswith(("float8_", "float4_"))}
    assert lookup("fp4").scale_max == 6.0  # OCP MX: e2m1's largest value
    shorts = [s.short_name for s in REGISTRY]
    assert len(shorts) == len(set(shorts))
    assert lookup("e4m3").short_name == "e4m3"
    assert lookup("e4m3").scale_max == 448.0  # OCP FP8 spec
    with pytest.raises(TypeError):
        _ = lookup("fp16").scale_max
    for spec in REGISTRY:
        storage = lookup(spec.storage_dtype)
        assert storage.itemsize_bits == spec.itemsize_bits, spec.name  # a view, never a conversion
        if spec.kind in ("int", "uint", "bool") and spec.safetensors and spec.available:
            view = torch.zeros(3, dtype=spec.torch_dtype()).view(storage.torch_dtype())  # type: ignore[arg-type]
            assert view.numpy().shape == (3,)


def test_dtypes_known_without_torch_are_in_torch_and_the_oldest_torch_is_the_required_one() -> None:
    import re

    from dtypecheck.dtypes import IN_EVERY_SUPPORTED_TORCH, OLDEST_SUPPORTED_TORCH

    for name in IN_EVERY_SUPPORTED_TORCH:
        assert isinstance(getattr(torch, name), torch.dtype), name
        assert lookup(name).name == name
    project = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    required = re.findall(r'^\s*"torch\s*>=\s*([0-9.]+)"', project, flags=re.MULTILINE)
    assert required == [f"{OLDEST_SUPPORTED_TORCH[0]}.{OLDEST_SUPPORTED_TORCH[1]}"]


def test_common_targets_are_parsed_without_importing_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from dtypecheck.dtypes import parse_dtype_list\n"
        "specs = parse_dtype_list(['fp16,bf16,e4m3', 'e5m2,int8'])\n"
        "print(','.join(s.name for s in specs), 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["float16,bfloat16,float8_e4m3fn,float8_e5m2,int8", "False"]
