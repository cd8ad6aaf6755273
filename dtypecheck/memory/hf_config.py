"""What the input builders read of a transformers config, and of its model type's feature extractor: sizes (from
the config or its towers' sub-configs), the image token, a vision tower's merge, the extractor that makes its audio
and the shape it makes. The ground floor of ``hf_inputs``, ``family_inputs`` and ``tower_inputs``."""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any

SUB_CONFIGS = (
    "vision_config",
    "audio_config",
    "video_config",
    "encoder_config",
    "text_config",
    "encoder",
    "backbone_config",
)
"""Where a config keeps the configs of its towers."""


def _sources(config: Any) -> list[Any]:
    """The config, its sub-configs, then theirs and those of the VLM a retriever wraps (T5Gemma 2's encoder's
    vision tower, ColModernVBERT's VLM's; the wrapped config's own top-level values, such as a default vocabulary
    its text config replaces, are not read)."""
    subs = [s for s in (getattr(config, name, None) for name in SUB_CONFIGS) if s is not None]
    holders = [*subs, getattr(config, "vlm_config", None)]
    found = (getattr(sub, name, None) for sub in holders if sub is not None for name in SUB_CONFIGS)
    deeper = [s for s in found if s is not None]
    return [config, *subs, *deeper]


def size_of(config: Any, name: str, default: int) -> int:
    """A size from the config or its vision/audio/text sub-configs (the first of a pair)."""
    return sizes_of(config, name, (default,))[0]


