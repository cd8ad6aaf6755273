"""Building a model from a ``config.json`` on the meta device: dtypecheck's own decoder, or transformers'."""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtypecheck.errors import InputError, ParameterError
from dtypecheck.memory.hf_inputs import hf_inputs
from dtypecheck.memory.inventory import inventory_of_module
from dtypecheck.memory.subject import DEFAULT_SEQ_LEN, DecoderShape, SeqLimit, Subject
from dtypecheck.training_step import LossName, StepLoss, step_loss

if TYPE_CHECKING:
    import torch

    from dtypecheck.memory.tracing import Traceable

Builder = Callable[[int | None], "torch.nn.Module"]
"""Builds the model, with ``n`` blocks instead of the config's when given."""


def _mini_builder(path: Path, data: dict[str, Any]) -> Builder:
    import dataclasses

    from dtypecheck.memory.decoder import DecoderConfig, MiniDecoder

    config = DecoderConfig.from_dict(data, str(path))

    def build(layers: int | None) -> torch.nn.Module:
        return MiniDecoder(config if layers is None else dataclasses.replace(config, num_hidden_layers=layers))

    return build


HEADS = ("MaskedLM", "CausalLM", "Seq2SeqLM", "ImageClassification", "SpeechSeq2Seq", "AudioClassification")
"""transformers' task heads tried in order (the sequence-to-sequence ones first for an encoder-decoder): the first
whose mapping has the config's class builds the model (an encoder that is not a decoder is built as a masked LM),
so that it computes its own loss from ``labels``."""


def _hf_builder(path: Path) -> tuple[Builder, str, str, int | None, Any]:
    """(build, head, architecture, blocks, config) from transformers' Auto classes; nothing is downloaded."""
    import transformers

    transformers.logging.set_verbosity_error()  # chatter would interleave with the table
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001  (transformers raises anything on a config it cannot read)
        raise InputError(f"{path}: transformers cannot read this config ({_one_line(exc)})") from None
    head, model_class = _head_and_class(transformers, config)
    blocks = getattr(config, "num_hidden_layers", None)
    # An encoder-decoder of as many decoder layers as encoder layers (BART, T5) is a stack of (encoder layer,
    # decoder layer) blocks: both shrink together, so that a shallow copy is cheap to trace. (Where they differ,
    # only the encoder's are counted as blocks and the decoder stays whole.)
    paired = [
        name
        for name in ("decoder_layers", "num_decoder_layers")
        if name in vars(config) and getattr(config, name) == blocks and name != "num_hidden_layers"
    ]

    # An encoder-decoder whose decoder has as many blocks as its encoder (T5, Whisper, BART) is made shallower in
    # both: each block then pairs an encoder and a decoder layer, and a shallow trace costs a few layers, not the
    # whole decoder.
    paired = [name for name in DECODER_BLOCKS if blocks is not None and getattr(config, name, None) == blocks]

    def build(layers: int | None) -> torch.nn.Module:
        chosen = config
        if layers is not None:
            chosen = copy.deepcopy(config)
            chosen.num_hidden_layers = layers
            for name in paired:
                setattr(chosen, name, layers)
        if model_class is None:
            raise ValueError(f"transformers has no model class for a {type(config).__name__}")
        model: torch.nn.Module = model_class._from_config(chosen)
        return model

    architecture = str(getattr(config, "model_type", type(config).__name__))
    return build, head, architecture, blocks if isinstance(blocks, int) else None, config


