"""Which of the installed transformers' model types ``estimate-memory`` estimates, at their real size (issue 28.1).

Every model type that has a model class (any of transformers' ``MODEL_*_MAPPING_NAMES``): its config class at its
defaults (no shrinking, ``--size real``) or shrunk (``--size tiny``: hidden sizes, layers, heads, vocabulary),
written to a folder and estimated for float32 inference and an AdamW training step at batch 1 x 16 tokens (inputs
of other kinds at the config's own sizes). Fake tensors cost nothing at real size. Prints one markdown row per type
(ok, or the one-line reason) and a summary: types estimated / tried, seconds per type (median, max). Nothing is
downloaded.

    nice -n 10 .venv/bin/python benchmarks/memory_config_sweep.py [--size real|tiny] [--only bert,gpt2]
        [--part 1/2] [--timeout 60] [--results part1.jsonl]

With ``--results FILE`` every type's row is also appended to FILE (one JSON object a line) as soon as it is known,
and the types already in FILE are skipped: a sweep cut short (or a process ended by a crash in a model's own code)
is resumed by running the same command again. ``--render FILE...`` prints the markdown report of such files.

The model types whose towers timm builds (DETR's backbone, ``timm_wrapper``, PE, FastVLM, Gemma 3n's vision) need
timm, and timm needs torchvision, which the test set-up does not install; Granite Speech 5's feature extractor needs
torchaudio. They were run with the three installed apart, on the path of the sweep only (``declare_torchvision_ops``
says why torchvision's ops are declared). torchaudio's wheels here are CUDA builds too (2.11.1, the newest), whose
C++ library does not load beside CPU torch: it is deleted, and torchaudio runs on torch ops alone (the extractors
use its mel filter banks, which need nothing else):

    .venv/bin/python -m pip install --no-deps --target .sweep-deps timm==1.0.29 torchvision==0.28.0 \
        torchaudio==2.11.1
    find .sweep-deps/torchaudio/lib -name '*.so' -delete
    HF_HUB_OFFLINE=1 PYTHONPATH=.sweep-deps .venv/bin/python benchmarks/memory_config_sweep.py --only detr,...
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import math
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SEQ_LEN = 16
"""Tokens per sequence of every type's inputs, unless it trains at one length only."""

SMALL = {
    "hidden_size": 32,
    "d_model": 32,
    "n_embd": 32,
    "dim": 32,
    "embed_dim": 32,
    "intermediate_size": 64,
    "d_ff": 64,
    "ffn_dim": 64,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "num_hidden_layers": 1,
    "num_layers": 1,
    "n_layer": 1,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "num_decoder_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "n_head": 2,
    "num_heads": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "vocab_size": 128,
}


TINY_IMAGE = 64
"""The image side of a shrunk vision model."""
IMAGE_TYPES = ("resnet", "regnet", "bit", "convnext", "convnextv2")
"""Vision configs without an ``image_size`` of their own (their inputs default to 224 pixels)."""


class _TimeoutError(Exception):
    pass


def model_types() -> list[str]:
    """Every model type some ``MODEL_*_MAPPING_NAMES`` of transformers maps to a model class, sorted."""
    from transformers.models.auto import configuration_auto, modeling_auto

    found: set[str] = set()
    for name in dir(modeling_auto):
        if name.startswith("MODEL") and name.endswith("MAPPING_NAMES"):
            found.update(getattr(modeling_auto, name))
    return sorted(found & set(getattr(configuration_auto, "CONFIG_MAPPING_NAMES")))  # noqa: B009  (not re-exported)


