"""``--measure``: one real step on CUDA (when present) or the CPU, its peak beside the estimate.

On the CPU, PyTorch's own ``MemTracker`` is the referee (it counts every live tensor storage, as the CUDA caching
allocator's ``max_memory_allocated`` does on a GPU). A warm-up step runs first so that the optimizer states exist,
as they do in every step but the first; the measured step starts with gradients set to None. The step is the one
the estimate traced (``step.py``): the same loss, the output referenced until the step ends.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from dtypecheck.errors import DtypecheckError, InputError, ParameterError
from dtypecheck.memory.report import Measurement, MemoryEstimate
from dtypecheck.memory_words import OptimizerImpl
from dtypecheck.training_step import StepLoss, forward_and_loss, to_device, watching_targets
from dtypecheck.usercode import raise_user_error

if TYPE_CHECKING:
    import torch

    from dtypecheck.memory.subject import Subject

TORCH_OPTIMIZERS = ("adamw", "adam", "sgd", "adafactor")
MEASURE_FRACTION = 0.8
"""Refuse to measure a step estimated to need more than this share of the device's free memory."""


def _available_bytes(device: torch.device) -> int | None:
    import os

    import torch

    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:  # MemAvailable counts reclaimable page cache, which free pages alone do not
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def make_optimizer(name: str, params: list[torch.nn.Parameter], impl: OptimizerImpl) -> torch.optim.Optimizer:
    """The torch optimizer the estimate's formulas describe (SGD with momentum 0.9)."""
    import torch

    foreach = impl == "foreach"
    fused = True if impl == "fused" else None
    if name == "adamw":
        return torch.optim.AdamW(params, foreach=foreach, fused=fused)
    if name == "adam":
        return torch.optim.Adam(params, foreach=foreach, fused=fused)
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=foreach, fused=fused)
    if name == "adafactor":
        return torch.optim.Adafactor(params, foreach=foreach)
    raise ParameterError(f"{{measure}} runs torch's own optimizers ({', '.join(TORCH_OPTIMIZERS)}), not {name}")


def run_step(
    module: torch.nn.Module,
    make_inputs: Callable[[], Any],
    loss: StepLoss,
    optimizer: torch.optim.Optimizer | None,
    autocast_dtype: torch.dtype | None,
    device: torch.device,
    input_dtype: torch.dtype | None = None,
    grad_accum: int = 1,
    between_micro_batches: Callable[[], None] | None = None,
) -> None:
    """One training step (or, without an optimizer, one no-grad forward pass); every reference it made (the batch,
    the output, the loss) lives until it returns, as in a loop's ``train_step(batch)``."""
    import torch

    from dtypecheck.memory.tracing import cast_inputs

    inputs = to_device(cast_inputs(make_inputs(), input_dtype), device)
    autocast = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    if optimizer is None:
        with torch.no_grad():
            forward_and_loss(module, inputs, None, autocast)
        return
    targets: list[torch.Tensor] = []  # a default loss's target is held as the batch that brings it is
    with watching_targets(targets.append):
        held: tuple[Any, ...] = ()
        for micro in range(grad_accum):
            if micro:
                if between_micro_batches is not None:
                    between_micro_batches()
                held = ()  # a loop drops a micro-batch's output and loss when it loads the next
                inputs = to_device(cast_inputs(make_inputs(), input_dtype), device)
                targets.clear()
            output, value = forward_and_loss(module, inputs, loss, autocast)
            assert value is not None
            value.backward()  # type: ignore[no-untyped-call]
            held = (output, value)  # the last one's are still referenced in the update, as the trace counts them
            del output, value
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del held


def measured_peak(
    module: torch.nn.Module,
    make_inputs: Callable[[], Any],
    loss: StepLoss,
    optimizer: torch.optim.Optimizer | None,
    autocast_dtype: torch.dtype | None,
    device: torch.device,
    input_dtype: torch.dtype | None = None,
    grad_accum: int = 1,
) -> int:
    """Warm up, then the peak bytes of one more step (model states included)."""
    import torch

    module.train(optimizer is not None)
    step = (module, make_inputs, loss, optimizer, autocast_dtype, device, input_dtype, grad_accum)
    run_step(*step)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        run_step(*step)
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(module, *([optimizer] if optimizer is not None else []))
    if not _without_module_tracking(tracker):
        _skip_frozen_grad_hooks(tracker, module)  # its module hooks register the gradient hooks
    with warnings.catch_warnings():
        # Its module tracker warns about autograd nodes of modules already collected; the bytes are unaffected.
        warnings.simplefilter("ignore", UserWarning)
        with tracker:
            # MemTracker refuses a module called twice in one tracked region unless its module stats are reset;
            # its peak is kept.
            run_step(*step, tracker.reset_mod_stats)
    return int(tracker.get_tracker_snapshot("peak")[device]["Total"])


class _NoModuleTracking:
    """Stands for MemTracker's module tracker, which only sorts the bytes by module (its total does not read it).

    That tracker hooks the inputs and outputs of every module for its backward, and those hooks keep the autograd
    graph of a module no gradient reaches alive until the tracker exits, where a plain step frees it once nothing
    refers to it: a tiny Encodec, whose quantizer's integer codes cut its encoder off from the loss, measured
    4,874,580 bytes tracked by module against 2,910,608 without (the same storages counted by a bare dispatch
    mode, hooked and not); the estimate is 2,924,944."""

    def __init__(self) -> None:
        self.parents: set[str] = set()
        self.is_bw = False

    def register_user_hooks(self, *_hooks: Any) -> None:
        return None

    def clear_user_hooks(self) -> None:
        return None

    def __enter__(self) -> _NoModuleTracking:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None


