"""Which dtypes a scan can judge casts to: one rule, shared by ``--target`` and the config file's ``targets``.

On the ground floor (dtypes and errors only), so that both the config's validation and the scan read it without
one core reaching into the other.
"""

from __future__ import annotations

from collections.abc import Sequence

from dtypecheck.dtypes import DtypeSpec
from dtypecheck.errors import ParameterError


def target_problem(spec: DtypeSpec) -> str | None:
    """Why ``spec`` cannot be a cast target (one line), or None when it can.

    A target must be a real float or integer dtype that can hold a tensor's values: bool and complex casts have no
    overflow rule, quantized integers need a scale and zero point, and a float format without zero or without sign
    (float8_e8m0fnu, the power-of-two scales of MX blocks) cannot represent weights at all: every zero and every
    negative value would be lost, so the counts would say nothing useful.
    """
    if spec.kind not in ("float", "int", "uint") or spec.quantized:
        return f"{spec.name}: a target must be a float or integer dtype"
    if spec.kind == "float" and (not spec.fmt.has_zero or not spec.fmt.signed):
        return (
            f"{spec.name} holds only positive powers of two (MX block scales: no zero, no sign), so it cannot hold "
            "a tensor's values; the block-scaled (MX) verdict of an fp8/fp4 target uses it (target e4m3 with precision)"
        )
    return None


def check_targets(targets: Sequence[DtypeSpec]) -> list[DtypeSpec]:
    """``targets`` as a list, or a ``ParameterError`` (exit 2) naming the first that cannot be one."""
    for spec in targets:
        problem = target_problem(spec)
        if problem is not None:
            raise ParameterError("{targets} " + problem.replace("{", "{{").replace("}", "}}"))
    return list(targets)
