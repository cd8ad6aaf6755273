"""A model's audio and its image placeholders: the audio its feature extractor makes of about ``seq`` frames, and
as many image tokens as its vision tower makes features, counted outside the trace. Used by ``hf_inputs`` and by
``tower_inputs`` (a speech encoder-decoder's encoder, a VLM's tile mask)."""

from __future__ import annotations

import contextlib
import inspect
import math
from typing import TYPE_CHECKING, Any

from dtypecheck.memory.family_inputs import chunks_padded, frames_padded
from dtypecheck.memory.hf_config import _extractor_type, _feature_shape, _token_id, mel_bins, size_of

if TYPE_CHECKING:
    import torch


def _audio(
    kwargs: dict[str, Any],
    model: torch.nn.Module,
    config: Any,
    main: str,
    size: tuple[int, int],
    make: Any,
    accepted: set[str],
) -> None:
    """Audio input: the feature extractor's own shape of about ``seq`` frames, else (bins, 2 x source positions)
    spectrogram features or ``seq`` strides of raw samples; a W2v-BERT encoder's stacked filter banks beside
    them where the extractor makes none. ``size`` is (batch, seq)."""
    batch, seq = size
    # Raw samples per frame: the conv feature encoder's total stride, else 20 ms at 16 kHz (wav2vec2's 320), so
    # that a first convolution of a long kernel (Moonshine's 127) has samples enough.
    stride = math.prod(getattr(config, "conv_stride", None) or (320,))
    hop = 160  # 10 ms at 16 kHz, the common spectrogram hop
    samples = seq * (stride if main == "input_values" else hop)
    # A speech model's own audio tower keeps its bins (Nemotron 3.5's ``asr_config``).
    bins = mel_bins(config) or None
    model_type = _extractor_type(type(config))
    from torch.utils._python_dispatch import _disable_current_modes

    # The extractor's own torch ops (Whisper's STFT) are not the model's: run it outside the fake mode and the
    # trace, which would count its spectrogram as activations of the first pass.
    with _disable_current_modes():
        fused = getattr(getattr(config, "audio_config", None), "enable_fusion", None)
        found = _feature_shape(model_type, samples, bins, fused if isinstance(fused, bool) else None)
    positions = size_of(config, "max_source_positions", 0)
    if found is not None and len(found[1]) == 2 and found[1][0] == bins and positions:
        # (bins, frames), as Whisper's encoder takes exactly 2 frames per source position: the config's own
        # window, not the extractor's default 30 s
        found = (found[0], (found[1][0], 2 * positions))
    if found is not None and len(found[1]) == 2 and found[1][-1] == bins:
        found = (found[0], frames_padded(model, config, found[1]))
    elif found is not None and len(found[1]) == 2 and found[1][0] == bins:
        found = (found[0], chunks_padded(config, found[1]))
    if found is not None and (found[0] if found[0] in ("input_features", "input_values") else main) not in accepted:
        found = None  # Wav2Vec2-BERT's mapped extractor is Wav2Vec2's, whose raw samples its forward does not take
    semantic = getattr(config, "semantic_model_config", None)  # a codec's semantic tower (NeuCodec's)
    stacked = size_of(config, "feature_projection_input_dim", 0) or size_of(semantic, "feature_projection_input_dim", 0)
    if stacked and "input_features" in accepted and (found is None or found[0] == "input_features"):
        # A W2v-BERT encoder (Wav2Vec2-BERT, NeuCodec's and XCodec2's semantic tower) takes SeamlessM4T's filter
        # banks, two 10 ms frames stacked a row: ``seq`` rows of ``feature_projection_input_dim``, 20 ms each
        # (also where the codec's own extractor runs, with torchaudio installed: it makes the same rows, and no
        # samples beside them).
        _stacked_rows(kwargs, make, (batch, seq, stacked), accepted)
        if "input_values" in accepted:
            # A codec takes the same audio's samples beside them, one mono channel: (batch, 1, samples), as its
            # extractor pads them (``seq`` strides of 320).
            kwargs["input_values"] = make(batch, 1, seq * stride)
        return
    if found is not None:
        name, shape = found
        kwargs[name if name in ("input_features", "input_values") else main] = make(batch, *shape)
    elif main == "input_features" and (stacked_frames := size_of(config, "num_stacked_frames", 0)):
        # A low-frame-rate encoder (Fun-ASR-Nano's) takes each row as that many mel frames stacked, as its
        # extractor makes them: ``seq`` rows of ``num_mel_bins x num_stacked_frames``, (batch, rows, values).
        _stacked_rows(kwargs, make, (batch, seq, (bins or 80) * stacked_frames), accepted)
    elif main == "input_features":
        frames = 2 * size_of(config, "max_source_positions", seq)
        kwargs["input_features"] = make(batch, *chunks_padded(config, (bins or 80, frames)))
    elif channels := size_of(config, "audio_channels", 0):
        # A codec's encoder on its own (Mimi's): (batch, channels, samples), as its model's extractor gives them.
        kwargs["input_values"] = make(batch, channels, seq * stride)
    else:
        kwargs["input_values"] = make(batch, seq * stride)