def sizes_of(config: Any, name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """A size (or a pair such as ``image_size`` (height, width)) from the config or its sub-configs."""
    for source in _sources(config):
        value = getattr(source, name, None)
        if value is None and name == "image_size":
            value = _timm_image_size(source)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and value > 0:
            return (value,)
        if isinstance(value, list | tuple) and value and all(isinstance(v, int) and v > 0 for v in value):
            return tuple(int(v) for v in value)
        if isinstance(value, dict):  # {"height": 224, "width": 224}
            pair = tuple(value.get(k) for k in ("height", "width"))
            if all(isinstance(v, int) and v > 0 for v in pair):
                return tuple(int(v) for v in pair)  # type: ignore[arg-type]
    return default


def _timm_image_size(config: Any) -> tuple[int, ...] | None:
    """The image side of a tower that transformers' ``TimmWrapper`` builds with timm (its config names timm's
    architecture and no ``image_size``): the ``img_size`` its ``model_args`` give, else the input size of the
    architecture's default pretrained configuration in timm's registry (a ViT's patch grid is fixed at it: PE's
    ``vit_pe_core_large_patch14_336`` takes only 336-pixel images). None for any other config, or without timm."""
    architecture = getattr(config, "architecture", None)
    if getattr(config, "model_type", None) != "timm_wrapper" or not isinstance(architecture, str):
        return None
    arguments = getattr(config, "model_args", None)
    given = arguments.get("img_size") if isinstance(arguments, dict) else None
    if isinstance(given, int) or (isinstance(given, list | tuple) and len(given) == 2):
        return (given,) if isinstance(given, int) else tuple(given)
    try:
        import timm

        size = timm.models.get_pretrained_cfg(architecture).input_size  # (channels, height, width)
    except Exception:  # noqa: BLE001  (timm missing or too old, or an architecture its registry lacks)
        return None
    return tuple(int(v) for v in size[1:]) if isinstance(size, tuple | list) and len(size) == 3 else None


@functools.cache
def _feature_shape(
    model_type: str, samples: int, bins: int | None, fused: bool | None = None
) -> tuple[str, tuple[int, ...]] | None:
    """(input name, shape per sample) that ``model_type``'s feature extractor makes of ``samples`` of silence,
    with its feature size set to the config's ``bins`` (and its truncation to the config's ``enable_fusion``,
    CLAP's: four stacked spectrograms fused, else one); None when it has none that runs here."""
    import numpy as np
    import transformers
    from transformers.models.auto import feature_extraction_auto

    names: dict[str, str] = getattr(feature_extraction_auto, "FEATURE_EXTRACTOR_MAPPING_NAMES")  # noqa: B009
    name = names.get(model_type)
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is None:
        return None
    try:
        kwargs: dict[str, Any] = {}
        taken = inspect.signature(cls.__init__).parameters
        if bins is not None and "feature_size" in taken:
            kwargs["feature_size"] = bins
        if fused is not None and "truncation" in taken:
            kwargs["truncation"] = "fusion" if fused else "rand_trunc"
        extractor = cls(**kwargs)
        rate = int(getattr(extractor, "sampling_rate", 16000))
    except Exception:  # noqa: BLE001  (an extractor that needs files or packages this machine lacks)
        return None
    made = None
    # One clip, then a batch of one (Gemma 4's extractor takes only a batch); as numpy arrays, else as torch
    # tensors (VibeVoice's extractor returns only those).
    clips = (np.zeros(samples, dtype=np.float32), [np.zeros(samples, dtype=np.float32)])
    for audio, tensors in ((clip, kind) for kind in ("np", "pt") for clip in clips):
        with contextlib.suppress(Exception):
            made = extractor(audio, sampling_rate=rate, return_tensors=tensors)
            break
    if made is None:
        return None
    main = getattr(extractor, "model_input_names", None) or ["input_features"]
    for key in (main[0], "input_features", "input_values"):
        value = made.get(key) if hasattr(made, "get") else None
        if value is not None and getattr(value, "ndim", 0) >= 2:
            return key, tuple(int(v) for v in value.shape[1:])
    return None


def _extractor_type(config_class: type) -> str:
    """The model type whose feature extractor makes ``config_class``'s audio: its own, else (an audio tower on its
    own: Gemma 4's, Nemotron's) that of the nearest model whose config holds it as a sub-config."""
    from transformers.models.auto import feature_extraction_auto

    names: dict[str, str] = getattr(feature_extraction_auto, "FEATURE_EXTRACTOR_MAPPING_NAMES")  # noqa: B009
    own = str(getattr(config_class, "model_type", ""))
    if own in names:
        return own
    # A model's half whose config derives from the model's (VibeVoice's tokenizer's encoder and decoder).
    for base in config_class.__mro__[1:]:
        inherited = str(getattr(base, "model_type", "") or "")
        if inherited in names:
            return inherited
    # The tower's model, and the speech model holding that (Nemotron 3.5's).
    return held_by(config_class, tuple(names), depth=3) or own


_HELD_BY: dict[tuple[type, tuple[str, ...], int], str] = {}
"""``held_by``'s answers."""


def held_by(config_class: type, wanted: tuple[str, ...], *, depth: int) -> str:
    """The nearest of the ``wanted`` model types whose config holds ``config_class`` as a sub-config, directly or
    through up to ``depth`` levels of holders (the first in transformers' mapping at the nearest level), or "".
    Reading every config class's sub-configs imports them all: a few seconds, once per tower (remembered)."""
    key = (config_class, wanted, depth)
    if key not in _HELD_BY:
        _HELD_BY[key] = _nearest_holder(config_class, set(wanted), depth)
    return _HELD_BY[key]


def _nearest_holder(config_class: type, wanted_types: set[str], depth: int) -> str:
    from transformers import CONFIG_MAPPING

    held, seen = [config_class], {config_class}
    for _depth in range(depth):
        holders = [
            (name, holder)
            for name, holder in CONFIG_MAPPING.items()
            if holder not in seen and any(sub in held for sub in _sub_configs(holder))
        ]
        found = next((str(name) for name, _ in holders if name in wanted_types), None)
        if found is not None or not holders:
            return found or ""
        held = [holder for _, holder in holders]
        seen.update(held)
    return ""


def _sub_configs(config_class: type) -> list[type]:
    subs = getattr(config_class, "sub_configs", None)
    return list(subs.values()) if isinstance(subs, dict) else []


def _token_id(config: Any, *names: str) -> int | None:
    """The first of ``names`` the config (its text config, or the VLM config a retriever wraps: ColPali's) sets."""
    wrapped = getattr(config, "vlm_config", None)
    for source in (config, getattr(config, "text_config", None), wrapped):
        for name in names:
            value = getattr(source, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
    return None


def mel_bins(config: Any) -> int:
    """The spectrogram bins a speech config names, its own or its speech tower's (Nemotron 3.5's ``asr_config``);
    0 where it names none."""
    return size_of(config, "num_mel_bins", 0) or size_of(getattr(config, "asr_config", None), "num_mel_bins", 0)


def merge_sizes(config: Any, batch: int) -> Any:
    """Each image's merge, as a Qwen-VL-style processor gives it beside the grid (VideoLLaMA3's ``merge_sizes`` of
    its tower, ``image_merge_sizes`` of its model): the vision config's merge, ``batch`` times. Factory-made: the
    tower reads the values."""
    import torch

    vision = getattr(config, "vision_config", None) or config
    return torch.full((batch,), _merge_size(vision), dtype=torch.long)


def _merge_size(vision: Any) -> int:
    """How many patches a side a Qwen-VL-style tower merges into one image token (1 where its config names none:
    VideoLLaMA3's, whose processor merges none of an image's)."""
    # MuseSpark's tower names it ``merge_size``, Kimi-K2.5's ``merge_kernel_size``.
    return (
        size_of(vision, "spatial_merge_size", 0)
        or size_of(vision, "merge_size", 0)
        or size_of(vision, "merge_kernel_size", 1)
    )
