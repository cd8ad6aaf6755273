"""Combining model states, the traced activation profile and sharding into one row per configuration."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from dtypecheck.choices import StrChoice
from dtypecheck.dtypes import DtypeSpec, lookup
from dtypecheck.errors import DtypecheckError, InputError, ParameterError, UsageError
from dtypecheck.memory import states
from dtypecheck.memory.report import (
    MemoryBytes,
    MemoryEstimate,
    MemoryReport,
    Sharding,
)
from dtypecheck.memory.tracing import (
    ActivationProfile,
    ExtrapolatedProfile,
    OpTraceError,
    Profile,
    Traceable,
    linear_profiles,
    trace_pass,
)
from dtypecheck.memory_words import DeviceKind, Mode, Optimizer, OptimizerImpl, Precision, Strategy
from dtypecheck.progress import ProgressCallback, no_progress
from dtypecheck.usercode import raise_user_error

if TYPE_CHECKING:
    from dtypecheck.memory.inventory import Inventory
    from dtypecheck.memory.subject import Subject

E = TypeVar("E", bound=StrChoice)

DEFAULT_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "int8", "int4")
QUANTIZED_COMPUTE_DTYPE = "bfloat16"
"""Weight-only quantized and float8 models compute (and keep their KV cache) in bfloat16."""


@dataclass(frozen=True)
class EstimateOptions:
    dtypes: tuple[DtypeSpec, ...] = ()
    """Empty: the default grid."""
    modes: tuple[Mode, ...] = ()
    """Empty: inference and training."""
    optimizer: Optimizer = Optimizer.adamw
    precisions: tuple[Precision, ...] = ()
    """Empty: ``pure`` for 32/64-bit floats, ``amp`` below."""
    strategy: Strategy = Strategy.none
    world_size: int = 1
    context: int | None = None
    checkpointing: bool = False
    grad_accum: int = 1
    """Micro-batches per optimizer step (gradient accumulation): each micro-batch's forward and backward run
    while the gradients of the earlier ones are held."""
    keep_unquantized: bool = False
    group_size: int = 128
    optimizer_impl: OptimizerImpl | None = None
    """None: torch's own default on ``device`` (foreach on CUDA, the for-loop on the CPU)."""
    by_module: int | None = None
    """``--by-module``: break each row down by module down to this depth of dotted paths (the model is traced
    whole, not extrapolated)."""
    step_timeline: bool = False
    """``--plot``: keep each row's bytes over the step (traced whole, as ``by_module``)."""
    device: DeviceKind | None = None
    """Where the step runs: it decides the optimizer implementation torch picks by default. None: ``estimate_memory``
    picks CUDA when the fit target is a GPU or this machine has one, else the CPU (the CPU when estimating a
    subject directly)."""

    def __post_init__(self) -> None:
        # The Python API takes plain strings too ("sgd"): each becomes its enum member, or an error naming it.
        for name, enum in (
            ("optimizer", Optimizer),
            ("strategy", Strategy),
            ("device", DeviceKind),
            ("optimizer_impl", OptimizerImpl),
        ):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _member(enum, value, name))
        object.__setattr__(self, "modes", tuple(_member(Mode, m, "modes") for m in self.modes))
        object.__setattr__(self, "precisions", tuple(_member(Precision, p, "precisions") for p in self.precisions))

    @property
    def impl(self) -> OptimizerImpl:
        return self.optimizer_impl or default_impl(self.device or DeviceKind.cpu)


def _member(enum: type[E], value: object, parameter: str) -> E:
    try:
        return enum(value)
    except ValueError:
        raise ParameterError(f"{{{parameter}}} {value!r}: expected one of {', '.join(m.value for m in enum)}") from None


def default_impl(device: DeviceKind) -> OptimizerImpl:
    """What ``torch.optim`` picks when not told: ``foreach`` when every parameter is on CUDA, else the for-loop."""
    return OptimizerImpl.foreach if device == DeviceKind.cuda else OptimizerImpl.for_loop


@dataclass(frozen=True)
class Row:
    """One configuration to estimate (what ``plan_rows`` yields, in the report's order)."""

    spec: DtypeSpec
    mode: Mode
    precision: Precision


