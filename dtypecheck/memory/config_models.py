"""Building a model from a ``config.json`` on the meta device: dtypecheck's own decoder, or transformers'."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtypecheck.errors import InputError
from dtypecheck.memory.inventory import inventory_of_module
from dtypecheck.memory.subject import DecoderShape, Subject

if TYPE_CHECKING:
    import torch

    from dtypecheck.memory.tracing import Inputs, Traceable

Builder = Callable[[int | None], "torch.nn.Module"]
"""Builds the model, with ``n`` blocks instead of the config's when given."""


def _mini_builder(path: Path, data: dict[str, Any]) -> Builder:
    import dataclasses

    from dtypecheck.memory.decoder import DecoderConfig, MiniDecoder

    config = DecoderConfig.from_dict(data, str(path))

    def build(layers: int | None) -> torch.nn.Module:
        return MiniDecoder(config if layers is None else dataclasses.replace(config, num_hidden_layers=layers))

    return build


def _hf_builder(path: Path) -> tuple[Builder, bool, bool, str, int | None]:
    """(build, is_decoder, has_loss, architecture, blocks) from transformers' Auto classes; nothing is downloaded.

    Encoders (BERT and the like) are built with their masked-LM head, decoders with their causal-LM head, so that
    the model computes its own loss from ``labels``; anything else as the bare model."""
    import transformers

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # chatter would interleave with the table
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (ValueError, OSError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: transformers cannot read this config ({exc})") from exc
    kind = type(config)
    masked = kind in transformers.AutoModelForMaskedLM._model_mapping and not getattr(config, "is_decoder", False)
    causal = not masked and kind in transformers.AutoModelForCausalLM._model_mapping
    auto: Any
    if masked:
        auto = transformers.AutoModelForMaskedLM
    elif causal:
        auto = transformers.AutoModelForCausalLM
    else:
        auto = transformers.AutoModel
    blocks = getattr(config, "num_hidden_layers", None)

    def build(layers: int | None) -> torch.nn.Module:
        chosen = config
        if layers is not None:
            chosen = copy.deepcopy(config)
            chosen.num_hidden_layers = layers
        model: torch.nn.Module = auto.from_config(chosen)
        return model

    architecture = str(getattr(config, "model_type", kind.__name__))
    return build, causal, causal or masked, architecture, blocks if isinstance(blocks, int) else None


@dataclass(frozen=True)
class _Choice:
    build: Builder
    decoder: bool
    """A causal LM: its inputs get ``use_cache=False`` and its inference a KV cache."""
    has_loss: bool
    """Computes its own loss from ``labels``."""
    architecture: str
    hf: bool
    blocks: int | None
    notes: tuple[str, ...] = ()


def _choose_builder(path: Path, data: dict[str, Any]) -> _Choice:
    from dtypecheck.memory.decoder import LLAMA_LIKE, MINI_MODEL_TYPE

    model_type = data.get("model_type")
    blocks = data.get("num_hidden_layers")
    if model_type == MINI_MODEL_TYPE:
        return _Choice(_mini_builder(path, data), True, True, MINI_MODEL_TYPE, False, blocks)
    try:
        import transformers  # noqa: F401
    except ImportError:
        if model_type not in LLAMA_LIKE:
            raise InputError(
                f"{path}: a {model_type or 'Hugging Face'!r} config needs transformers (pip install 'dtypecheck[hf]')"
            ) from None
        note = "transformers is not installed: built as dtypecheck's Llama-style decoder"
        return _Choice(_mini_builder(path, data), True, True, str(model_type), False, blocks, (note,))
    build, causal, has_loss, architecture, blocks = _hf_builder(path)
    return _Choice(build, causal, has_loss, architecture, True, blocks)


def build_from_config(path: Path, data: dict[str, Any], *, batch_size: int, seq_len: int) -> Subject:
    import torch

    from dtypecheck.memory.fakes import fakify_module, new_fake_mode
    from dtypecheck.memory.tracing import Traceable

    choice = _choose_builder(path, data)
    build = choice.build

    def build_on_meta(layers: int | None) -> torch.nn.Module:
        try:
            with torch.device("meta"):
                return build(layers)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            raise InputError(f"{path}: cannot build a model from this config ({type(exc).__name__}: {exc})") from exc

    def inputs(ids: torch.Tensor, train: bool) -> Inputs:
        kwargs: dict[str, Any] = {"input_ids": ids}
        if choice.has_loss and train:
            kwargs["labels"] = ids
        if choice.hf and choice.decoder:
            kwargs["use_cache"] = False  # the KV cache is counted for --context tokens, not for the pass
        return (), kwargs

    def traceable(module: torch.nn.Module, layers: int | None) -> Traceable:
        mode = new_fake_mode()
        fakify_module(module, mode)

        def make_fake_inputs() -> Inputs:
            return inputs(torch.zeros((batch_size, seq_len), dtype=torch.long), module.training)

        return Traceable(mode, module, make_fake_inputs, batch_size, layers=layers, with_layers=shallow)

    def shallow(layers: int) -> Traceable:
        return traceable(build_on_meta(layers), layers)

    module = build_on_meta(None)
    inventory = inventory_of_module(module)
    vocab = int(data.get("vocab_size") or 2)

    def real() -> tuple[torch.nn.Module, Callable[[], Inputs]]:
        real_module = build(None)
        return real_module, lambda: inputs(torch.randint(0, vocab, (batch_size, seq_len)), real_module.training)

    return Subject(
        source=str(path),
        kind="config",
        architecture=choice.architecture,
        inventory=inventory,
        parameter_bytes=sum(p.nbytes for p in inventory.parameters),
        traceable=traceable(module, choice.blocks if isinstance(choice.blocks, int) else None),
        decoder=DecoderShape.from_config(data) if choice.decoder else None,
        batch_size=batch_size,
        seq_len=seq_len,
        notes=choice.notes,
        real=real,
    )