def shrunk(config: Any) -> Any:
    """The config with its widths, depths, heads and vocabulary made tiny (where it has them)."""
    for name, value in SMALL.items():
        if isinstance(getattr(config, name, None), int) and not isinstance(getattr(config, name), bool):
            setattr(config, name, value)
    for name in ("layer_types", "mlp_layer_types", "attention_layer_types"):
        listed = getattr(config, name, None)
        layers = getattr(config, "num_hidden_layers", None)
        if isinstance(listed, list) and isinstance(layers, int):
            with contextlib.suppress(AttributeError):  # a property derived from the depth (Mamba's)
                setattr(config, name, listed[:layers])  # one entry per layer, as the config validates
    # Convolutional stages (ResNet's widths and depths per stage) and images: a tiny vision model is fed 64-pixel
    # images (one 224-pixel image through ResNet-50's real widths cost a test a minute and a half).
    for name, small in (("hidden_sizes", 16), ("depths", 1)):
        listed = getattr(config, name, None)
        if isinstance(listed, list) and listed and all(isinstance(v, int) for v in listed):
            setattr(config, name, [min(v, small) for v in listed])
    if isinstance(getattr(config, "image_size", None), int) or getattr(config, "model_type", "") in IMAGE_TYPES:
        config.image_size = TINY_IMAGE
    for sub in ("text_config", "vision_config", "audio_config", "encoder", "decoder"):
        nested = getattr(config, sub, None)
        if nested is not None and hasattr(nested, "to_dict"):
            shrunk(nested)
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int):  # a VLM's image token id lives beside its text config's vocabulary
        vocab = getattr(getattr(config, "text_config", None), "vocab_size", None)
    if isinstance(vocab, int):
        # Special token ids of the full vocabulary must stay inside the shrunk one, and apart from each other
        # (an image placeholder that were also the padding id would be counted twice).
        ids = {
            name: value
            for name, value in vars(config).items()
            if name.endswith(("_token_id", "_token_index")) and isinstance(value, int) and value >= vocab
        }
        moved = {value: vocab - 1 - i for i, value in enumerate(sorted(set(ids.values())))}
        for name, value in ids.items():
            setattr(config, name, moved[value])
    return config