def plan_rows(options: EstimateOptions) -> tuple[list[Row], list[str]]:
    """The configurations to estimate, and those of the default grid left out (with why).

    A dtype the user named together with an explicit ``--mode training`` that it cannot train in is a usage error.
    """
    dtypes = options.dtypes or tuple(lookup(name) for name in DEFAULT_DTYPES)
    modes = options.modes or tuple(Mode)
    rows: list[Row] = []
    skipped: list[str] = []
    for spec in dtypes:
        for mode in modes:
            if mode == "inference":
                rows.append(Row(spec, Mode(mode), Precision.pure))
                continue
            if not states.can_train(spec):
                why = (
                    "int and float8 storage is not trained directly; train in bfloat16, then quantize"
                    if spec.kind in ("int", "uint") or spec.name.startswith(("float8", "float4"))
                    else f"{spec.kind} weights are not trained with these optimizers"
                )
                if options.dtypes and options.modes:
                    raise UsageError(f"cannot estimate training in {spec.name}: {why}")
                skipped.append(f"{spec.name} training: {why}")
                continue
            wide = spec.bits >= 32
            precisions = options.precisions or ((Precision.pure,) if wide else (Precision.amp,))
            for precision in precisions:
                if wide and precision != "pure":
                    skipped.append(f"{spec.name} {precision}: the same as pure for a {spec.bits}-bit dtype")
                    continue
                rows.append(Row(spec, Mode(mode), Precision(precision)))
    return rows, skipped


def _compute_dtype(row: Row) -> DtypeSpec:
    return row.spec if states.can_train(row.spec) else lookup(QUANTIZED_COMPUTE_DTYPE)


def _shards(strategy: Strategy, world_size: int) -> tuple[int, int, int]:
    """How many ways (optimizer states, gradients, parameters) are split across devices."""
    n = world_size
    return {
        "none": (1, 1, 1),
        "ddp": (1, 1, 1),
        "zero1": (n, 1, 1),
        "zero2": (n, n, 1),
        "zero3": (n, n, n),
        "fsdp": (n, n, n),
    }[strategy]


SHALLOW_LAYERS = (1, 2, 3)
"""Block counts traced to extrapolate a deep model: two to extrapolate from, a third to check linearity."""
LATER_SHALLOW_LAYERS = (2, 3, 4)
"""The same from the second block on, when the first block's bytes differ from the rest's (its input is the
embedding's output, not a block's: a 70B Llama config's inference peak grows from 1 to 2 blocks, not after)."""


