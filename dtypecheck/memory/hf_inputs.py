"""The inputs a transformers model built from a ``config.json`` is fed, from its own ``forward`` signature and its
config: token ids, bounding boxes, pixel values at the config's image size, audio features of the shape its
feature extractor makes, decoder ids of an encoder-decoder, and labels its head computes its own loss from."""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, Any

from dtypecheck.memory.family_inputs import (
    codebook_decoder_ids,
    codebook_streams,
    cross_attended_images,
    labels_go_to_a_language_model,
    lagged_series,
    own_image_side,
    own_main_input,
    patches_of_the_batch,
    positioned_patches,
    robot_actions,
    second_tower_pixels,
)
from dtypecheck.memory.hf_config import (
    _merge_size,
    _token_id,
    mel_bins,
    merge_sizes,
    size_of,
    sizes_of,
)
from dtypecheck.memory.hf_media import _audio, _image_tokens
from dtypecheck.memory.tower_inputs import tower_inputs

if TYPE_CHECKING:
    import torch

LM_HEADS = ("CausalLM", "MaskedLM", "Seq2SeqLM", "SpeechSeq2Seq")
"""Heads whose labels are token ids of the text's shape."""
CLASSIFIER_HEADS = ("ImageClassification", "AudioClassification", "SequenceClassification")
"""Heads whose labels are one class (or, for a regression, one float per output) per sample."""


VISUAL_REGIONS = 36
"""Region features an image gives a region-based VLM (LXMERT): its pretraining's 36 detected boxes an image."""

PROCESSOR_FRAMES = {"instructblipvideo": 4}
"""Frames a clip has where the config names no ``num_frames`` and the model's processor fixes them: InstructBLIP
Video's forward takes (batch, frames, C, H, W), and its processor writes ``num_query_tokens * 4`` video tokens."""