def coherent(config: Any) -> Any:
    """The config with its vision tower's output as wide as its text model: the defaults of several VLMs (Qwen2.5-VL,
    Qwen3-VL, GLM-OCR, Ovis2, Janus) pair the vision merger of one checkpoint (``out_hidden_size`` 3584) with the
    text model of another (8192), which their own forward refuses; every released checkpoint has the two equal."""
    vision, text = getattr(config, "vision_config", None), getattr(config, "text_config", None)
    out, width = getattr(vision, "out_hidden_size", None), getattr(text, "hidden_size", None)
    if vision is not None and isinstance(out, int) and isinstance(width, int) and out != width:
        vision.out_hidden_size = width
    # Qwen2-VL's vision config names the tower's own width ``embed_dim`` and its merger's output ``hidden_size``.
    merged = getattr(vision, "hidden_size", None)
    qwen2_vl = out is None and isinstance(getattr(vision, "embed_dim", None), int)
    pair = isinstance(merged, int) and isinstance(width, int) and merged != width
    if vision is not None and qwen2_vl and getattr(vision, "spatial_merge_size", None) and pair:
        vision.hidden_size = width
    # Ovis2's visual embedding table is the config's own ``hidden_size`` wide (1536), its text model 4096.
    own = vars(config).get("hidden_size")
    if vision is not None and isinstance(own, int) and isinstance(width, int) and own != width:
        config.hidden_size = width
    # Janus's vision aligner ends at ``projection_dim`` (2048) and its image tokens enter a 4096-wide text model.
    generates = getattr(config, "vq_config", None) is not None
    if vision is not None and generates and isinstance(width, int) and "projection_dim" in vars(vision):
        vision.projection_dim = width
    # BLIP-2's and InstructBLIP's defaults name no image placeholder (``image_token_index`` None), which their
    # forward compares the ids with; released checkpoints add one token past the text vocabulary's last. So do
    # InstructBLIP Video's, for its video placeholder (``video_token_index``), and Nemotron-H Omni's (a
    # pixel-shuffled tower: ``downsample_ratio``) for its ``image_token_id``. MiniCPM-V's, also None, place no
    # image tokens.
    vocab = getattr(text, "vocab_size", None)
    placeholders = ["image_token_index", "video_token_index"] if "num_query_tokens" in vars(config) else []
    if vision is not None and "downsample_ratio" in vars(config):
        placeholders.append("image_token_id")
    for name in placeholders:
        if vars(config).get(name, 0) is None and vocab:
            setattr(config, name, vocab - 1)
    # HunYuan's and Ministral's defaults leave ``head_dim`` None, which their attention raises to a power; their
    # rotary embedding (and Mixtral's and MiniMax's attention, for the same None) take the width over the heads.
    for holder in (config, text):
        if holder is None:
            continue
        heads, hidden = _value(holder, "num_attention_heads"), _value(holder, "hidden_size")
        if "head_dim" in vars(holder) and vars(holder)["head_dim"] is None and heads and hidden:
            holder.head_dim = hidden // heads
        # Nemotron's leave ``num_key_value_heads`` None, which its attention divides by: as many as the heads
        # (plain multi-head attention), as Llama's config makes of None.
        if "num_key_value_heads" in vars(holder) and vars(holder)["num_key_value_heads"] is None:
            holder.num_key_value_heads = heads
    # A projector that merges the tower's patch grid by a factor (Idefics3's and SmolVLM's pixel shuffle,
    # ModernVBERT's) or pools it to a square of image tokens (Gemma 3's 256) needs a grid it divides; the defaults
    # take the base SigLIP/Idefics tower's 224 pixels (7 or 14 patches a side), which released checkpoints
    # replace (512 or 896): the image is made the next size up whose grid divides.
    merge = vars(config).get("scale_factor") or vars(config).get("pixel_shuffle_factor")
    tokens = vars(config).get("mm_tokens_per_image")
    per_side = merge if isinstance(merge, int) else math.isqrt(tokens) if isinstance(tokens, int) else 0
    side, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if (
        vision is not None
        and per_side > 1
        and isinstance(side, int)
        and isinstance(patch, int)
        and (side // patch) % per_side
    ):
        vision.image_size = -(-(side // patch) // per_side) * per_side * patch
    # Llama 4's vision defaults pair a 768-wide tower with the adapter of Scout's 1408-wide one (its checkpoints'):
    # the adapter's first layer takes the pixel-shuffled patches, ``intermediate_size`` (5632) = width / ratio**2 ...
    ratio, adapter = getattr(vision, "pixel_shuffle_ratio", None), getattr(vision, "intermediate_size", None)
    tower = getattr(vision, "hidden_size", None)
    if vision is not None and isinstance(ratio, float) and isinstance(adapter, int) and isinstance(tower, int):
        fitted = round(adapter * ratio**2)
        heads = getattr(vision, "num_attention_heads", 1) or 1
        if fitted != tower and fitted % heads == 0:
            vision.hidden_size = fitted
        # ... and its projector reads ``vision_output_dim`` (7680) of the adapter's ``projector_output_dim`` (4096).
        out = getattr(vision, "projector_output_dim", None)
        if isinstance(out, int) and isinstance(getattr(vision, "vision_output_dim", None), int):
            vision.vision_output_dim = out
    # A retriever wrapping a VLM (ColQwen2's Qwen2-VL) has that VLM's defaults, paired as the VLM's are, and so
    # has an encoder-decoder's multimodal encoder (T5Gemma 2's).
    for wrapped in ("vlm_config", "encoder"):
        if getattr(config, wrapped, None) is not None and hasattr(getattr(config, wrapped), "to_dict"):
            coherent(getattr(config, wrapped))
    return config


def documented_values(config: Any) -> dict[str, Any]:
    """The values the config class's own docstring example passes (``>>> configuration =
    TimeSeriesTransformerConfig(prediction_length=12)``) for those of its settings the defaults leave None, which
    the model cannot be built without (the time-series models' ``prediction_length``, ESM's ``vocab_size``). Set
    values are never changed, and examples that shrink a set size (DBRX's ``n_layers=2``) are not read for them."""
    name = type(config).__name__
    found: dict[str, Any] = {}
    for line in (type(config).__doc__ or "").splitlines():
        code = line.strip().removeprefix(">>>").strip()
        if f"{name}(" not in code or not line.strip().startswith(">>>"):
            continue
        with contextlib.suppress(SyntaxError, ValueError):
            call = ast.parse(code.split("=", 1)[1].strip() if code.startswith("configuration") else code).body[0]
            value = getattr(call, "value", None)
            for keyword in getattr(value, "keywords", []):
                literal = ast.literal_eval(keyword.value)
                if keyword.arg and getattr(config, keyword.arg, 0) is None and literal is not None:
                    found[keyword.arg] = literal
    return found


def _value(config: Any, name: str) -> Any:
    """A config's value, from the instance where it holds one: a per-layer config (Gemma 4's, dots3's, EmbeddingGemma
    2's) raises on the attribute of a value its layers may vary (transformers' ``AmbiguousGlobalPerLayerAttribute
    Error``), and its global value is the one the defaults set."""
    own = vars(config)
    if name in own:
        return own[name]
    try:
        return getattr(config, name, None)
    except RuntimeError:
        return None


def estimate_type(
    model_type: str, folder: Path, *, tiny: bool, seq_len: int = SEQ_LEN, filled: dict[str, Any] | None = None
) -> Any:
    """The float32 report (inference and training) of ``model_type``'s default config, written into ``folder``;
    the unset values filled from the config class's docstring are put in ``filled``."""
    from transformers import CONFIG_MAPPING

    from dtypecheck.dtypes import lookup
    from dtypecheck.errors import InputError
    from dtypecheck.memory import EstimateOptions, estimate_memory

    config = CONFIG_MAPPING[model_type]()
    coherent(config)
    (shrunk(config) if tiny else config).to_json_file(str(folder / "config.json"))
    options = EstimateOptions(dtypes=(lookup("float32"),))
    try:
        return estimate_memory(str(folder), options, seq_len=seq_len)
    except InputError as exc:
        # Batch norm refuses to train on one value per channel (torch itself raises): such a model trains at
        # batch 2 at the least, and is estimated there (its row says so).
        if BATCH_NORM_AT_ONE in exc.message():
            return estimate_memory(str(folder), options, seq_len=seq_len, batch_size=2)
        # A model that trains at one sequence length only, its own (its row says so).
        length = required_length(config, exc.message(), seq_len)
        if length is not None:
            return estimate_memory(str(folder), options, seq_len=length)
        # A model that cannot be built of its defaults, which leave a value it needs unset: the value its config
        # class's docstring example passes (only then: Voxtral's example names an audio token its defaults
        # leave None and run without).
        documented = documented_values(config) if CANNOT_BUILD in exc.message() else {}
        if documented:
            config = CONFIG_MAPPING[model_type](**documented)
            coherent(config)
            if filled is not None:
                filled.update(documented)
        elif not rope_sections_fit(config, exc.message()):
            raise
    (shrunk(config) if tiny else config).to_json_file(str(folder / "config.json"))
    return estimate_memory(str(folder), options, seq_len=seq_len)


def ok_result(report: Any, filled: dict[str, Any]) -> str:
    """An estimated type's row: its class, parameters and totals, and what the sweep chose other than its defaults
    (a batch of 2, the one length it trains at, values filled from its config class's docstring)."""
    totals = ", ".join(f"{row.mode} {row.bytes.total:,} B" for row in report.estimates)
    batches = {row.batch_size or 1 for row in report.estimates}
    chosen = f"; at batch {max(batches)}" if max(batches) > 1 else ""
    lengths = {row.seq_len for row in report.estimates if row.seq_len is not None}
    chosen += f"; at {max(lengths)} tokens, the one length it trains at" if lengths - {SEQ_LEN} else ""
    values = ", ".join(f"{k}={v!r}" for k, v in filled.items())
    chosen += f"; unset {values} filled from its config class's docstring" if filled else ""
    return f"ok ({report.model.model_class}, {report.model.parameters:,} parameters; {totals}{chosen})"


BATCH_NORM_AT_ONE = "Expected more than 1 value per channel when training"
"""What batch norm raises in training at one value per channel: the sweep's batch of 1 is then 2."""
AXIAL_LENGTH = "axial_pos_shape factors"
"""What Reformer's axial position embeddings raise in training at a length their factors do not multiply to."""
FIXED_OUTPUT = re.compile(r"Expected input batch_size \((\d+)\) to match target batch_size \((\d+)\)")
"""What cross-entropy raises when a model's token logits have another length than its labels (flattened)."""


def required_length(config: Any, message: str, seq_len: int) -> int | None:
    """The one sequence length a model trains at, where its training step at ``seq_len`` tokens (batch 1) says
    it trains at no other; None otherwise. Reformer's axial position embeddings train only at the length their
    factors multiply to (``axial_pos_shape``; 4096 of its defaults), as its forward says. Perceiver's masked-LM
    decoder queries ``max_position_embeddings`` positions (2048) whatever the input's length, and its tokenizer
    pads every text to that length (``padding="max_length"``): its logits are longer than labels of 16 tokens,
    and only labels (and inputs) of that length train."""
    if AXIAL_LENGTH in message and getattr(config, "axial_pos_embds", False):
        length = int(math.prod(getattr(config, "axial_pos_shape", ()) or (0,)))
        return length if length > 0 and length != seq_len else None
    found = FIXED_OUTPUT.search(message)
    positions = getattr(config, "max_position_embeddings", None)
    if found is not None and int(found.group(2)) == seq_len and int(found.group(1)) == positions != seq_len:
        return int(found.group(1))
    return None


CANNOT_BUILD = "cannot build a model from this config"
"""What estimate-memory says of a config its model class raises on."""
ROPE_SECTIONS = re.compile(r"in module '[\w.]*rotary_emb'.*sum exactly to (\d+) .*split_sizes=\[([\d, ]+)\]")
"""What an M-RoPE rotary embedding raises when its sections (temporal, height, width) do not split its width."""


def rope_sections_fit(config: Any, message: str) -> bool:
    """Whether ``message`` says the config's M-RoPE sections do not add up to its rotary width, and if so, set
    sections of that width in the same proportions. GLM-4V's defaults leave the sections to its code's [8, 12, 12]
    (32 frequencies) beside a 128-wide rotary head (64; its checkpoints rotate half the head, 32), and GLM-4.5V's
    96 heads of 4096 leave 42 (its checkpoints' heads are 128 wide): the rope's width barely moves the memory."""
    found = ROPE_SECTIONS.search(message)
    if found is None:
        return False
    width, sections = int(found.group(1)), [int(v) for v in found.group(2).split(",")]
    fitted = [width * v // sum(sections) for v in sections]
    fitted[0] += width - sum(fitted)
    for holder in (getattr(config, "text_config", None), config):
        rope = getattr(holder, "rope_parameters", None)
        if isinstance(rope, dict):
            rope["mrope_section"] = fitted
            return True
    return False


def _reason(exc: BaseException) -> str:
    from dtypecheck.errors import DtypecheckError

    if isinstance(exc, DtypecheckError):
        return f"error: {exc.message()}"
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else ''}"


def sweep(types: list[str], *, tiny: bool, timeout: int, results: Path | None = None) -> None:
    import torch
    import torch._dynamo

    from dtypecheck.memory import estimate_memory  # noqa: F401

    torch.set_num_threads(1)  # fake tensors compute nothing; one thread keeps the CPU-time bound one core's
    from dtypecheck.memory.tracing import TraceDeadlineError, trace_deadline

    def alarm(_signum: int, _frame: object) -> None:
        raise _TimeoutError

    signal.signal(signal.SIGPROF, alarm)
    done = {row["type"] for row in read_rows([results])} if results is not None and results.exists() else set()
    seconds: list[float] = []
    ok = 0
    print("| model type | result | CPU seconds | wall seconds |\n|---|---|---:|---:|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in types:
            if model_type in done:
                continue
            if results is not None:
                # Written before the attempt: a type whose own code ends the process is recorded as such.
                _append(results, {"type": model_type, "result": "the process ended during this type", "seconds": None})
            folder = Path(tmp) / model_type
            folder.mkdir()
            start = time.perf_counter()
            cpu = time.process_time()
            # The bound is CPU time (the machine is shared: wall-clock time would measure the other sessions).
            # Traces stop cleanly between two ops at the deadline; the timer, later, stops anything else (a
            # signal that fires inside autograd's engine would end the process).
            signal.setitimer(signal.ITIMER_PROF, timeout + 30)
            filled: dict[str, Any] = {}
            try:
                with trace_deadline(cpu + timeout, time.process_time):
                    report = estimate_type(model_type, folder, tiny=tiny, filled=filled)
                result = ok_result(report, filled)
                ok += 1
            except (_TimeoutError, TraceDeadlineError):
                result = f"timeout after {timeout} s"
            except Exception as exc:  # noqa: BLE001  (any failure is this type's row, not the sweep's end)
                result = _reason(exc)
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            took = time.process_time() - cpu
            wall = time.perf_counter() - start
            seconds.append(took)
            cell = result.replace("|", "/").replace("\n", " ")[:220]
            if results is not None:
                _append(
                    results, {"type": model_type, "result": cell, "seconds": round(took, 1), "wall": round(wall, 1)}
                )
            print(f"| {model_type} | {cell} | {took:.1f} | {wall:.1f} |", flush=True)
    if seconds:
        print(
            f"\n{ok} of {len(seconds)} model types estimated; CPU seconds per type: median "
            f"{statistics.median(seconds):.1f}, max {max(seconds):.1f}",
            flush=True,
        )


def _append(path: Path, row: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")


def read_rows(paths: list[Path | None]) -> list[dict[str, Any]]:
    """Every type's last row in the ``--results`` files, sorted by type."""
    rows: dict[str, dict[str, Any]] = {}
    for path in paths:
        if path is None:
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["type"]] = row
    return [rows[name] for name in sorted(rows)]


REASONS = (
    ("ok", "ok"),
    ("timeout", "timeout (60 s)"),
    ("TraceDeadline", "timeout (60 s)"),
    ("the process ended", "the process ended (a crash in the model's own code)"),
    ("cannot build a model", "cannot build from the default config"),
    ("ValidationError", "the config class's own defaults fail its validation"),
    ("cannot read this config", "the config class's own defaults fail its validation"),
    ("is beyond this model", "the sweep's 16 tokens exceed the default config's positions"),
    ("needs timm", "needs timm (not installed: it needs torchvision)"),
    ("requires the timm", "needs timm (not installed: it needs torchvision)"),
    ("depends on tensor values", "data-dependent op (value-dependent size)"),
    ("cannot trace", "the forward pass fails on the inputs built"),
)


DEFAULTS_AT_FAULT = {
    "deepseek_v2": "64 routed experts and `num_experts_per_tok` None: the router's `topk` has no k",
    "edgetam": "its default RepViT backbone's widths are not the 384 its neck takes",
    "edgetam_vision_model": "its default RepViT backbone's widths are not the 384 its neck takes",
    "esm": "`pad_token_id` None, which its position ids compare the ids with (`input_ids.ne(padding_idx)`)",
    "higgs_audio_v2_tokenizer": "its acoustic encoder's hop (320 samples at 24 kHz: 75 frames a second) and its "
    "semantic tower's (320 at 16 kHz: 50 a second) never give the same number of frames, which its forward joins",
    "hunyuan_vl": "its text config's `rope_parameters` name no `mrope_section`: its forward needs 3 multimodal axes",
    "hunyuan_vl_text": "its `rope_parameters` name no `mrope_section`, which its rotary embedding takes the length of",
    "lw_detr": "no feature levels (`projector_scale_factors` empty, `num_feature_levels` 0): its encoder joins none",
    "pp_doclayout_v2": "`class_thresholds` None, which its forward makes a tensor of",
    "pp_ocrv6_small_det": "its neck takes four feature maps (12, 18, 42 and 360 channels); its default backbone "
    "gives one, of 384 (`out_features` ['stage4'])",
    "qwen3_omni_moe_thinker": "its text model's 28 heads do not divide its width (2048) and `head_dim` is unset: "
    "the rotary embedding's 74 values meet 73-value heads",
    "step3p7": "its forward builds a sliding-window mask at every call (though its default layers are all full "
    "attention), and its defaults leave `sliding_window` None",
    "uvdoc": "its head's first convolution takes 768 channels; its default backbone gives one 128-channel map "
    "(`out_features` ['stage6'])",
    "vitmatte": "its backbone (VitDet's defaults) is 768 wide where its decoder takes the 384 of its `hidden_size`",
}
"""Types whose forward fails because their default config contradicts itself, each read by hand from the error
and the config (no input the sweep could build runs it): reported as such, with the contradiction."""
AT_FAULT = "the default config contradicts itself (read by hand: the row says how)"


def reason_class(result: str, model_type: str = "") -> str:
    if result.startswith("ok"):
        return "ok"
    if model_type in DEFAULTS_AT_FAULT and "cannot trace" in result:
        return AT_FAULT
    for prefix, name in REASONS[1:]:
        if prefix in result[:400]:
            return name
    return "other"


def render(rows: list[dict[str, Any]], every: list[str]) -> str:
    """The markdown report: the summary, the count per reason, then one row per type (``every`` lists all)."""
    tried = [row for row in rows if row["seconds"] is not None or "process ended" in row["result"]]
    ok = sum(row["result"].startswith("ok") for row in tried)
    seconds = [row["seconds"] for row in tried if row["seconds"] is not None]
    counts: dict[str, int] = {}
    for row in tried:
        reason = reason_class(row["result"], row["type"])
        counts[reason] = counts.get(reason, 0) + 1
    lines = [
        f"**{ok} of {len(tried)} types tried estimated** ({len(every)} types have a model class; "
        f"{len(every) - len(tried)} not reached). CPU seconds per type tried: median "
        f"{statistics.median(seconds) if seconds else 0:.1f}, max {max(seconds, default=0):.1f}.",
        "",
        "| reason | types |",
        "|---|---:|",
        *(f"| {name} | {n} |" for name, n in sorted(counts.items(), key=lambda item: -item[1])),
        "",
        "| model type | result | CPU seconds | wall seconds |",
        "|---|---|---:|---:|",
    ]
    by_type = {row["type"]: row for row in rows}
    for name in every:
        found = by_type.get(name)
        if found is None:
            lines.append(f"| {name} | not reached (the sweep ran out of session time) | | |")
        else:
            took = "" if found["seconds"] is None else f"{found['seconds']:.1f}"
            wall = "" if found.get("wall") is None else f"{found['wall']:.1f}"
            result = found["result"]
            if reason_class(result, name) == AT_FAULT:
                result += f"; the defaults contradict themselves: {DEFAULTS_AT_FAULT[name]}"
            lines.append(f"| {name} | {result} | {took} | {wall} |")
    return "\n".join(lines) + "\n"


def declare_torchvision_ops() -> bool:
    """Make an installed torchvision importable whose C++ extension cannot load; whether that was needed.

    The only torchvision wheels this machine's package index holds are CUDA builds, whose ``_C.so`` needs
    ``libtorch_cuda``: beside the CPU build of torch it does not load, and ``import torchvision`` then fails at
    ``register_fake("torchvision::nms")`` (the one registration that does not first ask whether the ops exist),
    and with it timm and every model type built on timm. Declaring ``nms`` and ``qnms`` (schema only, no kernel)
    lets it import; a model that called them would fail saying the op has no kernel, and none of the sweep's does.
    A torchvision built for the installed torch (a user's) loads its own ops and is left as it is."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc):
            raise
    else:
        return False
    import torch

    for name in [name for name in sys.modules if name == "torchvision" or name.startswith("torchvision.")]:
        del sys.modules[name]
    library = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _DECLARED.append(library)  # kept: a library that is collected takes its ops along
    import torchvision  # noqa: F401

    return True


_DECLARED: list[Any] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma list of model types")
    parser.add_argument("--size", choices=("real", "tiny"), default="real")
    parser.add_argument("--part", help="K/N: the K-th of N equal slices of the sorted types")
    parser.add_argument("--timeout", type=int, default=60)
    parser.add_argument("--results", type=Path, help="append rows to this JSON-lines file; skip the types in it")
    parser.add_argument("--render", type=Path, nargs="+", help="print the markdown report of --results files")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    declare_torchvision_ops()
    import transformers

    if args.render:
        print(render(read_rows(list(args.render)), model_types()), end="")
        return

    transformers.logging.set_verbosity_error()
    types = args.only.split(",") if args.only else model_types()
    if args.part:
        k, n = (int(v) for v in args.part.split("/"))
        types = types[(k - 1) * len(types) // n : k * len(types) // n]
    sweep(types, tiny=args.size == "tiny", timeout=args.timeout, results=args.results)


if __name__ == "__main__":
    main()
