"""Inputs of a tower that, in its full model, is fed another tower's output or a state rather than text, pixels or
audio: a Q-Former's query embeddings and image features, a drafter's noise and its target model's hidden states,
an acoustic tokenizer's waveform channels and latents. Each is shaped as the docs of the model's forward, and its
full model's code, give it, from the config."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from dtypecheck.memory.hf_config import merge_sizes, size_of
from dtypecheck.memory.hf_media import _audio

if TYPE_CHECKING:
    import torch


def tower_inputs(
    kwargs: dict[str, Any],
    model: torch.nn.Module,
    config: Any,
    accepted: set[str],
    required: set[str],
    *,
    batch: int,
    seq: int,
    make: Any,
) -> None:
    """Add to (or reshape in) ``kwargs`` the inputs a tower of another model takes, where its config says how."""
    _query_former(kwargs, config, required, batch, make)
    _block_drafter(kwargs, config, required, batch, seq, make)
    _acoustic_tokenizer(kwargs, config, required, batch, seq, make)
    _speech_encoder(kwargs, model, config, accepted, batch, seq, make)
    _query_projector(kwargs, model, config, batch, make)
    _windowed_backbone(kwargs, config, batch, make)
    _tile_mask(kwargs, model, config, accepted, batch)
    if "image_grid_thw" in kwargs and "image_merge_sizes" in accepted and "image_merge_sizes" not in kwargs:
        # VideoLLaMA3's model (the same merge its image placeholders were counted with).
        kwargs["image_merge_sizes"] = merge_sizes(config, batch)
    if "inputs_embeds" in required and "inputs_embeds" not in kwargs:
        # A tower fed another's states, whose forward takes no ids (Nemotron 3.5 Transcribe's word-timestamp
        # head, of its speech encoder's frames): ``seq`` of them, ``hidden_size`` wide, as its docs shape them.
        kwargs["inputs_embeds"] = make(batch, seq, size_of(config, "hidden_size", 1))


def _speech_encoder(
    kwargs: dict[str, Any], model: torch.nn.Module, config: Any, accepted: set[str], batch: int, seq: int, make: Any
) -> None:
    """An encoder-decoder that wraps a speech encoder (SpeechEncoderDecoder's) takes its encoder's audio, under the
    name the encoder's main input has (its own main input, the generic ``inputs``, would be given token ids)."""
    encoder, encoder_config = getattr(model, "encoder", None), getattr(config, "encoder", None)
    audio = getattr(encoder, "main_input_name", None)
    if kwargs or audio not in ("input_values", "input_features") or audio not in accepted or encoder_config is None:
        return
    assert encoder is not None  # it named its main input
    _audio(kwargs, encoder, encoder_config, audio, (batch, seq), make, accepted)


def _tile_mask(kwargs: dict[str, Any], model: torch.nn.Module, config: Any, accepted: set[str], batch: int) -> None:
    """A VLM whose image features need the mask of real tiles (GraniteDocling's ``get_image_features`` requires
    ``pixel_attention_mask``, (batch, tiles), where Idefics3's optional mask is of pixels) gets every tile real,
    as its processor marks an unpadded image's, and the text its image's placeholders, counted with it."""
    import inspect

    import torch

    from dtypecheck.memory.hf_media import _count_features, _image_tokens

    features = getattr(model, "get_image_features", None)
    pixels = kwargs.get("pixel_values")
    if features is None or pixels is None or pixels.ndim != 5 or "pixel_attention_mask" in kwargs:
        return
    mask = inspect.signature(features).parameters.get("pixel_attention_mask")
    if "pixel_attention_mask" not in accepted or mask is None or mask.default is not mask.empty:
        return
    kwargs["pixel_attention_mask"] = torch.ones(tuple(pixels.shape[:2]), dtype=torch.bool)
    if "input_ids" in kwargs:
        # (The count without the mask failed: the text has no placeholders yet.)
        _image_tokens(kwargs, model, config, _count_features(model, features, kwargs) // max(batch, 1))


def _windowed_backbone(kwargs: dict[str, Any], config: Any, batch: int, make: Any) -> None:
    """A detector whose ViT backbone splits its patch grid into ``num_windows`` windows a side (RF-DETR's DINOv2)
    takes images whose grid they divide: the next size up from the backbone's ``image_size`` (518 px, 37 patches
    of 14, to 560 px, 40 patches; RF-DETR's checkpoints run at multiples of 56 px)."""
    backbone = getattr(config, "backbone_config", None)
    windows, patch = getattr(backbone, "num_windows", None), getattr(backbone, "patch_size", None)
    pixels = kwargs.get("pixel_values")
    if not isinstance(windows, int) or not isinstance(patch, int) or pixels is None or pixels.ndim != 4:
        return
    sides = [int(v) // patch for v in pixels.shape[-2:]]
    if all(side % windows == 0 for side in sides):
        return
    height, width = (-(-side // windows) * windows * patch for side in sides)
    kwargs["pixel_values"] = make(*pixels.shape[:-2], height, width)
    if "pixel_mask" in kwargs:
        kwargs["pixel_mask"] = kwargs["pixel_mask"].new_ones((int(pixels.shape[0]), height, width))


def _query_projector(kwargs: dict[str, Any], model: torch.nn.Module, config: Any, batch: int, make: Any) -> None:
    """A VLM whose projector maps each image's patch count to a number of queries (Aria's
    ``projector_patch_to_query_dict``, 1225 or 4900 patches) takes only images of those counts: its processor's
    default (``max_image_size`` 980 px, padded square) gives the larger, which the vision config's own
    ``image_size`` (224) does not. The image is made that size, and the text given its queries' placeholders."""
    from dtypecheck.memory.hf_media import _image_tokens

    table = getattr(config, "projector_patch_to_query_dict", None)
    pixels = kwargs.get("pixel_values")
    if not isinstance(table, dict) or not table or pixels is None or pixels.ndim != 4 or "input_ids" not in kwargs:
        return
    patch = size_of(getattr(config, "vision_config", None) or config, "patch_size", 14)
    if (pixels.shape[-2] // patch) * (pixels.shape[-1] // patch) in table:
        return
    patches = max(int(k) for k in table)
    side = math.isqrt(patches) * patch
    kwargs["pixel_values"] = make(batch, int(pixels.shape[1]), side, side)
    # (Counting the features of the first image failed in the projector: the text has no placeholders yet.)
    _image_tokens(kwargs, model, config, int(table[patches]))


def _query_former(kwargs: dict[str, Any], config: Any, required: set[str], batch: int, make: Any) -> None:
    """BLIP-2's Q-Former on its own: its learnt query tokens (``num_query_tokens`` of them) attending to the image
    features of its vision tower (``encoder_hidden_size`` wide, a class token and one per patch), both counts
    from the defaults of the config that holds it, as ``Blip2Model`` feeds them."""
    if "query_embeds" not in required or "query_embeds" in kwargs:
        return
    config_class: type = type(config)
    holder = _holder_defaults(config_class)
    queries = size_of(holder, "num_query_tokens", 32) if holder is not None else 32
    kwargs["query_embeds"] = make(batch, queries, size_of(config, "hidden_size", 1))
    width = size_of(config, "encoder_hidden_size", 0)
    vision = getattr(holder, "vision_config", None)
    if width and vision is not None:
        patches = (size_of(vision, "image_size", 224) // size_of(vision, "patch_size", 14)) ** 2
        kwargs["encoder_hidden_states"] = make(batch, patches + 1, width)


def _block_drafter(kwargs: dict[str, Any], config: Any, required: set[str], batch: int, seq: int, make: Any) -> None:
    """A block-diffusion drafter (MuseGlimmer's assistant): one ``block_size`` block of noise embeddings to
    denoise, beside ``seq`` tokens of its target model's hidden states, those of each ``target_layer_ids`` layer
    side by side, as its forward's docs shape them."""
    if not {"noise_embeds", "context_hidden_states"} <= required:
        return
    hidden = size_of(config, "hidden_size", 1)
    layers = len(getattr(config, "target_layer_ids", None) or (1,))
    kwargs.pop("noise_embeds", None)  # the main input, else filled with token ids
    kwargs["noise_embeds"] = make(batch, size_of(config, "block_size", seq), hidden)
    kwargs["context_hidden_states"] = make(batch, seq, hidden * layers)


def _acoustic_tokenizer(
    kwargs: dict[str, Any], config: Any, required: set[str], batch: int, seq: int, make: Any
) -> None:
    """A convolutional acoustic tokenizer (VibeVoice's): its waveform as its extractor gives it, (batch,
    ``channels``, samples), ``seq`` latent frames of its encoder's total stride; its encoder on its own takes the
    same waveform as ``hidden_states``, and its decoder the latents, (batch, ``hidden_size``, ``seq`` frames), as
    ``decode`` hands them on."""
    channels, down = getattr(config, "channels", None), getattr(config, "downsampling_ratios", None)
    if not isinstance(channels, int) or isinstance(channels, bool) or not down:
        return
    # The halves on their own name their input ``hidden_states`` (their main input's name, ``input_values``, is
    # the whole model's, which the audio rules filled); their configs say which half they are.
    half = getattr(config, "base_config_key", None)
    waveform = make(batch, channels, seq * math.prod(down))
    if "hidden_states" not in required:
        if "input_values" in kwargs:
            kwargs["input_values"] = waveform
        return
    kwargs.pop("input_values", None)
    if half == "encoder_config":
        kwargs["hidden_states"] = waveform
    elif half == "decoder_config":
        kwargs["hidden_states"] = make(batch, size_of(config, "hidden_size", 1), seq)


@functools.cache
def _holder_defaults(config_class: type) -> Any:
    """The default config of the model whose config, in the same module, holds ``config_class`` as a sub-config
    (BLIP-2's of its Q-Former's), or None."""
    import sys

    module = sys.modules.get(config_class.__module__)
    for holder in vars(module).values() if module is not None else ():
        subs = getattr(holder, "sub_configs", None) if isinstance(holder, type) else None
        if isinstance(subs, dict) and config_class in subs.values():
            try:
                return holder()
            except Exception:  # noqa: BLE001  (a config that cannot be made at its defaults)
                continue
    return None