def _head_and_class(transformers: Any, config: Any) -> tuple[str, Any]:
    """The task head (``CausalLM``, ``Model``, ``ObjectDetection``...) and the model class to build for ``config``:
    the class its ``architectures`` names; else the first of ``HEADS`` that maps its config class (an
    encoder-decoder's sequence-to-sequence head first, a decoder never as a masked LM); else the bare model; else
    any other task head transformers has for it (a depth estimator, an object detector); else its backbone (a
    detector's or pose model's backbone config: RT-DETR's ResNet, ViTPose's ViT), which has no other class."""
    kind = type(config)
    named = _named_class(transformers, config)
    others = sorted(
        name.removeprefix("AutoModelFor")
        for name in _auto_class_names(transformers)
        if name.startswith("AutoModelFor") and name.removeprefix("AutoModelFor") not in HEADS
    )
    if named is not None:
        # The config's ``architectures`` says which class it is for (BertModel stays BertModel): its head is the
        # Auto mapping that holds that class, else the bare model.
        heads = (*HEADS, *others, "Backbone")
        return next((h for h in heads if _mapped(transformers, h, kind) is named), "Model"), named
    # An encoder-decoder (Whisper, BART) may also map to a decoder-only causal LM: build the whole model.
    encdec = getattr(config, "is_encoder_decoder", False)
    order = sorted(HEADS, key=lambda h: "Seq2Seq" not in h) if encdec else HEADS
    for candidate in (*order, "Model", *others, "Backbone"):
        if candidate == "MaskedLM" and getattr(config, "is_decoder", False):
            continue
        found = _mapped(transformers, candidate, kind)
        if found is not None and _built_from(found, config):
            return candidate, found
        if candidate == "CausalLM" and found is not None:
            # The causal LM mapped is the text model's: the language model users train on the whole config is
            # the image-text one (its LM head counted, which the bare model has not).
            whole = _mapped(transformers, "ImageTextToText", kind)
            if whole is not None and _built_from(whole, config):
                return "ImageTextToText", whole
    return "Model", None


def _built_from(model_class: Any, config: Any) -> bool:
    """Whether ``model_class`` models the whole of ``config``: a composite config (Llama 4's, Qwen3.5's, MusicGen's)
    is mapped to its text model's causal-LM class too, which takes a sub-config (and fails on the whole one, or
    builds the text model alone); the whole model is another head's. A config mapped to another family's class
    (InternLM3 to ``LlamaForCausalLM``) is that class's to build."""
    expected = getattr(model_class, "config_class", None)
    if not isinstance(expected, type) or isinstance(config, expected):
        return True
    return not any(isinstance(value, expected) for value in vars(config).values())  # a sub-config's class


def _auto_class_names(transformers: Any) -> list[str]:
    """The names transformers' Auto classes are defined under: ``modeling_auto``'s (``dir(transformers)`` lists
    the same ones but takes 1.6 s, building its lazy module's whole listing)."""
    auto = getattr(getattr(getattr(transformers, "models", None), "auto", None), "modeling_auto", None)
    return dir(auto if auto is not None else transformers)


DECODER_BLOCKS = ("num_decoder_layers", "decoder_layers")
"""transformers' names for an encoder-decoder's decoder block count, beside ``num_hidden_layers`` (the encoder's)."""


def _mapped(transformers: Any, head: str, kind: type) -> Any:
    """The class transformers' ``AutoModelFor<head>`` (``AutoModel`` for ``Model``, ``AutoBackbone`` for
    ``Backbone``) builds for config class ``kind``, or None; of a mapping to several classes (DeiT's classifier
    with and without its teacher), the first."""
    auto_name = {"Model": "AutoModel", "Backbone": "AutoBackbone"}.get(head, f"AutoModelFor{head}")
    auto = getattr(transformers, auto_name, None)
    mapping = getattr(auto, "_model_mapping", None)
    try:
        found = mapping.get(kind, None) if mapping is not None else None
    except (KeyError, ValueError, AttributeError, ImportError):
        return None
    if isinstance(found, list | tuple):
        found = found[0] if found else None
    return found if isinstance(found, type) and hasattr(found, "_from_config") else None


def _named_class(transformers: Any, config: Any) -> Any:
    """The model class the config's ``architectures`` names, when transformers has it; else None."""
    names = getattr(config, "architectures", None) or []
    found = getattr(transformers, str(names[0]), None) if names else None
    return found if isinstance(found, type) and hasattr(found, "_from_config") else None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@dataclass(frozen=True)
