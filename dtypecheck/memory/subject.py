"""What the estimate is about: the inventory of model states, and (when there is a module) how to trace it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtypecheck.memory.inventory import Inventory
from dtypecheck.memory.report import ModelInfo
from dtypecheck.memory.step import DEFAULT_LOSS, StepLoss

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
            notes=self.notes,
            loss=self.loss.name,
        )