def hf_inputs(
    model: torch.nn.Module, config: Any, head: str, batch: int, seq: int, *, train: bool, labels: bool, real: bool
) -> dict[str, Any]:
    """Keyword inputs for ``model.forward``: ``seq`` tokens of text; images of the config's size; audio as its
    feature extractor shapes about ``seq`` frames of it (Whisper's 30 s window whatever ``seq``)."""
    import torch

    parameters = inspect.signature(model.forward).parameters
    accepted = set(parameters)
    required = {
        n for n, p in parameters.items() if p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }
    passes_on = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    vocab = size_of(config, "vocab_size", 2)
    make = torch.randn if real else torch.zeros

    def ids(*shape: int, high: int = vocab) -> torch.Tensor:
        if real:
            return torch.randint(0, max(high, 1), shape)
        return torch.zeros(shape, dtype=torch.long)

    main = getattr(model, "main_input_name", "input_ids")
    # A retriever's wrapped VLM (ColModernVBERT's ``vlm``) takes the inputs its forward passes on.
    wrapped = getattr(getattr(model, "vlm", None), "forward", None)
    inner = accepted | (set(inspect.signature(wrapped).parameters) if wrapped is not None else set())
    kwargs: dict[str, Any] = {}
    if "input_ids" in accepted and (main == "input_ids" or "input_ids" in required or "pixel_values" in accepted):
        kwargs["input_ids"] = ids(batch, seq)
    if {"visual_feats", "visual_pos"} <= accepted and "input_ids" in kwargs:
        # LXMERT's image is its detector's region features and boxes: 36 regions, as its pretraining took.
        kwargs["visual_feats"] = make(batch, VISUAL_REGIONS, size_of(config, "visual_feat_dim", 2048))
        kwargs["visual_pos"] = make(batch, VISUAL_REGIONS, size_of(config, "visual_pos_dim", 4))
    if "lang_ids" in accepted and "input_ids" in kwargs:
        # X-MOD routes each sample through its language's adapters: the config's first language.
        kwargs["lang_ids"] = torch.zeros(batch, dtype=torch.long)
    if "bbox" in accepted and "input_ids" in kwargs:
        kwargs["bbox"] = torch.zeros(batch, seq, 4, dtype=torch.long)  # one (x0, y0, x1, y1) box per token
    # A multimodal config whose vision tower is left out (Gemma 4's defaults: ``vision_config`` None) builds no
    # tower: its forward still names ``pixel_values``, and is given text alone.
    towerless = "vision_config" in vars(config) and config.vision_config is None
    if "pixel_values" in accepted and not towerless:
        scaled = own_image_side(config)
        side = (scaled,) if scaled else sizes_of(config, "image_size", (224,))
        height, width = (side[0], side[-1])
        channels = size_of(config, "num_channels", 3)
        frames = size_of(config, "num_frames", PROCESSOR_FRAMES.get(str(getattr(config, "model_type", "")), 0))
        if not frames and "pixel_attention_mask" in inner and "spatial_shapes" not in inner:
            # Idefics-style models take each sample's images, (batch, images, C, H, W) beside a mask of their
            # padded pixels (not given: every pixel real): one image a sample. (A mask beside spatial shapes is
            # a NaFlex tower's, over flat patches: SigLIP2, LFM2-VL.)
            frames = 1
        if _matches_keypoints(config):
            frames = 2  # a keypoint matcher (SuperGlue, LightGlue, EfficientLoFTR) takes an image pair a sample
        # A video model's config says how many frames a clip has (VideoMAE's 16): (batch, frames, C, H, W).
        leading: tuple[int, ...] = (frames,) if frames else ()
        if "aspect_ratio_ids" in accepted:
            leading = _tiles(kwargs, config, batch, seq)
        elif "image_sizes" in accepted and _grid_pinpoints(config):
            leading = (_anyres_patches(config, height, width),)
        kwargs["pixel_values"] = make(batch, *leading, channels, height, width)
    if "pixel_values_videos" in required or (main == "pixel_values_videos" and "pixel_values" not in kwargs):
        # A video tower whose main input is its clip (VideoPrism's, optional in its signature).
        side = sizes_of(config, "image_size", (224,))
        frames = size_of(config, "num_frames", 8)
        kwargs["pixel_values_videos"] = make(batch, frames, size_of(config, "num_channels", 3), side[0], side[-1])
    pixels_ndim = kwargs["pixel_values"].ndim if "pixel_values" in kwargs else 0
    anyres = pixels_ndim == 5 and bool(_grid_pinpoints(config))
    if "image_sizes" in accepted and ((pixels_ndim == 4 and _tower_takes_sizes(model)) or anyres):
        # Pixtral-style towers take each image's (height, width), and so does LLaVA-NeXT's any-resolution
        # split, to find its patches; factory ops, whose values the trace knows. (LLaVA's forward names them
        # too, for a Pixtral tower: its CLIP tower's processor gives none, and the forward fails with them.)
        pixels = kwargs["pixel_values"]
        kwargs["image_sizes"] = torch.cat(
            [
                torch.full((batch, 1), int(pixels.shape[-2]), dtype=torch.long),
                torch.full((batch, 1), int(pixels.shape[-1]), dtype=torch.long),
            ],
            dim=1,
        )
    if "target_sizes" in accepted and "pixel_values" in kwargs and kwargs["pixel_values"].ndim == 4:
        # MiniCPM-V's tower takes each image's patch grid (rows, columns): the whole image's, factory-made.
        vision = getattr(config, "vision_config", None) or config
        cells = max(kwargs["pixel_values"].shape[-1] // size_of(vision, "patch_size", 14), 1)
        kwargs["target_sizes"] = torch.full((batch, 2), cells, dtype=torch.int32)
    image_tokens = robot_actions(kwargs, config, batch, make) if "action_embeds" in required else None
    second_tower_pixels(kwargs, model, config, make)
    cross_attended_images(kwargs, model, make)
    positioned_patches(kwargs, model, config, make)
    patches_of_the_batch(kwargs, model, config, make)
    if "spatial_shapes" in accepted and "pixel_values" in kwargs:
        _flat_patches(kwargs, config, batch, make)
    if "image_grid_thw" in accepted and "pixel_values" in kwargs:
        image_tokens = _patch_grid(kwargs, model, config, batch, make)
    elif "image_grid_hw" in accepted and "pixel_values" in kwargs and "input_ids" in kwargs:
        # (A RADIO tower on its own takes a batch of one size dense, and the grid only for packed sizes.)
        image_tokens = _patch_grid_hw(kwargs, config, batch, make)
    elif "grid_thw" in accepted and ("pixel_values" in kwargs or {"hidden_states", "grid_thw"} <= required):
        # A Qwen-VL-style vision tower on its own: the same flat patches (as ``hidden_states`` where its forward
        # names them so) and their ``grid_thw``.
        _patch_grid(kwargs, model, config, batch, make)
        kwargs["grid_thw"] = kwargs.pop("image_grid_thw")
        if "pixel_values" not in accepted:
            kwargs["hidden_states"] = kwargs.pop("pixel_values")
        if "merge_sizes" in required:
            kwargs["merge_sizes"] = merge_sizes(config, batch)  # VideoLLaMA3's tower
    if {"prompt_pixel_values", "prompt_masks"} <= required and "pixel_values" in kwargs:
        # SegGPT stacks its prompt image above the input in height (the config's 896 x 448): its processor gives
        # the input, the prompt image and the prompt's mask each at half the config's height.
        pixels = kwargs["pixel_values"]
        half = make(*pixels.shape[:-2], pixels.shape[-2] // 2, pixels.shape[-1])
        kwargs.update(pixel_values=half, prompt_pixel_values=make(*half.shape), prompt_masks=make(*half.shape))
    if "qformer_input_ids" in required:
        # InstructBLIP's Q-Former reads the instruction too, as its own tokenizer's ids.
        qformer = getattr(config, "qformer_config", None)
        kwargs["qformer_input_ids"] = ids(batch, seq, high=size_of(qformer, "vocab_size", vocab) if qformer else vocab)
    if "task_inputs" in required and (task := size_of(config, "task_seq_len", 0)):
        # OneFormer's task prompt ("the task is semantic"), as its processor tokenizes it: ``task_seq_len`` ids of
        # its text encoder's vocabulary.
        kwargs["task_inputs"] = ids(batch, task, high=size_of(config, "text_encoder_vocab_size", vocab))
    if "image_embeds_position_mask" in accepted and "input_ids" in kwargs and "pixel_values" in kwargs:
        # Kosmos-2 puts its latent queries' image embeddings at the positions the mask marks: as many as it has
        # queries, before the text, as its processor lays them out.
        queries = size_of(config, "latent_query_num", 64)
        text = kwargs["input_ids"]
        kwargs["input_ids"] = torch.cat([torch.zeros((batch, queries), dtype=text.dtype), text], dim=1)
        kwargs["image_embeds_position_mask"] = torch.cat(
            [torch.ones((batch, queries), dtype=torch.long), torch.zeros_like(text)], dim=1
        )
    if "input_ids" in kwargs and "pixel_values" in kwargs:
        names = ("image_token_id", "image_token_index")
        if image_tokens is None and isinstance(getattr(config, "num_query_tokens", None), int):
            image_tokens = config.num_query_tokens  # a Q-Former (BLIP-2's) makes this many features an image
            if kwargs["pixel_values"].ndim == 5:
                # ... and InstructBLIP Video's this many a frame, each clip's in its video placeholder's place.
                image_tokens *= int(kwargs["pixel_values"].shape[1])
                names = ("video_token_id", "video_token_index")
        grid = "image_grid_thw" in kwargs or "image_grid_hw" in kwargs
        _image_tokens(kwargs, model, config, image_tokens, names, counted_first=grid)
        if "mm_token_type_ids" in accepted:
            # M-RoPE's positions need each token's kind (0 text, 1 image), as the processor returns beside the ids.
            token = _token_id(config, "image_token_id", "image_token_index")
            text = kwargs["input_ids"]
            # No image token in the config (MiniCPM-V's): every token is text.
            kwargs["mm_token_type_ids"] = (
                (text == token).to(torch.int32) if token is not None else torch.zeros_like(text, dtype=torch.int32)
            )
    if main == "past_values" or "past_values" in required:
        # A time-series model's history: its config's ``context_length`` steps of each input channel (TimesFM's
        # one series a sample, with its padding mask, none padded, and a frequency class).
        steps = size_of(config, "context_length", seq)
        channels = size_of(config, "num_input_channels", 0)
        kwargs["past_values"] = make(batch, steps, channels) if channels else make(batch, steps)
        if "past_values_padding" in accepted:
            kwargs["past_values_padding"] = torch.zeros((batch, steps), dtype=torch.long)
        if "freq" in required:
            kwargs["freq"] = torch.zeros((batch, 1), dtype=torch.long)
        lagged_series(kwargs, model, config, batch, make)
    # A contrastive model (its forward takes ``return_loss``: CLAP, CLVP) is given each modality it pairs, as CLIP
    # is given its images.
    contrastive = {"return_loss", "input_features"} <= accepted
    if main in ("input_features", "input_values") or {"input_features", "input_values"} & required or contrastive:
        _audio(kwargs, model, config, main, (batch, seq), make, accepted)
        features = kwargs.get("input_features")
        masked = "input_features_mask" in kwargs
        if "input_features_mask" in accepted and features is not None and features.ndim == 3 and not masked:
            # Which frames are real (AudioFlamingo3's encoder counts them): every one, as the extractor says of
            # unpadded audio.
            # (Over the frames: the last axis of (bins, frames) features, the first of (frames, bins).)
            frames = int(features.shape[1] if features.shape[-1] == mel_bins(config) else features.shape[-1])
            kwargs["input_features_mask"] = torch.ones((batch, frames), dtype=torch.long)
    per_token = size_of(config, "audio_length_per_tok", 0)
    if per_token and "input_features" in accepted and "input_features" not in kwargs and "input_ids" in kwargs:
        # A streaming speech model (Voxtral Realtime) adds the audio of each text token to its embedding: the
        # spectrogram's frames, ``audio_length_per_tok`` a token, (batch, bins, frames), beside the text.
        frames = int(kwargs["input_ids"].shape[1]) * per_token
        kwargs["input_features"] = make(batch, mel_bins(config), frames)
    if "latents" in required and not kwargs:
        # A codec's decoder on its own (Mimi's): the continuous latents its encoder makes, (batch, hidden_size,
        # frames), ``seq`` frames of them.
        kwargs["latents"] = make(batch, size_of(config, "hidden_size", 1), seq)
    tower_inputs(kwargs, model, config, accepted, required, batch=batch, seq=seq, make=make)
    if not kwargs:
        own_main_input(kwargs, model, config, batch, seq, make)
    if not kwargs and main in accepted:
        kwargs[main] = ids(batch, seq)
    elif not kwargs and "input_ids" in accepted:
        # A text tower whose class keeps a vision parent's main input name (SAM3-lite-text's, "pixel_values",
        # which its forward does not take): its forward's token ids.
        kwargs["input_ids"] = ids(batch, seq)
    decoder = head in ("Seq2SeqLM", "SpeechSeq2Seq") or bool(getattr(config, "is_encoder_decoder", False))
    if decoder and "decoder_input_ids" in accepted:
        kwargs["decoder_input_ids"] = ids(batch, seq)  # given, not derived from labels (some configs cannot)
    if "use_cache" in accepted and (not train or _cache_has_no_length(model, accepted)):
        # The KV cache is counted for --context tokens, not for the pass. A training step runs as its users run it:
        # ``use_cache=False`` there changes what the trace sees (+2.7% on Llama) and not what the real step holds.
        # A hybrid model whose cache cannot tell its length (only linear-attention or state-space layers: Bamba, or
        # a shallow copy of Jamba's first layers) fails its own forward with a cache, so it trains without one.
        kwargs["use_cache"] = False
    elif "use_cache" not in accepted and passes_on and _cache_has_no_length(model, accepted):
        # A head that passes ``use_cache`` on in its keyword arguments to a model defaulting it to the config's
        # True (GraniteMoeHybrid's, whose defaults are all linear-attention layers) fails the same way.
        kwargs["use_cache"] = False
    if labels and train and "labels" in accepted:
        if head in CLASSIFIER_HEADS and "input_ids" in kwargs and labels_go_to_a_language_model(model):
            label = kwargs["input_ids"]  # the wrapped language model's token labels, as it trains on them
        else:
            label = _labels(config, head, batch, seq, kwargs, ids)
        if label is not None:
            kwargs["labels"] = label
    codebook_decoder_ids(kwargs, config, ids, lm_head=head in LM_HEADS)
    codebook_streams(kwargs, config, ids)
    return kwargs


def _matches_keypoints(config: Any) -> bool:
    """Whether the config's model type is one of transformers' keypoint matchers, whose ``pixel_values`` are image
    pairs."""
    from transformers.models.auto import modeling_auto

    matchers = getattr(modeling_auto, "MODEL_FOR_KEYPOINT_MATCHING_MAPPING_NAMES", {})
    return getattr(config, "model_type", None) in matchers


def _cache_has_no_length(model: torch.nn.Module, accepted: set[str]) -> bool:
    """Whether the ``DynamicCache`` the model's forward makes of its config (when it takes ``past_key_values``)
    raises on ``get_seq_length``, as one of only linear-attention layers does."""
    config = getattr(model, "config", None)
    if "past_key_values" not in accepted or config is None:
        return False
    try:
        from transformers.cache_utils import DynamicCache
    except ImportError:
        return False
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
    except ValueError:  # MusicGen's has two (its T5 encoder's and its decoder's): the forward makes its own cache
        return False
    try:
        with _disable_current_modes():  # the cache's layers hold no tensors until the first update
            DynamicCache(config=config).get_seq_length()
    except ValueError:
        return True
    except Exception:  # noqa: BLE001  (a config the cache cannot be made of: the forward makes its own)
        return False
    return False


def _tiles(kwargs: dict[str, Any], config: Any, batch: int, seq: int) -> tuple[int, int]:
    """Mllama-style tiled images, as its processor gives them: one image a sample cut into every tile
    (``max_num_tiles``), its aspect-ratio id and tile mask, and the text's cross-attention mask onto the image's
    tiles; the pixels' leading (images, tiles), ``(batch, images, tiles, C, H, W)``."""
    import torch

    tiles = size_of(config, "max_num_tiles", 4)
    kwargs["aspect_ratio_ids"] = torch.full((batch, 1), size_of(config, "max_aspect_ratio_id", 1), dtype=torch.long)
    kwargs["aspect_ratio_mask"] = torch.ones((batch, 1, tiles), dtype=torch.long)
    kwargs["cross_attention_mask"] = torch.ones((batch, seq, 1, tiles), dtype=torch.long)
    return 1, tiles


def _grid_pinpoints(config: Any) -> list[Any]:
    """The resolutions a LLaVA-NeXT-style ("any resolution") config splits an image into tiles at, or []."""
    found = getattr(config, "image_grid_pinpoints", None)
    return found if isinstance(found, list) and all(isinstance(p, list | tuple) for p in found) else []


def _anyres_patches(config: Any, height: int, width: int) -> int:
    """How many ``height x width`` patches LLaVA-NeXT's processor makes of one image of that size: the image at
    the tower's resolution, and the tiles of the grid resolution that fits it best (transformers' own
    ``select_best_resolution``), one patch per ``height x width`` of it."""
    from transformers.image_processing_utils import select_best_resolution

    best_height, best_width = select_best_resolution((height, width), _grid_pinpoints(config))
    return 1 + math.ceil(int(best_height) / height) * math.ceil(int(best_width) / width)


def _tower_takes_sizes(model: torch.nn.Module) -> bool:
    """Whether the model's ``vision_tower`` (where it names one) takes ``image_sizes`` itself."""
    tower = getattr(model, "vision_tower", None)
    if tower is None:
        tower = getattr(getattr(model, "model", None), "vision_tower", None)
    forward = getattr(tower, "forward", None)
    return forward is None or "image_sizes" in inspect.signature(forward).parameters


def _labels(config: Any, head: str, batch: int, seq: int, kwargs: dict[str, Any], ids: Any) -> Any:
    """Labels the head computes its own loss from, or None for a head whose labels this does not know (the
    default loss is then taken of its output)."""
    import torch

    if head in ("CausalLM", "MaskedLM") and "input_ids" in kwargs:
        return kwargs["input_ids"]  # ``labels = input_ids``, as language-model training feeds them
    if head in LM_HEADS:
        return ids(batch, seq)
    if head in CLASSIFIER_HEADS:
        classes = int(getattr(config, "num_labels", 2) or 2)
        if getattr(config, "problem_type", None) == "regression" or (classes == 1 and head == "SequenceClassification"):
            return torch.zeros(batch, classes)  # a regression head: one float target per output
        return ids(batch, high=classes)
    return None


def _patch_grid(kwargs: dict[str, Any], model: torch.nn.Module, config: Any, batch: int, make: Any) -> int:
    """Qwen-VL's images: ``pixel_values`` as the flat patches of one ``image_size`` image per sample (each
    ``channels x temporal_patch_size x patch_size**2`` values) and ``image_grid_thw`` their (1, rows, columns).
    Returns the image tokens each image stands for (its patches over the merged cells)."""

    # A retriever's wrapped VLM holds the tower's config (ColQwen2's ``vlm_config``).
    wrapped = getattr(config, "vlm_config", None)
    vision = getattr(config, "vision_config", None) or getattr(wrapped, "vision_config", None) or config
    patch = size_of(vision, "patch_size", 14)
    merge = _merge_size(vision)
    temporal = size_of(vision, "temporal_patch_size", 0) or size_of(vision, "patch_temporal", 1)
    channels = size_of(vision, "in_channels", 0) or size_of(vision, "num_channels", 3)
    # Where the config names no image size, the smallest its processor makes (HunYuan-VL's ``min_image_size``).
    side = (sizes_of(config, "image_size", ()) or sizes_of(config, "min_image_size", (224,)))[0]
    cells = _whole_cells(side, patch, merge)
    if _takes_token_pixels(model):
        # Inkling 2's tower takes each image token's pixels whole, (tokens, patch x merge, patch x merge, channels)
        # in raster order, and its grid counted in image tokens, as its forward documents them.
        tokens = cells // merge
        kwargs["pixel_values"] = make(batch * tokens * tokens, patch * merge, patch * merge, channels)
        kwargs["image_grid_thw"] = _one_frame_grid(batch, tokens)
        return tokens * tokens
    # A tower whose config names no frames a patch (no temporal patch size: PaddleOCR-VL's) or names
    # ``merge_kernel_size`` (Kimi-K2.5's) runs a 2-D convolution over each patch as given, unflattened (HunYuan-VL's,
    # also 2-D but with a temporal patch size of 1, reshapes flat patches itself).
    unflattened = size_of(vision, "merge_kernel_size", 0) or not {"temporal_patch_size", "patch_temporal"} & {
        *vars(vision)
    }
    if temporal == 1 and unflattened and _patch_conv2d(model, channels, patch):
        kwargs["pixel_values"] = make(batch * cells * cells, channels, patch, patch)
    elif wrapped is not None:
        # ColQwen2's processor pads each image's patches to the batch's longest, (batch, patches, values), and
        # its forward unpads them by the grid.
        kwargs["pixel_values"] = make(batch, cells * cells, channels * temporal * patch * patch)
    else:
        kwargs["pixel_values"] = make(batch * cells * cells, channels * temporal * patch * patch)
    kwargs["image_grid_thw"] = _one_frame_grid(batch, cells)
    return cells * cells // (merge * merge)


def _whole_cells(side: int, patch: int, merge: int) -> int:
    """Patches a side of a ``side``-pixel image, in whole ``merge x merge`` cells (at least one cell)."""
    return max(side // (patch * merge), 1) * merge


def _one_frame_grid(batch: int, side: int) -> Any:
    """Each sample's (1, ``side``, ``side``) grid, made of factory ops, whose values the trace knows (the vision
    tower reads them)."""
    import torch

    return torch.cat([torch.ones((batch, 1), dtype=torch.long), torch.full((batch, 2), side, dtype=torch.long)], dim=1)


def _patch_grid_hw(kwargs: dict[str, Any], config: Any, batch: int, make: Any) -> int:
    """Nemotron-H Omni's images: one ``image_size`` image a sample as flat patches (``channels x patch_size**2``
    values each) and ``image_grid_hw`` their (rows, columns), whole cells of its pixel shuffle (``1 /
    downsample_ratio`` a side). Returns the image tokens each image stands for (its cells)."""
    import torch

    vision = getattr(config, "vision_config", None) or config
    patch = size_of(vision, "patch_size", 16)
    channels = size_of(vision, "num_channels", 3)
    ratio = getattr(config, "downsample_ratio", None)
    merge = round(1 / ratio) if isinstance(ratio, float) and 0 < ratio < 1 else 1
    cells = _whole_cells(sizes_of(vision, "image_size", (224,))[0], patch, merge)
    kwargs["pixel_values"] = make(batch * cells * cells, channels * patch * patch)
    kwargs["image_grid_hw"] = torch.full((batch, 2), cells, dtype=torch.long)  # factory-made: the tower reads it
    return (cells // merge) ** 2


TOKEN_PIXELS = "patch_size * spatial_merge_size, patch_size * spatial_merge_size, num_channels"
"""How a tower that takes each image token's pixels whole documents its ``pixel_values`` (Inkling 2's)."""


def _takes_token_pixels(model: torch.nn.Module) -> bool:
    """Whether one of the model's modules documents ``pixel_values`` as ``TOKEN_PIXELS``."""
    seen: set[type] = set()
    for module in model.modules():
        kind = type(module)
        if kind not in seen:
            seen.add(kind)
            if TOKEN_PIXELS in (getattr(kind.forward, "__doc__", None) or ""):
                return True
    return False


def _patch_conv2d(model: torch.nn.Module, channels: int, patch: int) -> bool:
    """Whether the model's first convolution over ``channels`` inputs is 2-D with a ``patch``-sized kernel."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d | torch.nn.Conv3d) and module.in_channels == channels:
            return isinstance(module, torch.nn.Conv2d) and tuple(module.kernel_size) == (patch, patch)
    return False


def _flat_patches(kwargs: dict[str, Any], config: Any, batch: int, make: Any) -> None:
    """A NaFlex tower's images (SigLIP2, LFM2-VL): ``pixel_values`` as each image's ``num_patches`` flat patches
    (``channels x patch_size**2`` values each, a square grid), a mask of the real ones (all of them) and the
    grid's (rows, columns) as ``spatial_shapes``. A VLM's image tokens are then counted from its tower's features
    (LFM2-VL's projector merges patches)."""
    import math

    import torch

    vision = getattr(config, "vision_config", None) or config
    patch = size_of(vision, "patch_size", 16)
    channels = size_of(vision, "num_channels", 3)
    side = max(math.isqrt(size_of(vision, "num_patches", 256)), 1)
    patches = side * side
    kwargs["pixel_values"] = make(batch, patches, channels * patch * patch)
    kwargs["pixel_attention_mask"] = torch.ones((batch, patches), dtype=torch.long)
    # Made of factory ops, whose values the trace knows (the tower reads them to resize its position grid).
    kwargs["spatial_shapes"] = torch.full((batch, 2), side, dtype=torch.long)
