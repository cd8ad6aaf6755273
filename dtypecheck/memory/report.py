"""The result of ``estimate-memory``: frozen dataclasses whose fields are the JSON document's keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

Mode = Literal["inference", "training"]
MODES: tuple[Mode, ...] = ("inference", "training")
Strategy = Literal["none", "ddp", "zero1", "zero2", "zero3", "fsdp"]
STRATEGIES: tuple[Strategy, ...] = ("none", "ddp", "zero1", "zero2", "zero3", "fsdp")


@dataclass(frozen=True)
class ModelInfo:
    source: str
    parameters: int
    """Distinct parameter elements (a tied weight counts once)."""
    trainable_parameters: int
    buffers: int
    """Buffer elements."""
    buffer_bytes: int
    kind: str
    """*(extra)* ``factory``, ``checkpoint`` or ``config``."""
    architecture: str | None
    """*(extra)* the module's class, or the config's ``model_type``."""
    parameter_bytes: int
    """*(extra)* the parameters as stored in the input."""
    notes: tuple[str, ...]
    """*(extra)* what the estimate could not see, and the assumptions it made."""


@dataclass(frozen=True)
class Sharding:
    strategy: Strategy
    world_size: int


@dataclass(frozen=True)
class MemoryBytes:
    """Bytes per device. ``total`` is the peak of the step, not the sum of the other fields."""

    parameters: int
    """Weights as stored for this row, quantization scales and zero points included."""
    gradients: int
    optimizer_states: int
    master_weights: int
    activations: int | None
    """The most activation bytes alive at once (the batch included); null when no forward pass could be traced."""
    total: int
    buffers: int
    """*(extra)* buffers at their own dtype."""
    kv_cache: int
    """*(extra)* decoder KV cache for ``context`` tokens (inference)."""
    quantization_overhead: int
    """*(extra)* scales and zero points, already part of ``parameters``."""
    optimizer_step_transient: int
    """*(extra)* what the optimizer step allocates and frees again."""
    gathered_parameters: int
    """*(extra)* ZeRO-3/FSDP: the unsharded block being used plus the one prefetched, and its gradients."""


@dataclass(frozen=True)
class MemoryEstimate:
    dtype: str
    mode: Mode
    optimizer: str | None
    """Null for inference."""
    precision: str
    sharding: Sharding
    batch_size: int | None
    bytes: MemoryBytes
    seq_len: int | None
    """*(extra)* tokens per sequence of a config's inputs."""
    context: int | None
    """*(extra)* tokens in the KV cache."""
    checkpointing: bool
    """*(extra)*"""
    peak_phase: str
    """*(extra)* ``forward``, ``forward-backward`` or ``optimizer-step``: where ``total`` is reached."""


@dataclass(frozen=True)
class Measurement:
    device: str
    peak_bytes: int
    error: float
    """(estimate - measured) / measured."""
    estimate_bytes: int
    """*(extra)* the ``total`` of the row that was measured."""
    dtype: str
    """*(extra)* which row was measured: its dtype, mode and precision."""
    mode: Mode
    precision: str
    referee: str
    """*(extra)* ``MemTracker`` on the CPU, ``torch.cuda.max_memory_allocated`` on CUDA."""


@dataclass(frozen=True)
class MemoryReport:
    SCHEMA: ClassVar[str] = "dtypecheck.memory/1"

    model: ModelInfo
    estimates: tuple[MemoryEstimate, ...]
    measured: Measurement | None
    skipped: tuple[str, ...]
    """*(extra)* configurations left out of the default grid, and why (int8 cannot be trained, ...)."""
