"""The result of ``estimate-memory``: frozen dataclasses whose fields are the JSON document's keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dtypecheck.display import ShowsAsHtml
from dtypecheck.memory_words import Mode, Strategy


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
    model_class: str | None = None
    """*(extra)* the class built for a config (``BertModel``, ``LlamaForCausalLM``, ``MiniDecoder``), or the
    factory's module class; null for a checkpoint."""
    loss: str = "model"
    """*(extra)* the loss of the traced training step: ``loss_fn`` (the factory's), ``cross-entropy``, ``mse``,
    ``sum``, or ``model`` (the model's own ``loss`` output). Without a loss given, the choice follows the output
    (``training_step.DefaultLoss``) and a note says so."""


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
class Fit:
    """Whether a row fits one device of ``capacity`` bytes, keeping ``reserve`` bytes for the runtime."""

    device: str
    """The device named (``h100-80gb``) or the size given (``80GiB``)."""
    capacity_bytes: int
    reserve_bytes: int
    """Held back for the CUDA context and kernels' workspaces, and for the caching allocator's fragmentation."""
    usable_bytes: int
    """``capacity_bytes - reserve_bytes``: what the step's peak may reach."""
    fits: bool
    """The row's ``total`` at its own batch (and sequence length) is at most ``usable_bytes``."""
    max_batch_size: int | None
    """The largest batch whose peak fits at this sequence length (0: not even one); null when there is no
    forward pass to scale (a checkpoint) or the peak does not grow with the batch."""
    max_seq_len: int | None
    """For a config: the longest sequence whose peak fits at this batch size; else null."""
    search: str
    """How the limits were found: ``linear`` (sizes checked to grow by the same step), ``quadratic``, or
    ``bisection`` (traced at each candidate); ``fixed`` (the model runs at its own batch only) or ``timeout``."""
    max_batch_size_bound: str | None = None
    """Null when ``max_batch_size`` is the answer; else why it is a bound: ``search-limit`` or ``timeout`` (the
    largest found to fit: at least this), ``fixed-batch`` (the model runs at no other batch)."""
    max_seq_len_bound: str | None = None
    """Null when ``max_seq_len`` is the answer; ``search-limit`` or ``timeout`` (at least this), or the config
    field whose limit it reached (``max_position_embeddings``, ``n_positions``, ``max_target_positions``)."""


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
    optimizer_impl: str | None = None
    """*(extra)* the torch optimizer implementation whose step transient is counted (``foreach``, ``for-loop``,
    ``fused``); null for inference."""
    grad_accum: int = 1
    """*(extra)* micro-batches per optimizer step (training); ``batch_size`` is one micro-batch."""
    fit: Fit | None = None
    """*(extra)* with ``--fit``: whether the row fits the device, and the largest batch (and sequence) that does."""


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
class ModuleMemory:
    """One module's share of a row (``--by-module``), its submodules below the depth asked included."""

    module: str
    """Dotted path (``blocks.0``); ``(root)`` for the model's own parameters and ops, ``(outside modules)`` for the
    batch and what the step computes outside the model (the loss)."""
    parameters: int
    weight_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    """Optimizer states and fp32 master weights."""
    activation_bytes: int
    """Activation bytes alive at the step's peak moment that this module's ops created: what it keeps for backward
    there (plus, at the peak op itself, its temporaries)."""


@dataclass(frozen=True)
class PeakMoment:
    """The moment of the forward/backward pass that holds the most activation and gradient bytes."""

    op: str
    module: str | None
    phase: str
    """``forward`` or ``backward``."""
    index: int
    """Which op of the pass (0-based), of ``ops``."""
    ops: int
    activation_bytes: int
    """Activation bytes alive then: the sum of the modules' ``activation_bytes``."""
    gradient_bytes: int
    """Gradient bytes accumulated by then (the whole gradients, before any sharding)."""


@dataclass(frozen=True)
class ModuleBreakdown:
    """A row broken down by module: the sums of the modules' fields equal the row's ``parameters``, ``buffers``,
    ``gradients`` and ``optimizer_states + master_weights`` and the peak's ``activation_bytes`` exactly."""

    dtype: str
    mode: Mode
    precision: str
    depth: int
    modules: tuple[ModuleMemory, ...]
    peak: PeakMoment


@dataclass(frozen=True)
class StepTimeline:
    """A row's bytes over the traced pass, for ``--plot`` (at most ``MAX_POINTS`` moments, each a bucket's
    largest)."""

    dtype: str
    mode: Mode
    precision: str
    resident_bytes: int
    """What is held throughout: weights, buffers, optimizer states, master weights, gathered blocks, KV cache."""
    moments: tuple[tuple[int, int, int], ...]
    """(op index, activation bytes, gradient bytes as held on this device)."""
    ops: int
    backward_from: int | None
    peak_index: int
    optimizer_step_bytes: int | None
    """The optimizer step's peak (training), drawn after the pass."""
    total: int


@dataclass(frozen=True)
class MemoryReport(ShowsAsHtml):
    SCHEMA: ClassVar[str] = "dtypecheck.memory/1"

    model: ModelInfo
    estimates: tuple[MemoryEstimate, ...]
    measured: Measurement | None
    skipped: tuple[str, ...]
    """*(extra)* configurations left out of the default grid, and why (int8 cannot be trained, ...)."""
    measurements: tuple[Measurement, ...] = ()
    """*(extra)* with ``--measure``: one real step of every row that can run here (``measured`` is the first
    training one)."""
    modules: tuple[ModuleBreakdown, ...] = ()
    """*(extra)* with ``--by-module``: each traced row broken down by module."""
    steps: tuple[StepTimeline, ...] = ()
    """*(extra)* with ``--plot``: each traced row's bytes over the step."""
