"""The one dtype registry: names, aliases and the facts of each format's bit layout.

The table is static and pure Python so that ``dtypecheck --help`` never imports torch; ``torch_dtype`` looks a
dtype up lazily and returns ``None`` where this torch build lacks it (float8 arrived in 2.1, the sub-byte
integers in 2.3, float4 in 2.7), in the spirit of safetensors' ``getattr(torch, name, None)`` tables.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dtypecheck.errors import UnknownDtypeError, UsageError

if TYPE_CHECKING:
    import torch

Kind = Literal["float", "complex", "int", "uint", "bool"]
NanEncoding = Literal["ieee", "fn", "fnuz", "none", "all_ones"]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point layout, from which every limit is derived exactly."""

    exponent_bits: int
    """Width of the exponent field."""
    mantissa_bits: int
    """Explicitly stored fraction bits (the implicit leading 1 not counted)."""
    exponent_bias: int
    """Bias subtracted from the exponent field."""
    nan_encoding: NanEncoding
    """``ieee``: all-ones exponent is inf/NaN; ``fn``: no inf, only all-ones exponent *and* mantissa is NaN;
    ``fnuz``: no inf, the negative-zero pattern is the only NaN; ``all_ones``: no inf, the all-ones byte is
    NaN and there is no zero (e8m0); ``none``: every pattern is a number (float4)."""
    signed: bool = True
    """False for unsigned scale formats such as float8_e8m0fnu."""

    @property
    def bits(self) -> int:
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def has_inf(self) -> bool:
        return self.nan_encoding == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.nan_encoding != "none"

    @property
    def has_negative_zero(self) -> bool:
        return self.signed and self.nan_encoding not in ("fnuz",)

    @property
    def has_subnormals(self) -> bool:
        return self.mantissa_bits > 0

    @property
    def has_zero(self) -> bool:
        return self.nan_encoding != "all_ones"

    @property
    def max_biased_exponent(self) -> int:
        """Largest exponent field value that still encodes finite numbers."""
        all_ones = (1 << self.exponent_bits) - 1
        return all_ones - 1 if self.nan_encoding in ("ieee", "all_ones") else all_ones

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite binade."""
        return self.max_biased_exponent - self.exponent_bias

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal binade."""
        # Without subnormals (e8m0) the all-zeros exponent field is itself a normal binade.
        return (1 if self.has_subnormals else 0) - self.exponent_bias

    @property
    def max(self) -> float:
        m = self.mantissa_bits
        # "fn" gives up the all-ones mantissa of the top binade to NaN, so its max is one ulp lower.
        top_fraction = (1 << m) - (2 if self.nan_encoding == "fn" else 1)
        return math.ldexp(1 + math.ldexp(top_fraction, -m), self.emax)

    @property
    def min(self) -> float:
        return -self.max if self.signed else self.smallest_normal

    @property
    def eps(self) -> float:
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def smallest_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float | None:
        if not self.has_subnormals:
            return None
        return math.ldexp(1.0, self.emin - self.mantissa_bits)

    @property
    def smallest_positive(self) -> float:
        return self.smallest_subnormal if self.smallest_subnormal is not None else self.smallest_normal

    @property
    def precision(self) -> int:
        """Decimal digits numpy's ``finfo.precision`` promises: ``floor(-log10(eps))``."""
        return math.floor(-math.log10(self.eps))

    @property
    def resolution(self) -> float:
        return float(10.0**-self.precision)

    @property
    def max_exponent(self) -> int:
        """numpy's ``maxexp``: the smallest power of two that overflows."""
        return self.emax + 1

    @property
    def min_exponent(self) -> int:
        """numpy's ``minexp``: the exponent of the smallest normal number."""
        return self.emin


