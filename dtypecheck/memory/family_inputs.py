"""Inputs that families of transformers models take in shapes of their own, read from their config and ``forward``
signature: an audio decoder's codebooks flattened into the batch (MusicGen, Dia), a spectrogram under a name of
the model's own beside its padding mask (Gemma 3n's audio encoder). ``hf_inputs`` calls these once the common
inputs are built."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DECODER_CONFIGS = ("decoder", "decoder_config")
"""Where an encoder-decoder's config keeps its decoder's."""


def decoder_codebooks(config: Any) -> tuple[str, int, int] | None:
    """(name, count, vocabulary) of the audio codebooks an encoder-decoder's decoder predicts a step, or None:
    MusicGen's decoder names them ``num_codebooks``, Dia's ``num_channels``."""
    for name in DECODER_CONFIGS:
        decoder = getattr(config, name, None)
        if decoder is None or not hasattr(decoder, "to_dict"):
            continue
        vocab = getattr(decoder, "vocab_size", None)
        for count in ("num_codebooks", "num_channels"):
            codebooks = vars(decoder).get(count)
            if isinstance(codebooks, int) and not isinstance(codebooks, bool) and codebooks > 1 and vocab:
                return count, codebooks, int(vocab)
    return None


def codebook_decoder_ids(kwargs: dict[str, Any], config: Any, ids: Any, *, lm_head: bool) -> None:
    """Make an audio decoder's ``decoder_input_ids`` ``seq`` codes of each codebook, in the decoder's vocabulary:
    MusicGen's ``(batch * num_codebooks, seq)``, as its docs give them (the codebooks flattened into the batch);
    Dia's ``(batch, seq, num_channels)``, as its processor gives them (its own reshape of the flattened form ends
    in a ``view`` of a transposed tensor, which fails in eager too), and for its language-model head the labels
    its processor makes, ``(batch * num_channels, seq)``, as its logits are flattened."""
    found = decoder_codebooks(config)
    given = kwargs.get("decoder_input_ids")
    if found is None or given is None or given.ndim != 2:
        return
    name, codebooks, vocab = found
    batch, seq = (int(v) for v in given.shape)
    if name == "num_codebooks":
        kwargs["decoder_input_ids"] = ids(batch * codebooks, seq, high=vocab)
        return
    kwargs["decoder_input_ids"] = ids(batch, seq, codebooks, high=vocab)
    if lm_head and "labels" in kwargs:
        kwargs["labels"] = ids(batch * codebooks, seq, high=vocab)


def named_spectrogram(
    kwargs: dict[str, Any], model: torch.nn.Module, config: Any, batch: int, seq: int, make: Any
) -> bool:
    """Give a main input of the model's own name (Gemma 3n's audio encoder's ``audio_mel``) the features its
    model's extractor makes, ``(batch, frames, bins)``, when the forward requires a mask named after it
    (``audio_mel_mask``); the mask is all False, none padded: Gemma 3n's model passes its extractor's mask of real
    frames inverted (``get_audio_features(input_features, ~input_features_mask)``). Returns whether it did."""
    import inspect

    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    from dtypecheck.memory.hf_config import _extractor_type, _feature_shape, size_of

    main = getattr(model, "main_input_name", "")
    parameters = inspect.signature(model.forward).parameters
    mask = f"{main}_mask"
    if not main or main in kwargs or main not in parameters or mask not in parameters:
        return False
    if parameters[mask].default is not inspect.Parameter.empty:
        return False
    bins = size_of(config, "input_feat_size", 0) or size_of(config, "num_mel_bins", 0) or None
    with _disable_current_modes():  # the extractor's own ops are not the model's
        found = _feature_shape(_extractor_type(type(config)), seq * 160, bins)
    if found is None or found[0] != "input_features" or len(found[1]) != 2:
        return False
    frames = found[1][0]
    kwargs[main] = make(batch, *found[1])
    kwargs[mask] = torch.zeros((batch, frames), dtype=torch.bool)
    return True


def second_tower_pixels(kwargs: dict[str, Any], model: torch.nn.Module, config: Any, make: Any) -> None:
    """Give each ``<name>_pixel_values`` the forward takes beside ``pixel_values`` the images of the tower its config
    keeps as ``<name>_vision_config``, at that tower's image size: DeepSeek-VL-hybrid's SAM tower reads 1024-pixel
    ``high_res_pixel_values`` beside its SigLIP tower's 384, as its image processor gives both (its forward refuses
    one without the other)."""
    import inspect

    from dtypecheck.memory.hf_config import size_of, sizes_of

    pixels = kwargs.get("pixel_values")
    if pixels is None or pixels.ndim != 4:
        return
    for name in inspect.signature(model.forward).parameters:
        prefix = name.removesuffix("_pixel_values")
        tower = getattr(config, f"{prefix}_vision_config", None) if prefix != name else None
        if tower is None or name in kwargs:
            continue
        side = sizes_of(tower, "image_size", tuple(int(v) for v in pixels.shape[-2:]))
        kwargs[name] = make(int(pixels.shape[0]), size_of(tower, "num_channels", 3), side[0], side[-1])


def trajectory(kwargs: dict[str, Any], model: torch.nn.Module, config: Any, batch: int, seq: int, make: Any) -> bool:
    """A Decision Transformer's trajectory of ``seq`` steps, as its docs shape it: each step's state
    (``state_dim``), action (``act_dim``), reward and return-to-go, its timestep and an all-real mask (its
    GPT-2 reads three tokens a step). Returns whether the model takes one."""
    import inspect

    import torch

    parameters = inspect.signature(model.forward).parameters
    dims = vars(config).get("state_dim"), vars(config).get("act_dim")
    wanted = {"states", "actions", "rewards", "returns_to_go", "timesteps"}
    if not wanted <= set(parameters) or not all(isinstance(v, int) and v > 0 for v in dims):
        return False
    state_dim, act_dim = dims
    kwargs.update(
        states=make(batch, seq, state_dim),
        actions=make(batch, seq, act_dim),
        rewards=make(batch, seq, 1),
        returns_to_go=make(batch, seq, 1),
        timesteps=torch.arange(seq).expand(batch, seq).contiguous(),
    )
    if "attention_mask" in parameters:
        kwargs["attention_mask"] = torch.ones((batch, seq), dtype=torch.long)
    return True


def own_image_side(config: Any) -> int | None:
    """The image side a model's config implies where it names no ``image_size``, or None: that of a model that cuts
    each of several scaled copies of its image into ``patch_size`` patches (DepthPro's ``scaled_images_ratios``),
    its smallest copy one patch, ``patch_size / min(ratios)`` (DepthPro's 1536 pixels, its image processor's size);
    that of a model whose frames are padded to ``max_img_size`` (TVP's visual prompt, 448 pixels, as its
    processor pads them)."""
    own = vars(config)
    ratios, patch = own.get("scaled_images_ratios"), own.get("patch_size")
    scales = [r for r in ratios if isinstance(r, int | float) and r > 0] if isinstance(ratios, list | tuple) else []
    if isinstance(patch, int) and scales and len(scales) == len(ratios):
        return math.ceil(patch / min(scales))
    padded = own.get("max_img_size")
    if "image_size" not in own and isinstance(padded, int) and padded > 0:
        return padded
    return None


def cross_attended_images(kwargs: dict[str, Any], model: torch.nn.Module, make: Any) -> None:
    """Idefics's images, which its text cross-attends to (its forward takes ``image_attention_mask`` beside
    ``image_encoder_embeddings``): ``(batch, images, C, H, W)``, one image a sample, and the mask of which images
    each token sees, ``(batch, seq, images)``, every one (as its processor gives a text after its image)."""
    import inspect

    import torch

    parameters = inspect.signature(model.forward).parameters
    pixels, text = kwargs.get("pixel_values"), kwargs.get("input_ids")
    if pixels is None or text is None or pixels.ndim != 4:
        return
    if not {"image_attention_mask", "image_encoder_embeddings"} <= set(parameters):
        return
    batch, seq = (int(v) for v in text.shape)
    kwargs["pixel_values"] = make(batch, 1, *pixels.shape[1:])
    kwargs["image_attention_mask"] = torch.ones((batch, seq, 1), dtype=torch.long)


def lagged_series(kwargs: dict[str, Any], model: torch.nn.Module, config: Any, batch: int, make: Any) -> None:
    """A lagged time-series transformer's window (Time Series Transformer, Informer), as its docs shape it: the
    history is ``context_length`` steps and the largest lag before them, each step's ``num_time_features`` time
    features and an all-observed mask; the ``prediction_length`` future values and their time features the
    decoder reads (given in inference too, as the docs' examples give them), and the static features the config
    counts."""
    import inspect

    import torch

    parameters = inspect.signature(model.forward).parameters
    own = vars(config)
    lags, context, horizon = own.get("lags_sequence"), own.get("context_length"), own.get("prediction_length")
    if "past_time_features" not in parameters or not lags or not isinstance(context, int):
        return
    if not isinstance(horizon, int):
        return
    steps = context + max(int(v) for v in lags)
    channels = (own.get("input_size") or 1,) if (own.get("input_size") or 1) > 1 else ()
    features = int(own.get("num_time_features") or 0)
    kwargs.update(
        past_values=make(batch, steps, *channels),
        past_time_features=make(batch, steps, features),
        past_observed_mask=torch.ones((batch, steps, *channels), dtype=torch.bool),
    )
    if "future_values" in parameters:
        kwargs["future_values"] = make(batch, horizon, *channels)
    if "future_time_features" in parameters:
        kwargs["future_time_features"] = make(batch, horizon, features)
    if categorical := int(own.get("num_static_categorical_features") or 0):
        kwargs["static_categorical_features"] = torch.zeros((batch, categorical), dtype=torch.long)
    if real := int(own.get("num_static_real_features") or 0):
        kwargs["static_real_features"] = make(batch, real)


def flattened_patches(kwargs: dict[str, Any], model: torch.nn.Module, config: Any, batch: int, make: Any) -> bool:
    """Pix2Struct's image, whose main input is its processor's ``flattened_patches``: ``max_patches`` rows (its
    image processor's, 2048; else the tower's ``seq_len``) of a patch's row and column ids and its
    ``patch_embed_hidden_size`` values, every one real. Returns whether the model takes them."""
    import inspect

    import torch

    from dtypecheck.memory.hf_config import size_of

    if getattr(model, "main_input_name", "") != "flattened_patches":
        return False
    values = size_of(config, "patch_embed_hidden_size", 0)
    rows = _processor_default(config, "max_patches") or size_of(config, "seq_len", 0)
    if not values or not rows:
        return False
    # Row and column ids first (zeros: the first patch's, which the position embeddings read as indices).
    kwargs["flattened_patches"] = torch.cat([torch.zeros(batch, rows, 2), make(batch, rows, values)], dim=-1)
    if "attention_mask" in inspect.signature(model.forward).parameters:
        kwargs["attention_mask"] = torch.ones((batch, rows), dtype=torch.long)
    return True


def _processor_default(config: Any, name: str) -> int | None:
    """An integer default of the image processor transformers maps the config's model type to, or that of the model
    holding it (a class attribute: the processor is not built, its backend may not be installed)."""
    import transformers
    from transformers.models.auto import image_processing_auto

    from dtypecheck.memory.hf_config import held_by

    mapping: dict[str, Any] = getattr(image_processing_auto, "IMAGE_PROCESSOR_MAPPING_NAMES", {})
    own = str(getattr(config, "model_type", ""))
    # A tower on its own (Gemma 4's vision tower): the processor of the model whose config holds it.
    names = mapping.get(own) or mapping.get(held_by(type(config), tuple(mapping), depth=1))
    for class_name in names.values() if isinstance(names, dict) else [names]:
        value = getattr(getattr(transformers, str(class_name), None), name, None) if class_name else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def own_main_input(
    kwargs: dict[str, Any], model: torch.nn.Module, config: Any, batch: int, seq: int, make: Any
) -> None:
    """The main input of a model that takes none of the common kinds: a spectrogram under its own name, a
    trajectory, flattened patches (the first of these the model takes)."""
    for give in (named_spectrogram, trajectory):
        if give(kwargs, model, config, batch, seq, make):
            return
    flattened_patches(kwargs, model, config, batch, make)


def robot_actions(kwargs: dict[str, Any], config: Any, batch: int, make: Any) -> int | None:
    """A vision-language-action model's action expert (PI0's) reads, after the VLM's prefix, one token of the
    robot's state and ``chunk_size`` tokens of its noised actions and their timestep, embedded at its expert's
    width (``action_embeds``), and a mask of the cameras a sample has (each one real) beside their images,
    (batch, cameras, C, H, W). Returns the image tokens of a sample's cameras (its PaliGemma's
    ``num_image_tokens`` each), where it has images."""
    import torch

    from dtypecheck.memory.hf_config import size_of

    expert = getattr(config, "dit_config", None)
    kwargs["action_embeds"] = make(batch, size_of(config, "chunk_size", 50) + 1, size_of(expert, "hidden_size", 1))
    pixels = kwargs.get("pixel_values")
    if pixels is None or pixels.ndim != 5:
        return None
    kwargs["pixel_attention_mask"] = torch.ones(tuple(pixels.shape[:2]), dtype=torch.bool)
    vlm = getattr(config, "vlm_config", None)
    per_camera = size_of(getattr(vlm, "text_config", None), "num_image_tokens", 0)
    return per_camera * int(pixels.shape[1]) or None


def codebook_streams(kwargs: dict[str, Any], config: Any, ids: Any) -> None:
    """Kyutai's speech-to-text decoder reads a text stream and ``num_codebooks`` streams of audio codes a step
    (its embedding offsets each stream into one table: ``vocab_size`` text ids, then ``codebook_vocab_size`` per
    codebook): its ``input_ids`` are ``(batch, seq, 1 + num_codebooks)``, text ids then audio codes."""
    import torch

    own = vars(config)
    codebooks, codes, text = own.get("num_codebooks"), own.get("codebook_vocab_size"), kwargs.get("input_ids")
    if not isinstance(codebooks, int) or not isinstance(codes, int) or text is None or text.ndim != 2:
        return
    batch, seq = (int(v) for v in text.shape)
    kwargs["input_ids"] = torch.cat([text.unsqueeze(-1), ids(batch, seq, codebooks, high=codes)], dim=-1)


def frames_padded(model: torch.nn.Module, config: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """(frames, bins) features with their frames padded up to a multiple of the config's ``subsampling_factor``
    where the model's forward documents them so ("padded to a multiple of `config.subsampling_factor` frames":
    Nemotron 3.5 Transcribe's audio model, which refuses other lengths, as its processor pads them); else
    ``shape`` as it is."""
    factor = getattr(config, "subsampling_factor", None)
    documented = "padded to a multiple of `config.subsampling_factor`" in (model.forward.__doc__ or "")
    if not documented or not isinstance(factor, int) or factor < 2:
        return shape
    return (-(-shape[0] // factor) * factor, *shape[1:])


def labels_go_to_a_language_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` (a classification head) hands its ``labels`` on to the language model it wraps, which
    takes token labels, not classes: ShieldGemma 2's image classifier passes them to its Gemma 3
    (``self.model(..., labels=labels)``, a ``ForConditionalGeneration``) and reads its Yes/No logits after."""
    import inspect

    inner = getattr(model, "model", None)
    if inner is None or not type(inner).__name__.endswith(("ForConditionalGeneration", "ForCausalLM")):
        return False
    try:
        source = inspect.getsource(type(model).forward)
    except (OSError, TypeError):
        return False
    return "self.model(" in source and "labels=labels" in source


