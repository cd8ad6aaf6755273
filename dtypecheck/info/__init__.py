"""``dtypecheck info``: the true limits of each dtype, torch.finfo's view of them, and what each device does.

The format values come from the bit layout (``dtypes.FloatFormat``); the device values are *measured* by
running arithmetic (or, for storage-only formats like float8, casts) on each device, so that a device that
flushes subnormals or saturates on overflow shows up as such.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from dtypecheck.dtypes import DtypeSpec, FloatFormat, float_specs
from dtypecheck.promotion import Defaults, PromotionReport, defaults, promote
from dtypecheck.rounding import round_to_format

if TYPE_CHECKING:
    import torch

Number = float | int | bool | None


@dataclass(frozen=True)
class Mismatch:
    """A field where ``torch.finfo``/``torch.iinfo`` disagrees with the format's true value."""

    field: str
    torch: Number
    true: Number


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


@dataclass(frozen=True)
class DeviceMismatch:
    """A device disagreeing with the format, or with the first device."""

    device: str
    field: str
    measured: Number | str
    expected: Number | str
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
    """Safe range for normalised values such as probabilities: ``[tiny, largest value below 1]``."""
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
    kind: Literal["float", "complex"]
    bits: int
    exponent_bits: int
    mantissa_bits: int
    exponent_bias: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    smallest_subnormal: float | None
    resolution: float
    max_exponent: int
    min_exponent: int
    has_inf: bool
    has_nan: bool
    has_negative_zero: bool
    aliases: tuple[str, ...]
    torch_finfo: Mapping[str, Number] | None
    mismatches: tuple[Mismatch, ...]
    devices: Mapping[str, DeviceMeasurement]
    device_mismatches: tuple[DeviceMismatch, ...]
    guidance: Guidance
    note: str = ""


@dataclass(frozen=True)
class IntInfo:
    """An integer, unsigned integer or bool dtype (sub-byte and quantized ones included)."""

    name: str
    kind: Literal["int", "uint", "bool"]
    bits: int
    min: int
    max: int
    aliases: tuple[str, ...]
    quantized: bool
    packed: int
    torch_iinfo: Mapping[str, Number] | None
    mismatches: tuple[Mismatch, ...]


@dataclass(frozen=True)
class InfoReport:
    SCHEMA: ClassVar[str] = "dtypecheck.info/1"

    dtypes: tuple[FloatInfo | IntInfo, ...]
    measured_devices: tuple[str, ...] = field(default=())
    torch_version: str = ""
    defaults: Defaults | None = None
    """The default dtype in effect and what plain constructors give."""
    promotion: PromotionReport | None = None
    """torch's type promotion of the dtypes asked for (``--promote``)."""


# --- torch.finfo / torch.iinfo, and where they are wrong -------------------------------------------------


def _torch_finfo(dtype: torch.dtype) -> dict[str, Number] | None:
    import torch

    # Some dtypes construct a finfo whose attributes then raise (float4), so read them all inside the try.
    try:
        info = torch.finfo(dtype)
        return {
            "bits": int(info.bits),
            "eps": float(info.eps),
            "max": float(info.max),
            "min": float(info.min),
            "smallest_normal": float(info.smallest_normal),
            "resolution": float(info.resolution),
        }
    except (TypeError, RuntimeError, NotImplementedError):
        return None


def _torch_iinfo(dtype: torch.dtype) -> dict[str, Number] | None:
    import torch

    try:
        info = torch.iinfo(dtype)
        return {"bits": int(info.bits), "min": int(info.min), "max": int(info.max)}
    except (TypeError, RuntimeError, NotImplementedError):
        return None


def _mismatches(reported: Mapping[str, Number] | None, truth: Mapping[str, Number]) -> tuple[Mismatch, ...]:
    if reported is None:
        return ()
    return tuple(Mismatch(k, reported[k], truth[k]) for k in reported if k in truth and reported[k] != truth[k])


# --- measuring a device ----------------------------------------------------------------------------------


def available_devices() -> list[str]:
    """CPU always, then every CUDA device, MPS and XPU that this machine has."""
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append("mps")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        devices += [f"xpu:{i}" for i in range(xpu.device_count())]
    return devices


