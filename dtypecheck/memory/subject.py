"""What the estimate is about, a ``Subject`` (the inventory of model states and, when there is a module, how to
trace it), and reading a ``file.py:factory`` or a checkpoint file or folder into one. A Hugging Face ``config.json``
is read by ``config_models``; ``run.open_subject`` picks the reader."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtypecheck.errors import InputError, ParameterError
from dtypecheck.memory.inventory import Inventory, inventory_of_module, inventory_of_records
from dtypecheck.memory.report import ModelInfo
from dtypecheck.training_step import DEFAULT_LOSS, LossName, StepLoss, step_loss
from dtypecheck.usercode import call_user, load_factory

if TYPE_CHECKING:
    import torch

    from dtypecheck.memory.tracing import Traceable


@dataclass(frozen=True)
class DecoderShape:
    """What sizes a decoder's KV cache."""

    layers: int
    kv_heads: int
    head_dim: int

    def kv_elements(self, context: int) -> int:
        """Keys and values of every layer for ``context`` tokens of one sequence."""
        return 2 * self.layers * self.kv_heads * self.head_dim * context

    @classmethod
    def from_config(cls, config: Any) -> DecoderShape | None:
        """From a config dict or object with Hugging Face's field names; None when it does not say."""

        def get(*names: str) -> Any:
            for name in names:
                value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
                if value is not None:
                    return value
            return None

        layers = get("num_hidden_layers", "n_layer", "num_layers")
        heads = get("num_attention_heads", "n_head")
        hidden = get("hidden_size", "n_embd", "d_model")
        if not all(isinstance(v, int) and v > 0 for v in (layers, heads, hidden)):
            return None
        kv_heads = get("num_key_value_heads") or heads
        head_dim = get("head_dim") or hidden // heads
        return cls(int(layers), int(kv_heads), int(head_dim))


@dataclass(frozen=True)
class SeqLimit:
    """The longest sequence a model takes, and the config field that says so."""

    tokens: int
    name: str

    @classmethod
    def from_config(cls, config: Any) -> SeqLimit | None:
        """From a config dict or object: the decoder's positions of an encoder-decoder (``max_target_positions``),
        else ``max_position_embeddings``, ``n_positions`` or ``n_ctx``; None when it names none."""

        def get(name: str) -> Any:
            return config.get(name) if isinstance(config, dict) else getattr(config, name, None)

        if isinstance(get("n_window"), int) and get("num_mel_bins"):
            # A chunked audio encoder's (Qwen3-ASR's) positions count within one chunk of 2 x n_window mel frames;
            # the audio runs for as many chunks as it has.
            return None
        for name in ("max_target_positions", "max_position_embeddings", "n_positions", "n_ctx"):
            value = get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return cls(value, name)
        return None


RealBuilder = Callable[[], "tuple[torch.nn.Module, Callable[[], Any]]"]


@dataclass
class Subject:
    source: str
    kind: str
    """``factory``, ``checkpoint`` or ``config``."""
    architecture: str | None
    inventory: Inventory
    parameter_bytes: int
    traceable: Traceable | None
    decoder: DecoderShape | None
    batch_size: int | None
    seq_len: int | None
    notes: tuple[str, ...] = ()
    real: RealBuilder | None = None
    """Builds the real module and a maker of real inputs, for ``--measure``."""
    loss: StepLoss = DEFAULT_LOSS
    """The loss the training step takes (traced and measured alike)."""
    user_file: Path | None = None
    """The factory's file: an exception in the model's own code is reported with that file's frames."""
    seq_limit: SeqLimit | None = None
    """For a config: the longest sequence the model takes (``--fit`` searches no further)."""
    model_class: str | None = None
    """The class of the module estimated (for a config, the one built)."""

    def reshaped(self, batch_size: int | None, seq_len: int | None) -> Subject:
        """The same model fed ``batch_size`` x ``seq_len`` inputs (for ``--fit``'s search; not measurable)."""
        traceable = self.traceable.reshaped(batch_size, seq_len) if self.traceable else None
        return dataclasses.replace(self, traceable=traceable, batch_size=batch_size, seq_len=seq_len, real=None)

    def model_info(self) -> ModelInfo:
        inventory = self.inventory
        return ModelInfo(
            source=self.source,
            parameters=inventory.parameter_count,
            trainable_parameters=inventory.trainable_count,
            buffers=inventory.buffer_count,
            buffer_bytes=inventory.buffer_bytes,
            kind=self.kind,
            architecture=self.architecture,
            parameter_bytes=self.parameter_bytes,
            notes=(*self.notes, self.loss.note) if self.loss.note else self.notes,
            loss=self.loss.chosen,
            model_class=self.model_class,
        )