def chunks_padded(config: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """(bins, frames) features with their frames padded up to whole chunks of ``2 * n_window`` mel frames where the
    config class documents its encoder's chunks so (Qwen3-ASR's: "Each chunk processed by the conv stack has
    ``2 * n_window`` mel frames"; its encoder refuses other lengths); else ``shape`` as it is."""
    window = vars(config).get("n_window")
    documented = "``2 * n_window`` mel frames" in (type(config).__doc__ or "")
    if not documented or not isinstance(window, int) or window < 1:
        return shape
    return (*shape[:-1], -(-shape[-1] // (2 * window)) * 2 * window)


def patches_of_the_batch(kwargs: dict[str, Any], model: torch.nn.Module, config: Any, make: Any) -> None:
    """Images as flat patches where the model's forward, or its base model's that a head passes them to, documents
    them so, as their processors cut them: each image's ``patch_size`` grid, ``channels x patch_size**2`` values a
    patch. NeoMME's are one list for the whole batch ("`pixel_values` (`torch.Tensor` of shape `(num_patches, 3 *
    patch_size ** 2)`)"), Fuyu's a list per image ("`image_patches` (... `(batch_size, num_total_patches,
    patch_size_ x patch_size x num_channels)`)", the name its ``pixel_values`` had). Their placeholders are then
    counted from the features, one per patch."""
    from dtypecheck.memory.hf_config import size_of

    pixels = kwargs.get("pixel_values")
    owners = (model, getattr(model, "base_model", model))
    docs = [m.forward.__doc__ or "" for m in owners]
    patch = size_of(config, "patch_size", 0)
    if pixels is None or pixels.ndim != 4 or not patch:
        return
    batch, channels, height, width = (int(v) for v in pixels.shape)
    grid = (height // patch) * (width // patch)
    if any("`(num_patches, 3 * patch_size ** 2)`" in doc for doc in docs):
        kwargs["pixel_values"] = make(batch * grid, channels * patch * patch)
    elif any("`(batch_size, num_total_patches, patch_size_ x patch_size x num_channels)`" in doc for doc in docs):
        kwargs["pixel_values"] = make(batch, grid, channels * patch * patch)  # Fuyu's, per image


def positioned_patches(kwargs: dict[str, Any], model: torch.nn.Module, config: Any, make: Any) -> None:
    """Gemma 4's vision tower's images, whose forward requires ``pixel_position_ids``: as its image processor makes
    them, the image cut into ``patch_size`` patches (flat, ``3 x patch_size**2`` values each) on the largest square
    grid of whole pooling cells within its patch budget (the processor's ``max_soft_tokens`` soft tokens of
    ``pooling_kernel_size**2`` patches each), padded to that budget; each patch's (x, y) position, (-1, -1) for
    the padding."""
    import inspect

    import torch

    from dtypecheck.memory.hf_config import size_of

    parameters = inspect.signature(model.forward).parameters
    pixels = kwargs.get("pixel_values")
    position = parameters.get("pixel_position_ids")
    if pixels is None or position is None or position.default is not inspect.Parameter.empty:
        return
    tokens = _processor_default(config, "max_soft_tokens")
    kernel, patch = size_of(config, "pooling_kernel_size", 0), size_of(config, "patch_size", 0)
    if not tokens or not kernel or not patch:
        return
    budget = tokens * kernel * kernel
    side = math.isqrt(budget) // kernel * kernel  # patches a side of the largest square grid of whole cells
    batch = int(pixels.shape[0])
    columns, rows = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="xy")
    grid = torch.stack([columns, rows], dim=-1).reshape(side * side, 2)
    padding = torch.full((budget - side * side, 2), -1, dtype=torch.long)
    kwargs["pixel_values"] = make(batch, budget, size_of(config, "num_channels", 3) * patch * patch)
    kwargs["pixel_position_ids"] = torch.cat([grid, padding]).expand(batch, budget, 2).contiguous()