class _Probe:
    """Scalar operations in one dtype on one device, by arithmetic or by casts from float64."""

    def __init__(self, dtype: torch.dtype, device: str, method: Literal["arithmetic", "cast"]) -> None:
        self.dtype = dtype
        self.device = device
        self.method = method

    def _value(self, tensor: torch.Tensor) -> float:
        item = tensor.item()
        return float(item.real) if isinstance(item, complex) else float(item)

    def _finite(self, tensor: torch.Tensor) -> bool:
        import torch

        return bool(torch.isfinite(tensor).all().item())

    def roundtrip(self, x: float) -> float:
        """``x`` cast into the dtype on the device and read back (the storage-only path)."""
        import torch

        wide = torch.float32 if self.device == "mps" else torch.float64
        back = torch.complex64 if self.dtype.is_complex else wide
        return self._value(torch.tensor([x], dtype=wide, device=self.device).to(self.dtype).to(back))

    def _ones(self) -> torch.Tensor:
        import torch

        return torch.ones(1, dtype=self.dtype, device=self.device)

    def spacing_at_one(self) -> float:
        """``next_after(1) - 1``, found by adding ever smaller powers of two to 1."""
        found = 1.0
        if self.method == "arithmetic":
            one = self._ones()
            step = one.clone()
            for _ in range(1100):
                step = step / 2
                bumped = self._value(one + step)
                if bumped == 1.0:
                    break
                found = bumped - 1.0
            return found
        d = 1.0
        for _ in range(1100):
            d /= 2
            bumped = self.roundtrip(1.0 + d)
            if bumped == 1.0:
                break
            found = bumped - 1.0
        return found

    def largest_finite(self) -> float:
        """Double from 1 while the result stays finite and grows, then fill in the mantissa bit by bit."""
        if self.method == "cast":
            value = 1.0
            while math.isfinite(value * 2) and self.roundtrip(value * 2) == value * 2:
                value *= 2
            half = value / 2
            for _ in range(64):
                if self.roundtrip(value + half) == value + half:
                    value += half
                half /= 2
            return value
        x = self._ones()
        for _ in range(2100):
            doubled = x * 2
            if not self._finite(doubled) or self._value(doubled) <= self._value(x):
                break
            x = doubled
        step = x / 2
        for _ in range(1100):
            if self._value(step) == 0:
                break
            candidate = x + step
            if self._finite(candidate) and self._value(candidate) > self._value(x):
                x = candidate
            elif self._value(candidate) == self._value(x):
                break  # the step is now below half an ulp of x: nothing smaller can be added either
            step = step / 2
        return self._value(x)

    def smallest_positive(self) -> float:
        """Halve from 1 until the next halving gives zero (or is no longer representable, for casts)."""
        if self.method == "cast":
            value = 1.0
            for _ in range(1200):
                half = value / 2
                if half == 0 or self.roundtrip(half) != half:
                    break
                value = half
            return value
        x = self._ones()
        for _ in range(1200):
            halved = x / 2
            if self._value(halved) == 0:
                break
            x = halved
        return self._value(x)

    def overflow_cast(self, true_max: float) -> tuple[Literal["inf", "nan", "saturate", "other"], float]:
        import torch

        if self.dtype in (torch.float64, torch.complex128):
            result = self._value(torch.full((1,), true_max, dtype=self.dtype, device=self.device) * 2)
        else:
            result = self.roundtrip(true_max * 4)
        if math.isnan(result):
            return "nan", result
        if math.isinf(result):
            return "inf", result
        if result == true_max:
            return "saturate", result
        return "other", result


def _probe_method(dtype: torch.dtype, device: str) -> Literal["arithmetic", "cast"] | None:
    import torch

    try:
        ones = torch.ones(2, dtype=dtype, device=device)
        (ones + ones / 2).sum().item()
        return "arithmetic"
    except (RuntimeError, TypeError, NotImplementedError):
        pass
    try:
        torch.tensor([1.5], dtype=torch.float32, device=device).to(dtype).to(torch.float32).item()
        return "cast"
    except (RuntimeError, TypeError, NotImplementedError):
        return None


def measure(spec: DtypeSpec, device: str) -> DeviceMeasurement:
    """Measure ``spec`` on ``device``; a device that cannot handle the dtype is reported, not raised."""
    # torch warns that ComplexHalf is experimental; the measurement is how we find out what works.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return _measure(spec, device)


def _measure(spec: DtypeSpec, device: str) -> DeviceMeasurement:
    dtype = spec.torch_dtype()
    fmt = spec.fmt
    method = _probe_method(dtype, device) if dtype is not None else None
    if dtype is None or method is None:
        return DeviceMeasurement(
            False, None, None, None, None, None, None, error=f"{spec.name} is not supported on {device}"
        )
    probe = _Probe(dtype, device, method)
    try:
        eps = probe.spacing_at_one()
        largest = probe.largest_finite()
        smallest = probe.smallest_positive()
        overflow, _ = probe.overflow_cast(fmt.max)
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return DeviceMeasurement(False, method, None, None, None, None, None, error=first_line)
    subnormals: Literal["kept", "flushed", "none"] = (
        "none" if not fmt.has_subnormals else ("kept" if smallest < fmt.smallest_normal else "flushed")
    )
    return DeviceMeasurement(True, method, eps, largest, smallest, subnormals, overflow)