class TraceCache:
    """Traces each distinct pass once: rows that compute alike share a profile. A model of many identical
    blocks (a config's ``num_hidden_layers``) is traced at 1 and 2 blocks and extrapolated when the bytes grow
    by the same step per block; the first inference pass and the first training pass are also traced at 3
    blocks to check that step. Where the step from 1 to 2 blocks differs from the next, a trace at 4 blocks checks
    whether the steps agree from the second block on, and the pass is extrapolated from 2 and 3 blocks. This is
    what keeps a 70B config to seconds."""

    def __init__(
        self, subject: Subject, checkpointing: bool, progress: ProgressCallback, total: int, attribute: bool = False
    ) -> None:
        self.subject = subject
        self.attribute = attribute
        """Trace whole (no extrapolation) and record which module holds what (``--by-module``, ``--plot``)."""
        self.checkpointing = checkpointing
        self.progress = progress
        self.total = total
        self.cache: dict[tuple[int, str, bool], Profile | None] = {}
        self.shallow: dict[int, Traceable] = {}
        self.linear_from: dict[bool, int | None] = {}
        """Per pass kind (training or not): the block count from which its bytes were checked to grow by one step
        per block, None when they were not."""
        self.extrapolated_from: dict[bool, int] = {}
        """Per pass kind (training or not) extrapolated: the smaller block count it was extrapolated from."""
        self.memo: dict[tuple[object, ...], ActivationProfile] = {}
        """Every trace taken, by module, shape and pass: ``--fit`` shares one among the caches of all its shapes,
        so that a probe and a plain estimate at the same shape trace each block count once."""

    @property
    def extrapolated(self) -> bool:
        return bool(self.extrapolated_from)

    def get(self, row: Row) -> Profile | None:
        traceable = self.subject.traceable
        if traceable is None:
            return None
        compute = _compute_dtype(row)
        amp = row.mode == "training" and row.precision == "amp"
        # Byte counts depend on the element size, not the format: float16 and bfloat16 passes are the same.
        key = (compute.bits, "amp" if amp else "cast", row.mode == "training")
        if key not in self.cache:
            self.progress(len(self.cache), self.total, f"tracing {row.mode} in {compute.name}")
            self.cache[key] = self._profile(traceable, row, compute, amp)
        return self.cache[key]

    def _profile(self, traceable: Traceable, row: Row, compute: DtypeSpec, amp: bool) -> Profile:
        try:
            return self._profile_of_blocks(traceable, row, compute, amp)
        except InputError:
            if not self.shallow or traceable.with_layers is None:
                raise
        # A shallower copy could not be traced (ConvNeXt's "layers" are its stages, each of another width: one stage
        # feeds the final norm the wrong width). Its blocks are not identical: the model is traced whole.
        traceable.with_layers = None
        self.shallow.clear()
        self.linear_from.clear()
        return self._trace(traceable, row, compute, amp)

    def _profile_of_blocks(self, traceable: Traceable, row: Row, compute: DtypeSpec, amp: bool) -> Profile:
        layers = traceable.layers
        training = row.mode == "training"
        if self.attribute or not (layers and layers > SHALLOW_LAYERS[-1] and self._shallow_built(SHALLOW_LAYERS)):
            return self._trace(traceable, row, compute, amp)
        if not self._copies_hold_every_kind(traceable):
            return self._trace(traceable, row, compute, amp)
        if training in self.linear_from:
            start = self.linear_from[training]
            if start is None:
                return self._trace(traceable, row, compute, amp)
            profiles = self._shallow_traces((start, start + 1), row, compute, amp)
        else:
            profiles = self._shallow_traces(SHALLOW_LAYERS, row, compute, amp)
            start = SHALLOW_LAYERS[0] if linear_profiles(profiles) else None
            if start is None and layers > LATER_SHALLOW_LAYERS[-1] and self._shallow_built(LATER_SHALLOW_LAYERS):
                profiles = profiles[1:] + self._shallow_traces(LATER_SHALLOW_LAYERS[-1:], row, compute, amp)
                start = LATER_SHALLOW_LAYERS[0] if linear_profiles(profiles) else None
            self.linear_from[training] = start
            if start is None:
                return self._trace(traceable, row, compute, amp)
        self.extrapolated_from[training] = start
        return ExtrapolatedProfile(profiles[0], profiles[1], start, layers)

    def _copies_hold_every_kind(self, traceable: Traceable) -> bool:
        """Whether the shallow copies hold every kind of module the whole model has: where its blocks differ
        (NLLB-MoE's experts every 4th layer, DeepSeek-V3's after 3 dense layers, Jamba's attention every 8th),
        copies of the first few blocks have none of the others, whose bytes an extrapolation would never count."""
        whole = {type(m) for m in traceable.module.modules()}
        copies = {type(m) for count in SHALLOW_LAYERS for m in self.shallow[count].module.modules()}
        return whole <= copies

    def _shallow_built(self, counts: tuple[int, ...]) -> bool:
        """Whether copies of the model with ``counts`` blocks exist (built now if need be); False (and never
        again asked) when the config cannot be built shallower."""
        traceable = self.subject.traceable
        if traceable is None or traceable.with_layers is None:
            return False
        try:
            for count in counts:
                if count not in self.shallow:
                    self.shallow[count] = traceable.with_layers(count)
        except InputError:
            traceable.with_layers = None
            return False
        return True

    def _shallow_traces(
        self, counts: tuple[int, ...], row: Row, compute: DtypeSpec, amp: bool
    ) -> list[ActivationProfile]:
        return [self._trace(self.shallow[count], row, compute, amp) for count in counts]

    def extrapolation_note(self) -> str | None:
        """What the extrapolations assumed, in one note: the same words as before when every pass kind was
        extrapolated from 1 and 2 blocks, each kind's own counts otherwise."""
        if not self.extrapolated_from:
            return None
        layers = self.subject.traceable.layers if self.subject.traceable else 0

        def said(start: int) -> str:
            shallow = SHALLOW_LAYERS if start == SHALLOW_LAYERS[0] else LATER_SHALLOW_LAYERS
            differing = "" if shallow is SHALLOW_LAYERS else ", the first block differing"
            return (
                f"from traces with {shallow[0]} and {shallow[1]} blocks (their growth per block checked equal at "
                f"{shallow[2]}{differing})"
            )

        starts = set(self.extrapolated_from.values())
        if starts == {SHALLOW_LAYERS[0]}:
            return f"activations of {layers} identical blocks extrapolated {said(SHALLOW_LAYERS[0])}"
        kinds = sorted(self.extrapolated_from.items(), key=lambda kind: kind[0])
        each = "; ".join(f"{'training' if training else 'inference'} {said(start)}" for training, start in kinds)
        return f"activations of {layers} identical blocks extrapolated: {each}"

    def ungraded_note(self, strategy: Strategy) -> str | None:
        """Which parameters the traced training step gives no gradient, when some are left out of the gradients
        and optimizer states."""
        trainable = self.subject.inventory.trainable
        found: set[str] = set()
        for (_, _, training), profile in self.cache.items():
            if training and profile is not None:
                found |= graded_out(self.subject.inventory, profile, strategy)
        if not found:
            return None
        modules = _covering_modules([entry.name for entry in trainable], found)
        named = ", ".join(modules[:4]) + (f" and {len(modules) - 4} more" if len(modules) > 4 else "")
        values = sum(entry.numel for entry in trainable if entry.name in found)
        return (
            f"{values:,} of {sum(e.numel for e in trainable):,} trainable parameters get no gradient in the traced "
            f"training step (its loss does not reach {named}): no gradient or optimizer state is counted for "
            f"them, as torch's optimizers keep none (--loss sum takes every output into the loss)"
        )

    @staticmethod
    def _what(row: Row, compute: DtypeSpec) -> str:
        return f"{'a training step' if row.mode == 'training' else 'an inference pass'} in {compute.name}"

    def notes(self) -> tuple[str, ...]:
        """What the traces assumed, each once."""
        found = (note for profile in self.cache.values() if profile is not None for note in profile.notes)
        return tuple(dict.fromkeys(found))

    def planned(self, row: Row) -> list[tuple[tuple[object, ...], Callable[[], ActivationProfile], int]]:
        """The traces ``get(row)`` takes first and has not taken yet (a deep model's first block counts; a fourth,
        where the first block differs, is decided from these), each as (memo key, the trace, its block count or 1):
        ``--fit`` takes them side by side before asking ``get``. Builds what they need (shallow copies, inputs)
        here, so that a forked child that takes one changes nothing the next trace depends on."""
        traceable = self.subject.traceable
        compute = _compute_dtype(row)
        amp = row.mode == "training" and row.precision == "amp"
        if traceable is None or (compute.bits, "amp" if amp else "cast", row.mode == "training") in self.cache:
            return []
        training = row.mode == "training"
        layers = traceable.layers
        subjects: list[tuple[Traceable, int]] = [(traceable, 1)]
        if not self.attribute and layers and layers > SHALLOW_LAYERS[-1] and self._shallow_built(SHALLOW_LAYERS):
            start = self.linear_from.get(training, SHALLOW_LAYERS[0])
            counts = SHALLOW_LAYERS if training not in self.linear_from else (start, start + 1) if start else ()
            if counts and self._shallow_built(counts):
                subjects = [(self.shallow[count], count) for count in counts]
        planned: list[tuple[tuple[object, ...], Callable[[], ActivationProfile], int]] = []
        for subject, count in subjects:
            key = self._memo_key(subject, row, compute, amp)
            if key not in self.memo:
                subject.ready()
                planned.append((key, functools.partial(self._trace_once, subject, row, compute, amp), count))
        return planned

    def _memo_key(self, traceable: Traceable, row: Row, compute: DtypeSpec, amp: bool) -> tuple[object, ...]:
        # The module itself is in the key (not its id): the memo keeps it alive, so no other module takes its place.
        shape = (traceable.batch_size, traceable.seq_len)
        return (traceable.module, *shape, compute.bits, amp, row.mode, self.checkpointing, self.attribute)

    def _trace(self, traceable: Traceable, row: Row, compute: DtypeSpec, amp: bool) -> ActivationProfile:
        key = self._memo_key(traceable, row, compute, amp)
        if key not in self.memo:
            self.memo[key] = self._trace_once(traceable, row, compute, amp)
        return self.memo[key]

    def _trace_once(self, traceable: Traceable, row: Row, compute: DtypeSpec, amp: bool) -> ActivationProfile:
        import torch

        from dtypecheck.memory.fakes import cast_module, fake_module_conversions, quiet_fake_tensor_log

        weights_dtype = torch.float32 if amp else compute.torch_dtype()
        assert weights_dtype is not None  # only available dtypes reach the estimate
        traceable.ready()
        cast_module(traceable.module, weights_dtype, traceable.fake_mode)
        try:
            with quiet_fake_tensor_log(), fixed_host_random(), fake_module_conversions():
                return trace_pass(
                    traceable,
                    train=row.mode == "training",
                    autocast_dtype=compute.torch_dtype() if amp else None,
                    checkpointing=self.checkpointing,
                    input_dtype=None if amp else weights_dtype,
                    attribute=self.attribute,
                )
        except OpTraceError as exc:
            raise InputError(f"{self.subject.source}: cannot trace {self._what(row, compute)}: {exc}") from exc
        except DtypecheckError:
            raise
        except Exception as exc:  # noqa: BLE001  (the model's own code, or an op fake tensors cannot run)
            what = self._what(row, compute)
            if self.subject.user_file is not None:
                raise_user_error(exc, f"tracing {what}", self.subject.user_file)
            first = (str(exc).strip().splitlines() or [""])[0]
            raise InputError(
                f"{self.subject.source}: cannot trace {what} of this model ({type(exc).__name__}: {first})"
            ) from None