def _stacked_rows(kwargs: dict[str, Any], make: Any, shape: tuple[int, int, int], accepted: set[str]) -> None:
    """Features of stacked frames, (batch, rows, values), and where the forward takes one, the mask of their rows:
    every row real (the frames are rows here, not columns)."""
    import torch

    kwargs["input_features"] = make(*shape)
    if "input_features_mask" in accepted:
        kwargs["input_features_mask"] = torch.ones(shape[:2], dtype=torch.long)


def _image_tokens(
    kwargs: dict[str, Any],
    model: torch.nn.Module,
    config: Any,
    per_image: int | None,
    names: tuple[str, ...] = ("image_token_id", "image_token_index"),
    *,
    counted_first: bool = False,
) -> None:
    """Put the model's image placeholder tokens (the config's first of ``names``) before the text, as many as its
    vision tower makes features of each image (a VLM checks that they match): ``per_image`` when the grid says,
    else counted by running ``get_image_features`` once per image shape, outside the trace. ``counted_first``:
    counted even where the grid says, and the grid's count kept only where counting fails (HunYuan-VL's tower
    adds a token after each row of merged patches and two around the image)."""
    import torch

    token = _token_id(config, *names)
    if token is None:
        return
    ids = kwargs["input_ids"]
    batch = int(ids.shape[0])
    if per_image is None or counted_first:
        # The model's own, else that of the VLM it wraps (ColPali's ``vlm``).
        owners = (model, *model.children())
        features = next((f for m in owners if (f := getattr(m, "get_image_features", None)) is not None), None)
        if features is None and per_image is None:
            return
        if features is not None:
            cache: dict[tuple[int, ...], int] = model.__dict__.setdefault("_dtypecheck_image_tokens", {})
            key = tuple(kwargs["pixel_values"].shape)
            if key not in cache:
                cache[key] = _count_features(model, features, kwargs) // max(batch, 1)
            per_image = cache[key] or per_image or 0
    if per_image is not None and per_image > 0:
        if token:  # random text ids may hit the placeholder's: they would be counted as images
            ids = ids.masked_fill(ids == token, 0)
        placeholders = torch.full((batch, per_image), token, dtype=ids.dtype)
        kwargs["input_ids"] = torch.cat([placeholders, ids], dim=1)


def _count_features(model: torch.nn.Module, features: Any, kwargs: dict[str, Any]) -> int:
    """How many image feature vectors ``get_image_features`` makes of the batch's images (0 when it fails): on
    fake tensors for a fake model, outside the trace (its ops are not the pass's), with the values the trace knows
    (Pixtral's ``image_sizes.tolist()``)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack
    from torch.utils._pytree import tree_flatten

    from dtypecheck.memory.routing import KnownValuesMode

    params = inspect.signature(features).parameters
    extra = {k: v for k, v in kwargs.items() if k in params and k not in ("pixel_values", "input_ids")}
    fake_mode = getattr(next(model.parameters(), None), "fake_mode", None)
    # The tracer's mode keeps the values its inputs were made of (LiveBytes.shadows).
    modes = reversed(_get_current_dispatch_mode_stack())
    shadows = next((found for m in modes if (found := getattr(m, "shadows", None)) is not None), None)
    known = KnownValuesMode(shadows) if shadows is not None else contextlib.nullcontext()
    if shadows is not None:
        # The images' zeros stand for data, as in the pass: Idefics3 drops the images all of whose pixels are 0.
        shadows.forget_data({"pixel_values": kwargs["pixel_values"], **extra})
    try:
        with _disable_current_modes(), torch.no_grad(), fake_mode or contextlib.nullcontext(), known:
            out = features(pixel_values=kwargs["pixel_values"], **extra)
    except Exception:  # noqa: BLE001  (a tower that needs more inputs than these: the model's own error says so)
        return 0
    found = getattr(out, "pooler_output", None)
    if found is None:
        found = out[0] if isinstance(out, tuple | list) else getattr(out, "last_hidden_state", out)
    tensors = [t for t in tree_flatten(found)[0] if isinstance(t, torch.Tensor)]
    return sum(t.numel() // t.shape[-1] for t in tensors if t.ndim >= 2)