def _device_mismatches(fmt: FloatFormat, devices: Mapping[str, DeviceMeasurement]) -> tuple[DeviceMismatch, ...]:
    found: list[DeviceMismatch] = []
    truth: dict[str, Number | str] = {
        "eps": fmt.eps,
        "max": fmt.max,
        "smallest_subnormal": fmt.smallest_positive,
        "subnormals": "kept" if fmt.has_subnormals else "none",
    }
    reference: tuple[str, DeviceMeasurement] | None = None
    for name, measured in devices.items():
        if not measured.supported:
            continue
        for key, expected in truth.items():
            value = getattr(measured, key)
            if value != expected:
                found.append(DeviceMismatch(name, key, value, expected, "format"))
        if fmt.has_inf and measured.overflow_cast != "inf":
            found.append(DeviceMismatch(name, "overflow_cast", measured.overflow_cast, "inf", "format"))
        if reference is None:
            reference = (name, measured)
            continue
        ref_name, ref = reference
        for key in ("eps", "max", "smallest_subnormal", "subnormals", "overflow_cast"):
            if getattr(measured, key) != getattr(ref, key):
                found.append(DeviceMismatch(name, key, getattr(measured, key), getattr(ref, key), ref_name))
    return tuple(found)


# --- guidance --------------------------------------------------------------------------------------------


def guidance(fmt: FloatFormat) -> Guidance:
    sub = fmt.smallest_subnormal
    return Guidance(
        log_clamp_min=fmt.smallest_normal,
        adam_eps_min=fmt.smallest_normal,
        adam_eps_1e_8=round_to_format(1e-8, fmt) if fmt.has_zero else max(round_to_format(1e-8, fmt), fmt.min),
        # float4's smallest normal is 1.0, so below 1 only its subnormals are left.
        unit_interval=(fmt.smallest_normal if fmt.smallest_normal < 1 else fmt.smallest_positive, 1.0 - fmt.eps / 2),
        exp_max_arg=math.log(fmt.max),
        exp_zero_below=math.log(sub) - math.log(2) if sub is not None else None,
        max_exact_integer=int(min(2 ** (fmt.mantissa_bits + 1), fmt.max)),
        decimal_digits=round((fmt.mantissa_bits + 1) * math.log10(2), 2),
    )


# --- assembling the report -------------------------------------------------------------------------------


def _float_info(spec: DtypeSpec, devices: Sequence[str]) -> FloatInfo:
    fmt = spec.fmt
    dtype = spec.torch_dtype()
    reported = _torch_finfo(dtype) if dtype is not None else None
    truth: dict[str, Number] = {
        "bits": fmt.bits,
        "eps": fmt.eps,
        "max": fmt.max,
        "min": fmt.min,
        "smallest_normal": fmt.smallest_normal,
        "resolution": fmt.resolution,
    }
    measured = {device: measure(spec, device) for device in devices}
    kind: Literal["float", "complex"] = "complex" if spec.kind == "complex" else "float"
    return FloatInfo(
        name=spec.name,
        kind=kind,
        bits=spec.bits,
        exponent_bits=fmt.exponent_bits,
        mantissa_bits=fmt.mantissa_bits,
        exponent_bias=fmt.exponent_bias,
        eps=fmt.eps,
        max=fmt.max,
        min=fmt.min,
        smallest_normal=fmt.smallest_normal,
        smallest_subnormal=fmt.smallest_subnormal,
        resolution=fmt.resolution,
        max_exponent=fmt.max_exponent,
        min_exponent=fmt.min_exponent,
        has_inf=fmt.has_inf,
        has_nan=fmt.has_nan,
        has_negative_zero=fmt.has_negative_zero,
        aliases=spec.aliases,
        torch_finfo=reported,
        mismatches=_mismatches(reported, truth),
        devices=measured,
        device_mismatches=_device_mismatches(fmt, measured),
        guidance=guidance(fmt),
        note=spec.note,
    )


def _int_info(spec: DtypeSpec) -> IntInfo:
    assert spec.int_range is not None
    low, high = spec.int_range
    dtype = spec.torch_dtype()
    reported = _torch_iinfo(dtype) if dtype is not None else None
    kind: Literal["int", "uint", "bool"] = "bool" if spec.kind == "bool" else ("uint" if spec.kind == "uint" else "int")
    truth: dict[str, Number] = {"bits": spec.bits, "min": low, "max": high}
    return IntInfo(
        name=spec.name,
        kind=kind,
        bits=spec.bits,
        min=low,
        max=high,
        aliases=spec.aliases,
        quantized=spec.quantized,
        packed=spec.packed,
        torch_iinfo=reported,
        mismatches=_mismatches(reported, truth),
    )


def describe_dtypes(
    specs: Sequence[DtypeSpec] | None = None, devices: Sequence[str] | None = None, *, with_promotion: bool = False
) -> InfoReport:
    """The info report for ``specs`` (all available float dtypes when ``None``), measured on ``devices``;
    ``with_promotion`` adds torch's type promotion of ``specs``."""
    import torch

    chosen = list(specs) if specs else float_specs()
    where = list(devices) if devices is not None else available_devices()
    infos: list[FloatInfo | IntInfo] = [
        _float_info(s, where) if s.is_floating_or_complex else _int_info(s) for s in chosen
    ]
    return InfoReport(
        dtypes=tuple(infos),
        measured_devices=tuple(where),
        torch_version=torch.__version__,
        defaults=defaults(),
        promotion=promote(chosen) if with_promotion else None,
    )