class _Choice:
    build: Builder
    decoder: bool
    """A causal LM: its inference holds a KV cache."""
    head: str
    """transformers' task head (``CausalLM``, ``Seq2SeqLM``...), or ``mini`` for dtypecheck's own decoder."""
    architecture: str
    blocks: int | None
    hf_config: Any = None
    notes: tuple[str, ...] = ()


DIFFUSERS_TEXT_LEN = 77
"""The text encoder's length a diffusers UNet's cross-attention is estimated at by default (CLIP's 77 tokens)."""
DIFFUSERS_INPUTS = {"UNet2DConditionModel": "unet", "UNet2DModel": "unet", "AutoencoderKL": "vae"}
"""The diffusers model classes a ``config.json`` may name (``_class_name``), by the inputs they take."""


def _diffusers_choice(path: Path, data: dict[str, Any]) -> _Choice:
    """A diffusers UNet or VAE built from its ``config.json`` (``ModelClass.from_config``; nothing is downloaded)."""
    name = str(data.get("_class_name", ""))
    if name not in DIFFUSERS_INPUTS:
        known = ", ".join(DIFFUSERS_INPUTS)
        raise InputError(f"{path}: a diffusers {name or 'model'!r} config; estimate-memory builds {known}")
    try:
        import diffusers
    except ImportError:
        raise InputError(
            f"{path}: a diffusers {name} config needs diffusers (pip install 'dtypecheck[diffusers]')"
        ) from None
    diffusers.utils.logging.set_verbosity_error()  # its chatter would interleave with the table
    cls = getattr(diffusers, name)
    config = {k: v for k, v in data.items() if not k.startswith("_")}

    def build(layers: int | None) -> torch.nn.Module:
        module: torch.nn.Module = cls.from_config(config)
        return module

    note = (
        f"diffusers {name}: a training step is noise prediction, MSE of the output against a target of its shape; "
        "the sequence length is the text encoder's (cross-attention) length"
    )
    return _Choice(build, False, f"diffusers-{DIFFUSERS_INPUTS[name]}", name, None, config, notes=(note,))


def _diffusers_inputs(config: dict[str, Any], head: str, batch: int, seq: int, *, real: bool) -> dict[str, Any]:
    """A UNet's ``sample`` (latents of ``sample_size``), a float ``timestep`` per sample (floats, so that the default
    loss is the MSE of noise prediction, not a cross-entropy over integer inputs) and, for a conditioned UNet, the
    text encoder's ``encoder_hidden_states`` of ``seq`` tokens; a VAE's image ``sample``."""
    import torch

    size = config.get("sample_size") or 64
    height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    make = torch.randn if real else torch.zeros
    sample = make((batch, int(config.get("in_channels", 4)), height, width))
    if head == "diffusers-vae":
        return {"sample": sample}
    found: dict[str, Any] = {"sample": sample, "timestep": torch.full((batch,), 500.0)}
    cross = config.get("cross_attention_dim")
    if cross is not None:
        width_of = int(cross[0] if isinstance(cross, list | tuple) else cross)
        found["encoder_hidden_states"] = make((batch, seq, width_of))
    return found


def _choose_builder(path: Path, data: dict[str, Any]) -> _Choice:
    from dtypecheck.memory.decoder import LLAMA_LIKE, MINI_MODEL_TYPE

    model_type = data.get("model_type")
    blocks = data.get("num_hidden_layers")
    if "_diffusers_version" in data or str(data.get("_class_name", "")) in DIFFUSERS_INPUTS:
        return _diffusers_choice(path, data)
    if model_type == MINI_MODEL_TYPE:
        return _Choice(_mini_builder(path, data), True, "mini", MINI_MODEL_TYPE, blocks)
    try:
        import transformers  # noqa: F401
    except ImportError:
        if model_type not in LLAMA_LIKE:
            raise InputError(
                f"{path}: a {model_type or 'Hugging Face'!r} config needs transformers (pip install 'dtypecheck[hf]')"
            ) from None
        note = "transformers is not installed: built as dtypecheck's Llama-style decoder"
        return _Choice(_mini_builder(path, data), True, "mini", str(model_type), blocks, notes=(note,))
    _refuse_remote_code(path, data, sys.modules["transformers"])
    build, head, architecture, blocks, config = _hf_builder(path)
    dropped = keep_every_layer(config)
    notes = (
        (
            f"LayerDrop ({', '.join(dropped)}) counted as keeping every layer: the step that drops none is the "
            "largest, and the draw would make the estimate another at each run",
        )
        if dropped
        else ()
    )
    return _Choice(build, head == "CausalLM", head, architecture, blocks, config, notes=notes)


