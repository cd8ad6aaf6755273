"""The detailed pass for one op: re-run it from the inputs it saw, in its own dtype or a wider one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from dtypecheck.dtypes import spec_of
from dtypecheck.nantrace.ops import has_nonfinite_scalar
from dtypecheck.nantrace.records import OpRecord, plain, readable, version_of
from dtypecheck.nantrace.report import Cause, ValueCounts

if TYPE_CHECKING:
    import torch


class InputsGoneError(Exception):
    """An input was overwritten after the op ran and no copy was kept: the op cannot be re-run."""


@contextlib.contextmanager
def _no_autocast() -> Iterator[None]:
    import torch

    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(torch.autocast("cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast("cuda", enabled=False))
        yield


def _original_inputs(record: OpRecord) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments as the op saw them: pre-op copies of what it overwrote, the rest if still unchanged."""
    import torch

    versions = {id(t): v for t, v in record.inputs}
    overwritten = {id(c.tensor) for c in record.pre}

    def restore(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            clone = record.clones.get(id(value))
            if clone is not None:
                return clone.clone()
            if id(value) in overwritten:
                raise InputsGoneError  # too large to have been copied before the op
            if id(value) in versions and version_of(value) != versions[id(value)]:
                raise InputsGoneError
            if not readable(plain(value)):
                raise InputsGoneError
            return value
        if isinstance(value, list | tuple):
            return type(value)(restore(v) for v in value)
        return value

    return tuple(restore(a) for a in record.args), {k: restore(v) for k, v in record.kwargs.items()}


def _widen(value: Any, dtype: torch.dtype) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return dtype
    if isinstance(value, list | tuple):
        return type(value)(_widen(v, dtype) for v in value)
    return value


def rerun(record: OpRecord, widen_to: torch.dtype | None = None) -> list[torch.Tensor]:
    """The op's floating outputs, recomputed (raises ``InputsGoneError`` when that is impossible)."""
    from dtypecheck.nantrace.ops import iter_tensors, mutated_argument

    args, kwargs = _original_inputs(record)
    if widen_to is not None:
        args, kwargs = _widen(args, widen_to), {k: _widen(v, widen_to) for k, v in kwargs.items()}
    with _no_autocast():
        out = record.func(*args, **kwargs)
    tensors = list(iter_tensors(out))
    if not tensors:
        for where in record.info.written:
            tensors += iter_tensors(mutated_argument(args, kwargs, where))
    return [t for t in tensors if t.is_floating_point()]


def cause_of(record: OpRecord, kind: str, nonfinite_input: bool) -> Cause | None:
    """``range_overflow`` when float64 keeps the result finite; else ``input`` or ``invalid_math``."""
    import torch

    if nonfinite_input or has_nonfinite_scalar(record.args, record.kwargs):
        return "input"
    try:
        wide = rerun(record, torch.float64)
    except InputsGoneError:
        return None
    except Exception:  # noqa: BLE001  (an op with no float64 kernel: the cause stays unknown, not a crash)
        return None
    if kind == "inf":
        finite_in_wide = all(not bool(torch.isinf(t).any()) and not bool(torch.isnan(t).any()) for t in wide)
    else:
        finite_in_wide = all(not bool(torch.isnan(t).any()) for t in wide)
    if finite_in_wide:
        return "range_overflow"
    if not record.inputs and not record.pre:
        # A creation op with no tensor inputs and no non-finite constant cannot do invalid maths.
        return "input"
    return "invalid_math"


def counts_of(tensor: torch.Tensor) -> tuple[ValueCounts, float]:
    """Value classes of one output and its largest magnitude with NaNs left out."""
    import torch

    with torch.no_grad():
        tiny = spec_of(tensor.dtype).fmt.smallest_normal
        magnitude = tensor.detach().abs()
        nan = torch.isnan(tensor)
        absmax = float(torch.where(nan, torch.zeros_like(magnitude), magnitude).max()) if tensor.numel() else 0.0
        counts = ValueCounts(
            nan=int(nan.sum()),
            posinf=int((tensor == float("inf")).sum()),
            neginf=int((tensor == float("-inf")).sum()),
            zeros=int((tensor == 0).sum()),
            subnormal=int(((magnitude < tiny) & (tensor != 0)).sum()),
        )
    return counts, absmax


def output_now_or_rerun(record: OpRecord, position: int) -> torch.Tensor | None:
    """The op's output as it came out: still in place if nothing wrote to it since, else recomputed."""
    checked = record.checked[position]
    if not readable(checked.tensor):
        return None
    if version_of(checked.tensor) == checked.version:
        return checked.tensor
    try:
        outputs = rerun(record)
    except Exception:  # noqa: BLE001  (best effort: counts become unknown)
        return None
    return outputs[position] if position < len(outputs) else None


def underflows_in_float32(record: OpRecord, position: int, tiny: float) -> tuple[int, int] | None:
    """(values that are below the smallest normal but nonzero in float32, numel) for a half-precision output."""
    import torch

    try:
        outputs = rerun(record, torch.float32)
    except Exception:  # noqa: BLE001  (best effort: no underflow warning without a reference)
        return None
    if position >= len(outputs):
        return None
    wide = outputs[position]
    lost = int(((wide.abs() < tiny) & (wide != 0)).sum())
    return lost, wide.numel()
