"""What each device really does with a dtype, measured by arithmetic or, for storage-only formats, by casts.

A device that flushes subnormals or saturates on overflow shows up as such; nothing here is copied from
``torch.finfo``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from dtypecheck.dtypes import DtypeSpec, FloatFormat
from dtypecheck.info.report import DeviceMeasurement, DeviceMismatch, Number

if TYPE_CHECKING:
    import torch


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
        # Only where the format cannot hold the value: what torch silently makes of it instead.
        zero_cast = None if fmt.has_zero else probe.roundtrip(0.0)
        negative_cast = None if fmt.signed else probe.roundtrip(-1.0)
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return DeviceMeasurement(False, method, None, None, None, None, None, error=first_line)
    subnormals: Literal["kept", "flushed", "none"] = (
        "none" if not fmt.has_subnormals else ("kept" if smallest < fmt.smallest_normal else "flushed")
    )
    return DeviceMeasurement(
        True, method, eps, largest, smallest, subnormals, overflow, zero_cast=zero_cast, negative_cast=negative_cast
    )


def device_mismatches(fmt: FloatFormat, devices: Mapping[str, DeviceMeasurement]) -> tuple[DeviceMismatch, ...]:
    """Where a supported device disagrees with the format, or with the first supported device."""
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