@contextlib.contextmanager
def fixed_host_random(seed: int | None = 0) -> Iterator[None]:
    """Python's, numpy's and torch's CPU random states seeded for one trace, and put back after it. Model code that
    draws from them (Wav2Vec2's span masks in training, numpy's; a value torch draws that the trace reads) draws
    the same in every trace: an estimate does not depend on what ran before it, and the shallow copies a deep model
    is extrapolated from draw alike. ``seed=None``: only put back (an estimate leaves the caller's states as they
    were, whatever building the model drew)."""
    import random

    import numpy as np
    import torch

    python_state, numpy_state = random.getstate(), np.random.get_state()
    if seed is not None:
        random.seed(seed)
        np.random.seed(seed)
    try:
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.default_generator.manual_seed(seed)  # the CPU's only: a GPU's state is not touched
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def _ceil_div(value: int, parts: int) -> int:
    return math.ceil(value / parts)


def _kv_cache_bytes(subject: Subject, row: Row, context: int | None, batch: int) -> int:
    if row.mode != "inference" or not context or subject.decoder is None:
        return 0
    bits = _compute_dtype(row).bits
    return subject.decoder.kv_elements(context) * batch * bits // 8


FLAT_PARTITIONS = ("zero1", "zero2", "zero3")
"""DeepSpeed's ZeRO keeps each rank's share of all parameters as one flat tensor: its optimizer states and
gradient partitions cover every parameter, whether the loss reaches it or not."""


