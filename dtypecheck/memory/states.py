"""Model states in bytes: weights in a target dtype (with quantization overhead), gradients, optimizer states,
master weights, and the transient an optimizer step allocates.

Every formula is per tensor and exact for what the named implementation allocates; the tests check them against
the tensors a real ``torch.optim`` step leaves in ``optimizer.state``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dtypecheck.dtypes import DtypeSpec
from dtypecheck.memory.inventory import Inventory, TensorEntry
from dtypecheck.memory_words import Optimizer, OptimizerImpl, Precision

STEP_TENSOR_BYTES = 4
"""torch keeps Adam's and Adafactor's ``step`` as a float32 scalar tensor per parameter."""
ADAM8BIT_MIN_NUMEL = 4096
"""bitsandbytes keeps 32-bit states for tensors smaller than this (its ``min_8bit_size``)."""
ADAM8BIT_BLOCK = 256
"""bitsandbytes' blockwise quantization: one float32 absmax per block of this many elements per state."""
INT4_GROUP_PARAMS_BYTES = 4
"""An int4 group carries a 16-bit scale and a 16-bit zero point (GPTQ/AWQ/torchao layouts)."""
INT8_CHANNEL_SCALE_BYTES = 4
"""LLM.int8()-style per-output-channel float32 scale."""
FP8_TENSOR_SCALE_BYTES = 4
"""One float32 scale per tensor for float8 weights."""
FLOAT32_BYTES = 4


def is_quantized(spec: DtypeSpec) -> bool:
    """Integer and sub-16-bit float targets are stored quantized: they carry scales and are not trained."""
    return not spec.is_float or spec.bits < 16


def can_train(spec: DtypeSpec) -> bool:
    return spec.is_float and spec.bits >= 16


def _bytes(numel: int, bits: int) -> int:
    return (numel * bits + 7) // 8


def _rows(entry: TensorEntry) -> int:
    return entry.shape[0] if entry.shape else 1


def quantized_weight_bytes(entry: TensorEntry, target: DtypeSpec, group_size: int) -> tuple[int, int]:
    """(storage bytes, scale/zero overhead bytes) of one weight matrix quantized to ``target``."""
    storage = _bytes(entry.numel, target.bits)
    if target.is_float:
        return storage, FP8_TENSOR_SCALE_BYTES
    if target.bits >= 8:
        return storage, _rows(entry) * INT8_CHANNEL_SCALE_BYTES
    rows = _rows(entry)
    columns = entry.numel // rows if rows else 0
    groups = rows * math.ceil(columns / group_size)
    return storage, groups * INT4_GROUP_PARAMS_BYTES


@dataclass(frozen=True)
class WeightPlan:
    """How each parameter is stored for one row."""

    weight_bytes: int
    """Everything the parameters occupy, scales and zero points included."""
    quantization_overhead: int
    """The scales and zero points alone (part of ``weight_bytes``)."""
    largest_weight_bytes: int


def plan_weights(
    inventory: Inventory, target: DtypeSpec, precision: Precision, *, keep_unquantized: bool, group_size: int
) -> WeightPlan:
    total = overhead = largest = 0
    for entry in inventory.parameters:
        if not entry.floating:
            size = entry.nbytes
        elif is_quantized(target):
            # Quantizers convert weight matrices; vectors (biases, norm scales) stay as they are, and so do
            # embeddings and norms when the user keeps them.
            skip = len(entry.shape) < 2 or (keep_unquantized and entry.layer in ("embedding", "norm"))
            if skip:
                size = entry.nbytes
            else:
                storage, extra = quantized_weight_bytes(entry, target, group_size)
                size = storage + extra
                overhead += extra
        elif precision == "amp":
            size = _bytes(entry.numel, 32)
        else:
            size = _bytes(entry.numel, target.bits)
        total += size
        largest = max(largest, size)
    return WeightPlan(total, overhead, largest)


def state_bits(target: DtypeSpec, precision: Precision) -> int:
    """Optimizer states follow the tensor the optimizer updates: the weight itself, or the fp32 master copy."""
    return target.bits if precision == "pure" else 32


def gradient_bytes(inventory: Inventory, target: DtypeSpec, precision: Precision) -> int:
    bits = 32 if precision == "amp" else target.bits
    return sum(_bytes(p.numel, bits) for p in inventory.trainable)


def master_weight_bytes(inventory: Inventory, precision: Precision) -> int:
    return sum(_bytes(p.numel, 32) for p in inventory.trainable) if precision == "master" else 0


def optimizer_state_bytes_of(entry: TensorEntry, optimizer: Optimizer, bits: int) -> int:
    """What one trainable tensor's optimizer state holds after a step."""
    numel = entry.numel
    if optimizer in ("adamw", "adam"):
        return 2 * _bytes(numel, bits) + STEP_TENSOR_BYTES  # exp_avg, exp_avg_sq, step
    if optimizer in ("sgd", "lion"):
        return _bytes(numel, bits)  # momentum_buffer / exp_avg
    if optimizer == "adafactor":
        if len(entry.shape) >= 2:
            factored = numel // entry.shape[-1] + numel // entry.shape[-2]  # row_var, col_var
            return _bytes(factored, bits) + STEP_TENSOR_BYTES
        return _bytes(numel, bits) + STEP_TENSOR_BYTES  # variance
    if optimizer == "adam8bit":
        if numel < ADAM8BIT_MIN_NUMEL:
            return 2 * _bytes(numel, 32)
        blocks = math.ceil(numel / ADAM8BIT_BLOCK)
        return 2 * numel + 2 * blocks * FLOAT32_BYTES  # two uint8 states and their float32 block absmax
    raise AssertionError(f"unknown optimizer {optimizer!r}")


def optimizer_state_bytes(inventory: Inventory, optimizer: Optimizer, target: DtypeSpec, precision: Precision) -> int:
    bits = state_bits(target, precision)
    return sum(optimizer_state_bytes_of(p, optimizer, bits) for p in inventory.trainable)


def optimizer_step_transient(
    inventory: Inventory, optimizer: Optimizer, target: DtypeSpec, precision: Precision, impl: OptimizerImpl
) -> int:
    """Bytes the step allocates beyond the states and frees again.

    The foreach implementations (torch's default on GPUs) build one temporary per tensor for the whole group at
    once, e.g. Adam's ``_foreach_sqrt(exp_avg_sqs)``; the for-loop implementations hold temporaries for one tensor
    at a time (Adam's ``exp_avg_sq.sqrt() / bias_correction`` keeps two alive); fused kernels allocate none.
    """
    trainable = inventory.trainable
    if not trainable or impl == "fused" or optimizer in ("sgd", "adam8bit"):
        transient = 0
    else:
        bits = state_bits(target, precision)
        if impl == "foreach":
            copies = 2 if optimizer == "adafactor" else 1
            transient = copies * sum(_bytes(p.numel, bits) for p in trainable)
        elif optimizer in ("adamw", "adam"):
            # ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)``: the square root and the quotient
            # of one tensor exist at once, while the previous tensor's ``denom`` is still bound to the loop variable.
            sizes = [_bytes(p.numel, bits) for p in trainable]
            transient = max(2 * size + previous for previous, size in zip([0, *sizes], sizes, strict=False))
        else:
            transient = 2 * max(_bytes(p.numel, bits) for p in trainable)
    if precision == "master" and trainable:
        # The low-precision gradient is upcast to float32, one tensor at a time, for the master update.
        transient += max(_bytes(p.numel, 32) for p in trainable)
    return transient