# --- reading the input ---------------------------------------------------------------------------------

DEFAULT_SEQ_LEN = 512
CHECKPOINT_NOTE = (
    "a checkpoint holds no forward pass: activations are not included (give file.py:factory or a config.json)"
)


# --- file.py:factory ---------------------------------------------------------------------------------------


def _first_batch_dim(inputs: Any) -> int | None:
    import torch
    from torch.utils._pytree import tree_flatten

    for value in tree_flatten(inputs)[0]:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def _resize_batch(inputs: Any, old: int | None, new: int | None, *, real: bool) -> Any:
    """Every tensor whose first dimension is the batch gets ``new`` rows (repeating real rows for --measure);
    the others are copied, so that the batch is counted as memory the step holds."""
    import torch
    from torch.utils._pytree import tree_map

    def resize(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if new is None or old is None or value.dim() == 0 or value.shape[0] != old or new == old:
            return value.clone()
        if real:
            reps = -(-new // old)
            return value.repeat(reps, *([1] * (value.dim() - 1)))[:new].clone()
        return torch.empty((new, *value.shape[1:]), dtype=value.dtype, device=value.device)

    return tree_map(resize, inputs)


def open_factory(target: str, *, batch_size: int | None = None, loss: LossName | str | None = None) -> Subject:
    from dtypecheck.memory.fakes import fake_inputs, fakify_module, new_fake_mode
    from dtypecheck.memory.tracing import Traceable

    made = load_factory(target)
    module, inputs = made.model, made.inputs
    chosen = step_loss(made.loss_fn, loss, made.file)
    # The module's own methods (``parameters()``, ``config``) are the user's code: what they raise is theirs.
    inventory = call_user(lambda: inventory_of_module(module), f"{made.file}: the model's parameters()", made.file)
    decoder = call_user(
        lambda: DecoderShape.from_config(getattr(module, "config", None) or {}),
        f"{made.file}: the model's config",
        made.file,
    )
    notes: list[str] = []
    traceable = None
    original_batch = _first_batch_dim(inputs) if inputs is not None else None
    batch = batch_size or original_batch
    if inputs is None:
        if batch_size is not None:
            raise ParameterError("{batch_size} needs example inputs: have the factory return (module, example_inputs)")
        notes.append("the factory gave no example inputs: activations are not included")
    else:
        mode = new_fake_mode()
        call_user(lambda: fakify_module(module, mode), f"{made.file}: the model's parameters()", made.file)
        fake = fake_inputs(mode, inputs)

        def make_inputs(rows: int | None, _seq: int | None) -> Any:
            return _resize_batch(fake, original_batch, rows, real=False)

        traceable = Traceable(mode, module, make_inputs, batch, loss=chosen)

    def real() -> tuple[torch.nn.Module, Callable[[], Any]]:
        again = load_factory(target)
        return again.model, lambda: _resize_batch(again.inputs, original_batch, batch, real=True)

    return Subject(
        source=target,
        kind="factory",
        architecture=type(module).__name__,
        model_class=type(module).__name__,
        inventory=inventory,
        parameter_bytes=sum(p.nbytes for p in inventory.parameters),
        traceable=traceable,
        decoder=decoder,
        batch_size=batch,
        seq_len=None,
        notes=tuple(notes),
        real=real if inputs is not None else None,
        loss=chosen,
        user_file=made.file,
    )


# --- checkpoints -------------------------------------------------------------------------------------------


def load_checkpoint(target: str) -> Subject:
    from dtypecheck.loaders import open_checkpoint

    checkpoint = open_checkpoint(target)
    try:
        inventory: Inventory = inventory_of_records(checkpoint.records())
        fmt = checkpoint.format
    finally:
        checkpoint.close()
    if not inventory.parameters:
        raise InputError(f"{target}: the checkpoint holds no floating-point tensors to estimate")
    return Subject(
        source=target,
        kind="checkpoint",
        architecture=fmt,
        inventory=inventory,
        parameter_bytes=sum(p.nbytes for p in inventory.parameters),
        traceable=None,
        decoder=None,
        batch_size=None,
        seq_len=None,
        notes=(CHECKPOINT_NOTE,),
    )