def _covering_modules(names: list[str], chosen: set[str]) -> list[str]:
    """The fewest dotted prefixes (modules, or whole names) that hold all of ``chosen`` and nothing else of
    ``names``, in the model's order."""
    mixed: set[str] = set()
    for name in names:
        if name not in chosen:
            parts = name.split(".")
            mixed.update(".".join(parts[:i]) for i in range(1, len(parts)))
    found: list[str] = []
    for name in names:
        if name in chosen:
            parts = name.split(".")
            prefix = next(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) not in mixed)
            if prefix not in found:
                found.append(prefix)
    return found


def graded_out(inventory: Inventory, profile: Profile | None, strategy: Strategy) -> frozenset[str]:
    """The trainable parameters the traced step gives no gradient, where that changes what the step holds."""
    if profile is None or strategy in FLAT_PARTITIONS:
        return frozenset()
    return profile.ungraded_of([entry.name for entry in inventory.trainable])


def graded(inventory: Inventory, profile: Profile | None, strategy: Strategy) -> Inventory:
    """The inventory with the parameters the traced step gives no gradient counted as not trained: torch's
    optimizers skip a parameter whose ``.grad`` is None (no state, no update), so only the parameters that get a
    gradient hold one and have optimizer states. Under ZeRO all of them do."""
    ungraded = graded_out(inventory, profile, strategy)
    if not ungraded:
        return inventory
    parameters = tuple(
        dataclasses.replace(entry, trainable=False) if entry.name in ungraded else entry
        for entry in inventory.parameters
    )
    return dataclasses.replace(inventory, parameters=parameters)