def keep_every_layer(config: Any) -> list[str]:
    """Set every LayerDrop probability of ``config`` and its sub-configs (``layerdrop``, ``encoder_layerdrop``,
    ``text_config.layerdrop``...) to 0 where it was above; the dotted names of those that were."""
    found: list[str] = []

    def visit(current: Any, prefix: str, seen: set[int]) -> None:
        if id(current) in seen:
            return
        seen.add(id(current))
        for name, value in list(vars(current).items()):
            if name.endswith("layerdrop") and isinstance(value, int | float) and value > 0:
                setattr(current, name, 0.0)
                found.append(f"{prefix}{name} {value:g}")
            elif hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a sub-config
                visit(value, f"{prefix}{name}.", seen)

    visit(config, "", set())
    return found


def build_from_config(path: Path, data: dict[str, Any], *, batch_size: int, seq_len: int, loss: StepLoss) -> Subject:
    import torch

    from dtypecheck.memory.fakes import fakify_module, new_fake_mode, on_meta_without_init
    from dtypecheck.memory.tracing import Traceable

    choice = _choose_builder(path, data)
    build = choice.build
    own_loss = loss.name == "model"

    def build_on_meta(layers: int | None) -> torch.nn.Module:
        try:
            with on_meta_without_init():
                return build(layers)
        except Exception as exc:  # noqa: BLE001  (whatever a model class raises on a config it cannot build)
            raise InputError(f"{path}: cannot build a model from this config ({_one_line(exc)})") from None

    def inputs(module: torch.nn.Module, batch: int, seq: int, *, real: bool) -> dict[str, Any]:
        if choice.head == "mini":
            ids = torch.randint(0, vocab, (batch, seq)) if real else torch.zeros((batch, seq), dtype=torch.long)
            return {"input_ids": ids, "labels": ids} if (own_loss and module.training) else {"input_ids": ids}
        if choice.head.startswith("diffusers-"):
            return _diffusers_inputs(choice.hf_config, choice.head, batch, seq, real=real)
        return hf_inputs(
            module, choice.hf_config, choice.head, batch, seq, train=module.training, labels=own_loss, real=real
        )

    def traceable(module: torch.nn.Module, layers: int | None) -> Traceable:
        mode = new_fake_mode()
        fake: list[bool] = []

        def prepare() -> None:  # once, also for reshaped copies sharing the module
            if not fake:
                fakify_module(module, mode)
                fake.append(True)

        def make_fake_inputs(batch: int | None, seq: int | None) -> Any:
            return inputs(module, batch or batch_size, seq or seq_len, real=False)

        return Traceable(
            mode,
            module,
            make_fake_inputs,
            batch_size,
            seq_len,
            loss=loss,
            layers=layers,
            with_layers=shallow,
            prepare=prepare,
        )

    def shallow(layers: int) -> Traceable:
        return traceable(build_on_meta(layers), layers)

    module = build_on_meta(None)
    inventory = inventory_of_module(module)
    vocab = int(data.get("vocab_size") or 2)

    def real() -> tuple[torch.nn.Module, Callable[[], Any]]:
        real_module = build(None)
        return real_module, lambda: inputs(real_module, batch_size, seq_len, real=True)

    return Subject(
        source=str(path),
        kind="config",
        architecture=choice.architecture,
        model_class=type(module).__name__,
        inventory=inventory,
        parameter_bytes=sum(p.nbytes for p in inventory.parameters),
        traceable=traceable(module, choice.blocks if isinstance(choice.blocks, int) else None),
        decoder=DecoderShape.from_config(data) if choice.decoder else None,
        batch_size=batch_size,
        seq_len=seq_len,
        notes=choice.notes,
        real=real,
        loss=loss,
    )


