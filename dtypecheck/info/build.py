"""Assembling the ``dtypecheck info`` report from the format, torch's view of it and each device's measurements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from dtypecheck.dtypes import DtypeSpec, float_specs
from dtypecheck.info.advice import guidance
from dtypecheck.info.formats import mismatches, torch_finfo, torch_iinfo, true_finfo
from dtypecheck.info.probe import available_devices, device_mismatches, measure
from dtypecheck.info.report import FloatInfo, InfoReport, IntInfo, Number
from dtypecheck.promotion import defaults, promote


def float_info(spec: DtypeSpec, devices: Sequence[str]) -> FloatInfo:
    """One float or complex dtype, measured on ``devices``."""
    fmt = spec.fmt
    dtype = spec.torch_dtype()
    reported = torch_finfo(dtype) if dtype is not None else None
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
        has_zero=fmt.has_zero,
        has_negative=fmt.signed,
        aliases=spec.aliases,
        torch_finfo=reported,
        mismatches=mismatches(reported, true_finfo(fmt)),
        devices=measured,
        device_mismatches=device_mismatches(fmt, measured),
        guidance=guidance(fmt),
        note=spec.note,
    )


def int_info(spec: DtypeSpec) -> IntInfo:
    """One integer, unsigned or bool dtype."""
    assert spec.int_range is not None
    low, high = spec.int_range
    dtype = spec.torch_dtype()
    reported = torch_iinfo(dtype) if dtype is not None else None
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
        mismatches=mismatches(reported, truth),
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
        float_info(s, where) if s.is_floating_or_complex else int_info(s) for s in chosen
    ]
    return InfoReport(
        dtypes=tuple(infos),
        measured_devices=tuple(where),
        torch_version=torch.__version__,
        defaults=defaults(),
        promotion=promote(chosen) if with_promotion else None,
    )