def estimate_row(subject: Subject, row: Row, options: EstimateOptions, profile: Profile | None) -> MemoryEstimate:
    inventory = subject.inventory
    spec, precision = row.spec, row.precision
    training = row.mode == "training"
    opt_parts, grad_parts, param_parts = _shards(options.strategy, options.world_size)
    plan = states.plan_weights(
        inventory, spec, precision, keep_unquantized=options.keep_unquantized, group_size=options.group_size
    )
    weights = _ceil_div(plan.weight_bytes, param_parts)
    buffers = inventory.buffer_bytes
    batch = subject.batch_size or 1
    kv_cache = _kv_cache_bytes(subject, row, options.context, batch)
    weight_bits = 32 if (training and precision == "amp") else spec.bits
    gathered = 0
    if param_parts > 1:
        # The block in use and the one prefetched are unsharded; in training their gradients are too.
        grad_bits = (32 if precision == "amp" else spec.bits) if training else 0
        gathered = inventory.largest_unit_parameters * (2 * weight_bits + grad_bits) // 8
    if not training:
        activations = profile.peak_activations if profile else None
        total = weights + buffers + kv_cache + gathered + (profile.peak() if profile else 0)
        return MemoryEstimate(
            dtype=spec.name,
            mode=Mode.inference,
            optimizer=None,
            precision=precision,
            sharding=Sharding(options.strategy, options.world_size),
            batch_size=subject.batch_size,
            bytes=MemoryBytes(
                weights, 0, 0, 0, activations, total, buffers, kv_cache, plan.quantization_overhead, 0, gathered
            ),
            seq_len=subject.seq_len,
            context=options.context if kv_cache else None,
            checkpointing=False,
            peak_phase="forward",
        )
    stepped = graded(inventory, profile, options.strategy)
    full_gradients = states.gradient_bytes(stepped, spec, precision)
    gradients = _ceil_div(full_gradients, grad_parts)
    # DDP copies gradients into communication buckets of the same size (unless gradient_as_bucket_view), one
    # bucket slot for every parameter that requires a gradient.
    ddp_buckets = states.gradient_bytes(inventory, spec, precision) if options.strategy == "ddp" else 0
    optimizer_states = _ceil_div(states.optimizer_state_bytes(stepped, options.optimizer, spec, precision), opt_parts)
    master = _ceil_div(states.master_weight_bytes(inventory, precision), opt_parts)
    transient = _ceil_div(
        states.optimizer_step_transient(stepped, options.optimizer, spec, precision, options.impl),
        opt_parts,
    )
    # Steady state: optimizer states (and master weights) live through the whole step; gradients are set to
    # None before the forward pass and accumulate during backward.
    resident = weights + buffers + optimizer_states + master + ddp_buckets
    forward_backward = resident + gathered + (profile.peak(1 / grad_parts) if profile else gradients)
    if options.grad_accum > 1:
        # From the second micro-batch on, the forward and backward pass run beside the gradients accumulated so
        # far; each new gradient is added into them and freed, so the gradients stay at their full size.
        activations = profile.peak_activations if profile else 0
        forward_backward = max(forward_backward, resident + gathered + gradients + activations)
    optimizer_step = resident + gradients + transient + (profile.retained_bytes if profile else 0)
    total = max(forward_backward, optimizer_step)
    return MemoryEstimate(
        dtype=spec.name,
        mode=Mode.training,
        optimizer=options.optimizer,
        precision=precision,
        sharding=Sharding(options.strategy, options.world_size),
        batch_size=subject.batch_size,
        bytes=MemoryBytes(
            weights,
            gradients + ddp_buckets,
            optimizer_states,
            master,
            profile.peak_activations if profile else None,
            total,
            buffers,
            0,
            plan.quantization_overhead,
            transient,
            gathered,
        ),
        seq_len=subject.seq_len,
        context=None,
        checkpointing=options.checkpointing,
        peak_phase="forward-backward" if forward_backward >= optimizer_step else "optimizer-step",
        optimizer_impl=options.impl,
        grad_accum=options.grad_accum,
    )