MAX_LAYERS = 10_000
"""Most blocks a config may ask for: the deepest real models have a few hundred, and building a billion (even on
the meta device) takes minutes and gigabytes."""
LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "num_decoder_layers", "encoder_layers", "decoder_layers")


def read_hf_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a UTF-8 text file") from exc
    except ValueError as exc:  # an integer of over 4300 digits (Python's int_max_str_digits)
        raise InputError(f"{path}: not a config ({_one_line(exc)})") from None
    except RecursionError:
        raise InputError(f"{path}: not a config (JSON nested too deeply to read)") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a config must be a JSON object")
    _check_layers(path, data)
    return data


def _refuse_remote_code(path: Path, data: dict[str, Any], transformers: Any) -> None:
    """A config whose ``auto_map`` names code shipped with the model, for a ``model_type`` transformers does not
    have itself, can only be built by importing that code (transformers would ask whether to run it, or run it
    with ``trust_remote_code``): refused. With a type transformers has (a model since merged into it), its own
    class is built, as ``trust_remote_code=False`` does."""
    if "auto_map" not in data:
        return
    known = getattr(getattr(transformers, "models", None), "auto", None)
    mapping = getattr(getattr(known, "configuration_auto", None), "CONFIG_MAPPING", {})
    if data.get("model_type") in mapping:
        return
    named = ", ".join(sorted({str(v) for v in _flat(data["auto_map"])})[:3])
    raise InputError(
        f"{path}: its auto_map names code shipped with the model ({named}), which transformers would import; "
        "estimate-memory never runs a model's own code: build it in your own file.py:factory instead"
    )


def _flat(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _flat(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]


def _check_layers(path: Path, data: dict[str, Any]) -> None:
    """Refuse a layer count no model has (``num_hidden_layers: 1e9``), here or in a nested text/vision config."""
    for key in LAYER_KEYS:
        for config in (data, *(v for v in data.values() if isinstance(v, dict))):
            value = config.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not (isinstance(value, int) or value.is_integer()) or not 0 <= value <= MAX_LAYERS:
                raise InputError(f"{path}: {key} {value!r} is not a layer count (0 to {MAX_LAYERS})")


def open_hf_config(
    path: Path, *, batch_size: int | None = None, seq_len: int | None = None, loss: LossName | str | None = None
) -> Subject:
    """A model built from a Hugging Face ``config.json`` (not ``dtypecheck.config.load_config``, which reads
    ``[tool.dtypecheck]``)."""
    data = read_hf_config(path)
    limit = SeqLimit.from_config(data)
    notes: tuple[str, ...] = ()
    if seq_len is not None and limit is not None and seq_len > limit.tokens:
        raise ParameterError(f"{{seq_len}} {seq_len:,} is beyond this model's {limit.name} ({limit.tokens:,})")
    if seq_len is None and "_diffusers_version" in data:
        seq_len = DIFFUSERS_TEXT_LEN
        notes = (f"default text length {DIFFUSERS_TEXT_LEN} (CLIP's) for the cross-attention; --seq-len to change",)
    if seq_len is None:
        seq_len = DEFAULT_SEQ_LEN
        if limit is not None and limit.tokens < seq_len:
            seq_len = limit.tokens
            notes = (f"default sequence length {DEFAULT_SEQ_LEN} capped at the model's {limit.name} ({seq_len})",)
    subject = build_from_config(
        path, data, batch_size=batch_size or 1, seq_len=seq_len, loss=step_loss(None, loss, None)
    )
    return dataclasses.replace(subject, seq_limit=limit, notes=(*notes, *subject.notes))