@dataclass(frozen=True)
class DtypeSpec:
    """One dtype as dtypecheck knows it, whether or not this torch build has it."""

    name: str
    """torch's name without the ``torch.`` prefix."""
    kind: Kind
    bits: int
    """Bits of one value (4 for float4 and int4, even where torch packs two in a byte; both parts of a complex)."""
    aliases: tuple[str, ...] = ()
    float_format: FloatFormat | None = None
    """The layout of a float, or of each component of a complex."""
    int_range: tuple[int, int] | None = None
    quantized: bool = False
    """A quantized integer type (values carry a scale and zero point)."""
    packed: int = 1
    """Values per torch element (2 for float4_e2m1fn_x2, quint4x2)."""
    note: str = ""
    short: str = ""
    """The name a narrow table column uses (``fp16``, ``e4m3``); empty: the full name."""
    scaled: bool = False
    """A target cast after per-tensor scaling to its max (fp8, fp4): scans count its ``scaled_underflow``."""
    safetensors: str | None = None
    """The safetensors header's dtype code (``BF16``), or None where safetensors has none."""
    gguf: int | None = None
    """The GGML type id of an unquantized GGUF tensor of this dtype, or None."""
    storage: str = ""
    """The dtype a chunk is viewed as to read its bits with numpy (``uint8`` for bool and packed float4);
    empty: the dtype itself."""

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_floating_or_complex(self) -> bool:
        return self.kind in ("float", "complex")

    @property
    def short_name(self) -> str:
        return self.short or self.name

    @property
    def storage_dtype(self) -> str:
        return self.storage or self.name

    @property
    def scale_max(self) -> float:
        """The magnitude per-tensor scaling maps a tensor's absmax to (the format's max); only for ``scaled``."""
        if not self.scaled:
            raise TypeError(f"{self.name} is not cast with per-tensor scaling")
        return self.fmt.max

    @property
    def itemsize_bits(self) -> int:
        """Storage bits of one torch element."""
        return self.bits * self.packed

    def torch_dtype(self) -> torch.dtype | None:
        import torch

        found = getattr(torch, self.name, None)
        return found if isinstance(found, torch.dtype) else None

    @property
    def available(self) -> bool:
        """Whether this torch build has the dtype; answered without importing torch (~1 s) for the dtypes every
        supported torch has."""
        return self.name in IN_EVERY_SUPPORTED_TORCH or self.torch_dtype() is not None

    @property
    def fmt(self) -> FloatFormat:
        """The float layout; only call on float and complex specs."""
        if self.float_format is None:
            raise TypeError(f"{self.name} is not a floating-point dtype")
        return self.float_format


OLDEST_SUPPORTED_TORCH = (2, 2)
"""The oldest torch the package accepts (``torch>=2.2`` in pyproject.toml; a test keeps the two equal)."""
IN_EVERY_SUPPORTED_TORCH = frozenset(
    {
        *("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"),
        *("int8", "int16", "int32", "int64", "uint8", "bool", "complex64", "complex128"),
    }
)
"""Dtypes that torch has had since before its oldest supported version: a scan of a float32 file with
``--target fp16,bf16,e4m3`` need not import torch to learn that the targets exist."""

_FP64 = FloatFormat(11, 52, 1023, "ieee")
_FP32 = FloatFormat(8, 23, 127, "ieee")
_BF16 = FloatFormat(8, 7, 127, "ieee")
_FP16 = FloatFormat(5, 10, 15, "ieee")


def _signed(bits: int) -> tuple[int, int]:
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _unsigned(bits: int) -> tuple[int, int]:
    return 0, (1 << bits) - 1