def validate(subject: Subject, options: EstimateOptions) -> None:
    if options.strategy == "none" and options.world_size != 1:
        raise ParameterError("{world_size} needs a {strategy} (ddp, zero1, zero2, zero3 or fsdp)")
    if options.world_size < 1:
        raise ParameterError(f"{{world_size}} must be at least 1, not {options.world_size}")
    if options.grad_accum < 1:
        raise ParameterError(f"{{grad_accum}} must be at least 1, not {options.grad_accum}")
    if options.group_size < 1:
        raise ParameterError(f"{{group_size}} must be at least 1, not {options.group_size}")
    if options.context is not None and subject.decoder is None:
        raise ParameterError(
            "{context} needs a decoder model whose config gives num_hidden_layers, num_attention_heads and "
            "hidden_size (a config.json, or a module with such a .config)"
        )


def estimate_subject(
    subject: Subject, options: EstimateOptions, progress: ProgressCallback = no_progress
) -> MemoryReport:
    """Every requested configuration's per-device bytes; nothing is allocated for real (``estimate_memory`` adds
    reading the input, ``fit`` and ``measure``)."""
    return estimate_with_traces(subject, options, progress)[0]


def frozen_model_options(subject: Subject, options: EstimateOptions) -> tuple[EstimateOptions, str | None]:
    """A model none of whose parameters requires grad (frozen whole) has no training step: by default its
    inference alone is estimated (and the note returned says why); ``--mode training`` asked for is an input error
    that says so. Any other model: the options as they are, and no note."""
    if subject.inventory.trainable_count or subject.inventory.parameter_count == 0:
        return options, None
    why = (
        f"the model has no trainable parameter (requires_grad is False on all {subject.inventory.parameter_count:,}), "
        "so a training step has nothing to update"
    )
    if Mode.training in options.modes:
        raise InputError(f"cannot estimate training: {why}; estimate its inference with --mode inference")
    if options.modes == (Mode.inference,):
        return options, None
    return dataclasses.replace(options, modes=(Mode.inference,)), f"training: {why}"


def estimate_with_traces(
    subject: Subject, options: EstimateOptions, progress: ProgressCallback = no_progress
) -> tuple[MemoryReport, TraceCache]:
    """``estimate_subject``, and the traces it took (``--fit`` starts its search from them)."""
    validate(subject, options)
    options, frozen = frozen_model_options(subject, options)
    rows, skipped = plan_rows(options)
    if frozen is not None:
        skipped = [frozen, *skipped]  # planned for inference alone: no training row was skipped besides
    attribute = options.by_module is not None or options.step_timeline
    profiles = TraceCache(subject, options.checkpointing, progress, total=len(rows), attribute=attribute)
    estimates = tuple(estimate_row(subject, row, options, profiles.get(row)) for row in rows)
    progress(len(rows), len(rows), "done")
    info = subject.model_info()
    if profiles.notes():
        info = dataclasses.replace(info, notes=(*info.notes, *profiles.notes()))
    for note in (profiles.extrapolation_note(), profiles.ungraded_note(options.strategy)):
        if note is not None:
            info = dataclasses.replace(info, notes=(*info.notes, note))
    return MemoryReport(info, estimates, None, tuple(skipped)), profiles
