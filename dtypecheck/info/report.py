"""The frozen results of ``dtypecheck info``: what one dtype is, what torch says, what each device does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from dtypecheck.display import ShowsAsHtml
from dtypecheck.promotion import Defaults, PromotionReport

Number = float | int | bool | None


@dataclass(frozen=True)
class Mismatch:
    """A field where ``torch.finfo``/``torch.iinfo`` disagrees with the format's true value."""

    field: str
    """The ``finfo``/``iinfo`` attribute."""
    torch: Number
    """What torch reports."""
    true: Number
    """What the bit layout gives."""


@dataclass(frozen=True)
class DeviceMeasurement:
    """What one device actually does with a dtype."""

    supported: bool
    """False where the device cannot compute or cast in this dtype (then every value is null)."""
    method: Literal["arithmetic", "cast"] | None
    """``arithmetic``: measured with ops in the dtype; ``cast``: storage-only dtype, measured through casts."""
    eps: float | None
    """Spacing at 1.0: the smallest ``d`` with ``1 + d != 1``."""
    max: float | None
    """Largest finite value reached by doubling and then filling in the mantissa."""
    smallest_subnormal: float | None
    """Smallest positive value reached by halving from 1 (the smallest normal when subnormals are flushed)."""
    subnormals: Literal["kept", "flushed", "none"] | None
    """``none``: the format has no subnormals."""
    overflow_cast: Literal["inf", "nan", "saturate", "other"] | None
    """What casting ``4 * max`` from a wider float produces (float64: what ``max * 2`` produces)."""
    error: str | None = None
    """Why the device could not be measured."""
    zero_cast: float | None = None
    """For a format without zero (float8_e8m0fnu): what casting ``0.0`` gives on this device; else null."""
    negative_cast: float | None = None
    """For a format without negatives (float8_e8m0fnu): what casting ``-1.0`` gives on this device; else null."""


@dataclass(frozen=True)
class DeviceMismatch:
    """A device disagreeing with the format, or with the first device."""

    device: str
    """The device that disagrees."""
    field: str
    """The measured field."""
    measured: Number | str
    """What the device gave."""
    expected: Number | str
    """What the format (or the reference device) gives."""
    against: str
    """``format``, or the name of the device it differs from."""


@dataclass(frozen=True)
class Guidance:
    """Numbers derived from the format for the questions users ask."""

    log_clamp_min: float
    """``clamp(x, min=...)`` before ``log``: the smallest normal ("tiny"); full precision, finite log."""
    adam_eps_min: float
    """Smallest Adam ``eps`` that neither vanishes nor goes subnormal (flushed on FTZ devices)."""
    adam_eps_1e_8: float
    """What the common default ``eps=1e-8`` becomes in this dtype (0 means it vanished)."""
    unit_interval: tuple[float, float]
    """Where normalised values such as probabilities are safe, ``[lo, hi]``, both representable: ``lo`` is the
    smallest positive value below 1 at full precision (the smallest normal; the smallest positive value where no
    normal lies below 1, as in float4), ``hi`` the largest value below 1."""
    exp_max_arg: float
    """``exp(x)`` overflows for ``x`` above ``log(max)``."""
    exp_zero_below: float | None
    """``exp(x)`` rounds to zero for ``x`` at or below ``log(smallest_subnormal / 2)``."""
    max_exact_integer: int
    """Every integer in ``[0, n]`` is exact; ``n + 1`` is not."""
    decimal_digits: float
    """Significand precision in decimal digits, ``(mantissa_bits + 1) * log10(2)``."""


@dataclass(frozen=True)
class FloatInfo:
    """Everything about one floating (or complex) dtype; complex values describe each component."""

    name: str
    """torch's name without ``torch.``."""
    kind: Literal["float", "complex"]
    bits: int
    """Bits of one value (both components of a complex)."""
    exponent_bits: int
    mantissa_bits: int
    """Stored fraction bits, the implicit leading 1 not counted."""
    exponent_bias: int
    eps: float
    """Spacing at 1.0."""
    max: float
    """Largest finite value."""
    min: float
    """Most negative finite value (for an unsigned format, its smallest value)."""
    smallest_normal: float
    smallest_subnormal: float | None
    """Null for a format without subnormals."""
    resolution: float
    """numpy's ``10**-floor(-log10(eps))``."""
    max_exponent: int
    """numpy's ``maxexp``: the first power of two that overflows."""
    min_exponent: int
    """numpy's ``minexp``: the exponent of the smallest normal."""
    has_inf: bool
    has_nan: bool
    has_negative_zero: bool
    has_zero: bool
    """False for float8_e8m0fnu: 0 cannot be stored."""
    has_negative: bool
    """False for unsigned formats (float8_e8m0fnu): no value below zero can be stored."""
    aliases: tuple[str, ...]
    """The other names dtypecheck accepts."""
    torch_finfo: Mapping[str, Number] | None
    """What ``torch.finfo`` reports, or null where it raises."""
    mismatches: tuple[Mismatch, ...]
    """Where ``torch.finfo`` disagrees with the format."""
    devices: Mapping[str, DeviceMeasurement]
    """Measurements per device."""
    device_mismatches: tuple[DeviceMismatch, ...]
    """Where a device disagrees with the format or with the first device."""
    guidance: Guidance
    note: str = ""
    """A remark from the dtype registry."""


@dataclass(frozen=True)
class IntInfo:
    """An integer, unsigned integer or bool dtype (sub-byte and quantized ones included)."""

    name: str
    """torch's name without ``torch.``."""
    kind: Literal["int", "uint", "bool"]
    bits: int
    min: int
    max: int
    aliases: tuple[str, ...]
    """The other names dtypecheck accepts."""
    quantized: bool
    """A quantized type (values carry a scale and zero point)."""
    packed: int
    """Values per torch element."""
    torch_iinfo: Mapping[str, Number] | None
    """What ``torch.iinfo`` reports, or null where it raises."""
    mismatches: tuple[Mismatch, ...]
    """Where ``torch.iinfo`` disagrees."""


@dataclass(frozen=True)
class InfoReport(ShowsAsHtml):
    """The report of ``dtypecheck info``."""

    SCHEMA: ClassVar[str] = "dtypecheck.info/1"

    dtypes: tuple[FloatInfo | IntInfo, ...]
    """One entry per dtype asked for."""
    measured_devices: tuple[str, ...] = field(default=())
    """The devices measured."""
    torch_version: str = ""
    defaults: Defaults | None = None
    """The default dtype in effect and what plain constructors give."""
    promotion: PromotionReport | None = None
    """torch's type promotion of the dtypes asked for (``--promote``)."""