def _without_module_tracking(tracker: Any) -> bool:
    """Leave MemTracker's module tracking out (``_NoModuleTracking``), on the torch versions whose tracker reads
    only ``parents`` and ``is_bw`` of it outside its module hooks; whether it was left out."""
    modules = getattr(tracker, "_mod_tracker", None)
    if modules is None or not hasattr(modules, "is_bw") or not hasattr(modules, "parents"):
        return False
    tracker._mod_tracker = _NoModuleTracking()
    return True


class _NoHook:
    """Stands for the gradient hooks MemTracker would register on a parameter: ``remove()`` does nothing."""

    def remove(self) -> None:
        return None


def _skip_frozen_grad_hooks(tracker: Any, module: torch.nn.Module) -> None:
    """MemTracker registers a gradient hook on every parameter of a module it enters, and a frozen one (Whisper's
    sinusoidal positions, ``requires_grad=False``) refuses it: it is marked as hooked already, so that MemTracker
    still counts its bytes as a parameter's and skips the hook (it never has a gradient to count)."""
    handles = getattr(tracker, "_param_to_grad_hook_handles", None)
    if handles is None:
        return
    for param in module.parameters():
        if not param.requires_grad:
            handles[param] = (_NoHook(), _NoHook())


def why_not_measurable(subject: Subject, row: MemoryEstimate) -> str | None:
    """Why ``row`` cannot be run for real here (a ``ParameterError`` template), or None when it can."""
    from dtypecheck.dtypes import lookup

    if subject.real is None:
        return "{measure} needs a model to run: a factory that returns example inputs, or a config"
    if row.sharding.strategy != "none":
        return "{measure} runs on one device; leave out {strategy}"
    spec = lookup(row.dtype)
    if not spec.is_float or spec.bits < 16:
        return f"{{measure}} runs float dtypes (float32, bfloat16, float16), not {row.dtype}"
    if row.mode == "training" and row.optimizer not in TORCH_OPTIMIZERS:
        return f"{{measure}} runs torch's own optimizers ({', '.join(TORCH_OPTIMIZERS)}), not {row.optimizer}"
    if row.precision == "master":
        return "{measure} runs pure and amp precision; master-weight training needs a trainer's loop"
    if row.checkpointing:
        return "{measure} does not apply {checkpointing}; measure without it"
    return None


def measure_row(subject: Subject, row: MemoryEstimate, device_name: str | None = None) -> Measurement:
    """One real step of ``row``'s configuration, with the optimizer implementation the row assumed."""
    import torch

    from dtypecheck.dtypes import lookup

    why = why_not_measurable(subject, row)
    if why is not None:
        raise ParameterError(why)
    assert subject.real is not None
    spec = lookup(row.dtype)
    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    available = _available_bytes(device)
    if available is not None and row.bytes.total > MEASURE_FRACTION * available:
        raise ParameterError(
            f"{{measure}} would need about {row.bytes.total / 2**30:.1f} GiB on {device}, more than "
            f"{MEASURE_FRACTION:.0%} of the {available / 2**30:.1f} GiB available"
        )
    module, make_inputs = subject.real()
    amp = row.mode == "training" and row.precision == "amp"
    if any(t.device.type == "meta" for t in (*module.parameters(), *module.buffers())):
        module = module.to_empty(device=device)  # values do not change what a step allocates
    module = module.to(device=device, dtype=torch.float32 if amp else spec.torch_dtype())
    optimizer = None
    if row.mode == "training":
        params = [p for p in module.parameters() if p.requires_grad]
        impl = cast("OptimizerImpl", row.optimizer_impl or "for-loop")
        optimizer = make_optimizer(row.optimizer or "adamw", params, impl)
    autocast_dtype = spec.torch_dtype() if amp else None
    input_dtype = None if amp else spec.torch_dtype()
    try:
        peak = measured_peak(
            module, make_inputs, subject.loss, optimizer, autocast_dtype, device, input_dtype, row.grad_accum
        )
    except DtypecheckError:
        raise
    except Exception as exc:  # noqa: BLE001  (the model's own code, or the referee, failing on the real step)
        what = f"measuring a real {'training step' if row.mode == 'training' else 'inference pass'} in {row.dtype}"
        if subject.user_file is not None:
            raise_user_error(exc, what, subject.user_file)
        first = (str(exc).strip().splitlines() or [""])[0]
        raise InputError(f"{subject.source}: {what} failed ({type(exc).__name__}: {first})") from None
    estimate = row.bytes.total
    return Measurement(
        device=str(device) if device.type == "cpu" else f"{device.type}:{device.index or 0}",
        peak_bytes=peak,
        error=(estimate - peak) / peak if peak else 0.0,
        estimate_bytes=estimate,
        dtype=row.dtype,
        mode=row.mode,
        precision=row.precision,
        referee="MemTracker" if device.type == "cpu" else "torch.cuda.max_memory_allocated",
    )


def measure_rows(
    subject: Subject, rows: tuple[MemoryEstimate, ...], device_name: str | None = None
) -> tuple[tuple[Measurement, ...], tuple[str, ...]]:
    """A real step of every row that can run here (float dtypes, pure or amp, one device), and why the others were
    not run; a usage error when none can."""
    reasons = {id(row): why_not_measurable(subject, row) for row in rows}
    chosen = [row for row in rows if reasons[id(row)] is None]
    if not chosen:
        raise ParameterError((reasons[id(rows[0])] if rows else None) or "{measure}: no configuration to run")
    unmeasured = tuple(
        f"measuring {row.dtype} {row.mode} {row.precision}: {ParameterError(why).with_flags()}"
        for row in rows
        if (why := reasons[id(row)])
    )
    return tuple(measure_row(subject, row, device_name) for row in chosen), unmeasured