def _build_registry() -> tuple[DtypeSpec, ...]:
    specs: list[DtypeSpec] = [
        DtypeSpec("float64", "float", 64, ("double", "fp64", "f64"), _FP64, short="fp64", safetensors="F64", gguf=28),
        DtypeSpec(
            "float32", "float", 32, ("float", "fp32", "f32", "single"), _FP32, short="fp32", safetensors="F32", gguf=0
        ),
        DtypeSpec(
            "bfloat16",
            "float",
            16,
            ("bf16", "bfloat", "brain_float16"),
            _BF16,
            short="bf16",
            safetensors="BF16",
            gguf=30,
        ),
        DtypeSpec("float16", "float", 16, ("half", "fp16", "f16"), _FP16, short="fp16", safetensors="F16", gguf=1),
        DtypeSpec(
            "float8_e4m3fn",
            "float",
            8,
            ("e4m3", "e4m3fn", "fp8", "fp8_e4m3", "fp8_e4m3fn", "f8e4m3fn", "float8_e4m3"),
            FloatFormat(4, 3, 7, "fn"),
            short="e4m3",
            scaled=True,
            safetensors="F8_E4M3",
        ),
        DtypeSpec(
            "float8_e4m3fnuz",
            "float",
            8,
            ("e4m3fnuz", "fp8_e4m3fnuz", "f8e4m3fnuz"),
            FloatFormat(4, 3, 8, "fnuz"),
            short="e4m3fnuz",
            scaled=True,
        ),
        DtypeSpec(
            "float8_e5m2",
            "float",
            8,
            ("e5m2", "fp8_e5m2", "f8e5m2"),
            FloatFormat(5, 2, 15, "ieee"),
            short="e5m2",
            scaled=True,
            safetensors="F8_E5M2",
        ),
        DtypeSpec(
            "float8_e5m2fnuz",
            "float",
            8,
            ("e5m2fnuz", "fp8_e5m2fnuz", "f8e5m2fnuz"),
            FloatFormat(5, 2, 16, "fnuz"),
            short="e5m2fnuz",
            scaled=True,
        ),
        DtypeSpec(
            "float8_e8m0fnu",
            "float",
            8,
            ("e8m0", "e8m0fnu", "fp8_e8m0fnu", "f8e8m0fnu"),
            FloatFormat(8, 0, 127, "all_ones", signed=False),
            note="unsigned power-of-two scale format (MX block scales): no zero, no sign, no subnormals",
            short="e8m0",
            scaled=True,
            safetensors="F8_E8M0",
        ),
        DtypeSpec(
            "float4_e2m1fn_x2",
            "float",
            4,
            ("fp4", "float4", "e2m1", "fp4_e2m1", "float4_e2m1fn", "f4e2m1fn"),
            FloatFormat(2, 1, 1, "none"),
            packed=2,
            note="two float4 values packed per byte; torch has no arithmetic or casts for it yet",
            short="fp4",
            scaled=True,
            safetensors="F4",
            storage="uint8",
        ),
        DtypeSpec("complex128", "complex", 128, ("cdouble", "c128"), _FP64, safetensors="C128"),
        DtypeSpec("complex64", "complex", 64, ("cfloat", "complex", "c64"), _FP32, safetensors="C64"),
        DtypeSpec("complex32", "complex", 32, ("chalf", "c32"), _FP16),
        DtypeSpec("bool", "bool", 8, ("boolean",), int_range=(0, 1), safetensors="BOOL", storage="uint8"),
        DtypeSpec("int8", "int", 8, ("i8", "char"), int_range=_signed(8), safetensors="I8", gguf=24),
        DtypeSpec("int16", "int", 16, ("i16", "short"), int_range=_signed(16), safetensors="I16", gguf=25),
        DtypeSpec("int32", "int", 32, ("i32", "int"), int_range=_signed(32), safetensors="I32", gguf=26),
        DtypeSpec("int64", "int", 64, ("i64", "long"), int_range=_signed(64), safetensors="I64", gguf=27),
        DtypeSpec("uint8", "uint", 8, ("u8", "byte"), int_range=_unsigned(8), safetensors="U8"),
        DtypeSpec("uint16", "uint", 16, ("u16",), int_range=_unsigned(16), safetensors="U16"),
        DtypeSpec("uint32", "uint", 32, ("u32",), int_range=_unsigned(32), safetensors="U32"),
        DtypeSpec("uint64", "uint", 64, ("u64",), int_range=_unsigned(64), safetensors="U64"),
    ]
    for bits in range(1, 8):
        specs.append(DtypeSpec(f"int{bits}", "int", bits, (f"i{bits}",), int_range=_signed(bits)))
    for bits in range(1, 8):
        specs.append(DtypeSpec(f"uint{bits}", "uint", bits, (f"u{bits}",), int_range=_unsigned(bits)))
    specs += [
        DtypeSpec("qint8", "int", 8, (), int_range=_signed(8), quantized=True),
        DtypeSpec("quint8", "uint", 8, (), int_range=_unsigned(8), quantized=True),
        DtypeSpec("qint32", "int", 32, (), int_range=_signed(32), quantized=True),
        DtypeSpec("quint4x2", "uint", 4, (), int_range=_unsigned(4), quantized=True, packed=2),
        DtypeSpec("quint2x4", "uint", 2, (), int_range=_unsigned(2), quantized=True, packed=4),
    ]
    return tuple(specs)


REGISTRY: tuple[DtypeSpec, ...] = _build_registry()
_BY_NAME: dict[str, DtypeSpec] = {}
for _spec in REGISTRY:
    for _key in (_spec.name, *_spec.aliases):
        if _key in _BY_NAME:
            raise AssertionError(f"dtype alias {_key!r} registered twice")
        _BY_NAME[_key] = _spec


SAFETENSORS_DTYPES: dict[str, str] = {s.safetensors: s.name for s in REGISTRY if s.safetensors}
"""safetensors dtype code -> dtype name."""
GGUF_PLAIN_TYPES: dict[int, str] = {s.gguf: s.name for s in REGISTRY if s.gguf is not None}
"""GGML type id of an unquantized tensor -> dtype name."""


def _normalise(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    for prefix in ("torch.", "np.", "numpy."):
        if key.startswith(prefix):
            key = key[len(prefix) :]
    return key


def all_names() -> list[str]:
    """Every accepted spelling, canonical names first."""
    return [s.name for s in REGISTRY] + [a for s in REGISTRY for a in s.aliases]


def lookup(name: str) -> DtypeSpec:
    """Resolve a user-typed dtype name (case-insensitive, aliases accepted).

    Raises ``UnknownDtypeError`` naming the closest spellings, and for a dtype dtypecheck knows but this
    torch build lacks, says so rather than pretending it does not exist.
    """
    spec = _BY_NAME.get(_normalise(name))
    if spec is None:
        suggestions = difflib.get_close_matches(_normalise(name), all_names(), n=3, cutoff=0.5)
        raise UnknownDtypeError(name, tuple(suggestions))
    return spec


def lookup_available(name: str) -> DtypeSpec:
    spec = lookup(name)
    if not spec.available:
        import torch

        raise UnknownDtypeError(name, (), reason=f"this torch build ({torch.__version__}) has no torch.{spec.name}")
    return spec


def spec_of(dtype: torch.dtype) -> DtypeSpec:
    """The registry entry of a torch dtype."""
    return _BY_NAME[str(dtype).removeprefix("torch.")]


def float_specs(*, available_only: bool = True) -> list[DtypeSpec]:
    """Real floating dtypes, widest first."""
    return [s for s in REGISTRY if s.kind == "float" and (s.available or not available_only)]


def parse_dtype_list(values: list[str] | None) -> list[DtypeSpec]:
    """Parse repeatable, comma-separated dtype options, keeping order and dropping repeats."""
    seen: dict[str, DtypeSpec] = {}
    for value in values or []:
        if not value.replace(",", "").strip():
            raise UsageError(f"empty dtype name {value!r}: name at least one dtype (or leave the option out)")
        for part in value.split(","):
            if part.strip():
                spec = lookup_available(part)
                seen.setdefault(spec.name, spec)
    return list(seen.values())
