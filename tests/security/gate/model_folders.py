"""What a model folder's other loaders run, beyond ``torch.load`` of its top-level files (red team, round 5).

Each payload sits beside clean weights (``model.safetensors``) that the scan reads, so the payload is the only
thing wrong with the folder, and each is proven live by the loader that really reads it:

- a pickle in a subfolder: a Trainer's ``checkpoint-500/optimizer.pt`` (resumed with ``torch.load``), a symlinked
  one (``rng_state.pth`` of a folder elsewhere), a distributed checkpoint's bytes item (``dcp.load`` of an FSDP
  ``fsdp_0/``): the scan judged the top level only;
- code named by ``auto_map`` in ``config.json`` or ``tokenizer_config.json`` (``from_pretrained(...,
  trust_remote_code=True)`` imports it), also with the key spelled by a JSON escape, and a diffusers
  ``model_index.json`` component whose module ``unet/my_unet.py`` is shipped (``DiffusionPipeline``), and a
  causal LM's ``custom_generate/generate.py`` (``generate(custom_generate=..., trust_remote_code=True)``);
- ``.npy``/``.npz`` arrays of objects, whose pickle ``np.load(allow_pickle=True)`` runs after the array header
  (``torch.load`` of the same file fails at its first byte, so reading it as ``torch.load`` does found nothing).

Beside them, the benign folders those loaders read: numeric and string arrays saved plainly, a real config without
``auto_map``, a DCP save of a model and its optimizer in a subfolder, and a Trainer's output folder with its
``checkpoint-N`` subfolder (exit 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.security.corpus import Hostile, code_payload

KLASS = "folder-loaders"


class _Payload:
    """Pickles as ``exec(code)``, wherever a framework pickles it (``torch.save``, ``np.save`` of an object)."""

    def __init__(self, marker: Path) -> None:
        self.code = code_payload(marker)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (self.code,)


def _weights(folder: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.ones(2)}, folder / "model.safetensors")
    return folder


def _objects(payload: object) -> Any:
    """A two-element object array, as a dataset's labels or a tokenizer's vocabulary is saved with ``np.save``."""
    import numpy as np

    array = np.empty(2, dtype=object)
    array[0], array[1] = "label", payload
    return array


_CONFIG_CODE = """{code}
from transformers import PretrainedConfig


class EvilConfig(PretrainedConfig):
    model_type = "evil"
"""
_TOKENIZER_CODE = """{code}
from transformers import PreTrainedTokenizer


class EvilTokenizer(PreTrainedTokenizer):
    pass
"""


def build(folder: Path) -> list[Hostile]:
    import numpy as np
    import torch

    out: list[Hostile] = []

    def canary(name: str) -> Path:
        return folder / f"canary-{name}"

    def add(name: str, target: Path, loads: Path, loader: str = "torch.load") -> None:
        args = ("scan-model", str(target))
        out.append(Hostile(name, KLASS, args, frozenset({1}), canary(name), loads, loader=loader))

    def benign(name: str, target: Path) -> None:
        args = ("scan-model", str(target))
        out.append(Hostile(name, KLASS, args, frozenset({0}), benign=True, loader="none"))

    name = "subfolder-trainer-checkpoint"
    model = _weights(folder / name)
    (model / "checkpoint-500").mkdir()
    torch.save({"state": {}, "param_groups": [], "x": _Payload(canary(name))}, model / "checkpoint-500/optimizer.pt")
    add(name, model, model / "checkpoint-500/optimizer.pt")

    name = "subfolder-symlink"
    elsewhere = folder / "elsewhere"
    elsewhere.mkdir()
    torch.save({"python": _Payload(canary(name))}, elsewhere / "rng_state.pth")
    model = _weights(folder / name)
    (model / "checkpoint-7").symlink_to(elsewhere, target_is_directory=True)
    add(name, model, model / "checkpoint-7/rng_state.pth")

    for name, key, spelled in (
        ("auto-map-config", "AutoConfig", "auto_map"),
        ("auto-map-escaped-key", "AutoConfig", "auto\\u005fmap"),
    ):
        model = _weights(folder / name)
        module = f"configuration_{name.replace('-', '_')}"
        config = '{"model_type": "evil", "%s": {"%s": "%s.EvilConfig"}}' % (spelled, key, module)  # noqa: UP031
        (model / "config.json").write_text(config)
        (model / f"{module}.py").write_text(_CONFIG_CODE.format(code=code_payload(canary(name))))
        add(name, model, model, loader="from_pretrained.AutoConfig")

    name = "subfolder-distributed-checkpoint"  # an FSDP checkpoint's DCP folder: a bytes item after the tensors
    model = _weights(folder / name)
    _dcp_save({"a": torch.ones(3), "b": torch.zeros(2), "extra": _Payload(canary(name))}, model / "fsdp_0")
    add(name, model, model / "fsdp_0", loader="dcp.load")

    name = "auto-map-tokenizer"
    model = _weights(folder / name)
    (model / "config.json").write_text(json.dumps({"model_type": "bert"}))
    auto_map = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (model / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto_map}))
    (model / "tokenization_evil.py").write_text(_TOKENIZER_CODE.format(code=code_payload(canary(name))))
    add(name, model, model, loader="from_pretrained.AutoTokenizer")

    name = "diffusers-custom-component"  # DiffusionPipeline imports unet/my_unet.py for ["my_unet", "MyUNet"]
    model = _weights(folder / name)
    index = {"_class_name": "DDPMPipeline", "unet": ["my_unet", "MyUNet"], "scheduler": ["diffusers", "DDPMScheduler"]}
    (model / "model_index.json").write_text(json.dumps(index))
    (model / "unet").mkdir()
    (model / "unet" / "config.json").write_text(json.dumps({"_class_name": "MyUNet"}))
    (model / "unet" / "my_unet.py").write_text(f"{code_payload(canary(name))}\nclass MyUNet:\n    pass\n")
    (model / "scheduler").mkdir()
    (model / "scheduler" / "scheduler_config.json").write_text(json.dumps({"_class_name": "DDPMScheduler"}))
    add(name, model, model, loader="from_pretrained.DiffusionPipeline")

    name = "custom-generate"  # generate(custom_generate=folder, trust_remote_code=True) imports its generate.py
    model = _tiny_causal_lm(folder / name)
    (model / "custom_generate").mkdir()
    source = f"{code_payload(canary(name))}\n\ndef generate(model, *args, **kwargs):\n    return None\n"
    (model / "custom_generate" / "generate.py").write_text(source)
    add(name, model, model, loader="generate.custom_generate")

    name = "npy-object-array"
    model = _weights(folder / name)
    np.save(model / "labels.npy", _objects(_Payload(canary(name))), allow_pickle=True)
    add(name, model, model / "labels.npy", loader="np.load")

    name = "npz-object-array"
    model = _weights(folder / name)
    np.savez(model / "extra.npz", scale=np.ones(2), labels=_objects(_Payload(canary(name))))
    add(name, model, model / "extra.npz", loader="np.load")

    name = "npz-compressed-object-array"
    model = _weights(folder / name)
    np.savez_compressed(model / "extra.npz", scale=np.ones(2), labels=_objects(_Payload(canary(name))))
    add(name, model, model / "extra.npz", loader="np.load")

    model = _weights(folder / "numpy-plain")
    np.save(model / "mean.npy", np.arange(4, dtype=np.float32))
    np.save(model / "labels.npy", np.array(["cat", "dog"], dtype=object), allow_pickle=True)
    np.savez(model / "stats.npz", mean=np.zeros(3), std=np.ones(3))
    np.savez_compressed(model / "stats-compressed.npz", mean=np.zeros(3), names=np.array(["a"], dtype=object))
    benign("numpy-plain", model)

    from transformers import BertConfig, GenerationConfig

    model = _weights(folder / "config-plain")
    BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2).save_pretrained(model)
    GenerationConfig(max_new_tokens=4).save_pretrained(model)
    benign("config-plain", model)

    model = _weights(folder / "distributed-plain")
    layer = torch.nn.Linear(4, 2)
    adam = torch.optim.Adam(layer.parameters())
    layer(torch.ones(1, 4)).sum().backward()
    adam.step()
    _dcp_save({"model": layer.state_dict(), "optimizer": adam.state_dict()}, model / "fsdp_0")
    benign("distributed-plain", model)

    benign("trainer-output-folder", _trainer_output(folder / "trainer"))
    return out


def _tiny_causal_lm(where: Path) -> Path:
    """A one-layer GPT-2 as ``save_pretrained`` writes it (model.safetensors, config.json, generation_config.json)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.security.gate.benign import _quiet

    config = GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=16, bos_token_id=0, eos_token_id=0)
    with _quiet():
        GPT2LMHeadModel(config).save_pretrained(where)
    return where


def _dcp_save(state: dict[str, object], where: Path) -> None:
    import warnings

    from torch.distributed.checkpoint.state_dict_saver import save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save(state, checkpoint_id=where)


def _trainer_output(where: Path) -> Path:
    """A Trainer's ``output_dir`` after ``train()`` and ``save_model()``: its weights, config and
    training_args.bin, and the ``checkpoint-2`` subfolder with optimizer.pt, scheduler.pt, rng_state.pth."""
    from transformers import Trainer, TrainingArguments

    from tests.security.gate.benign import _quiet, _Rows, _tiny_bert

    with _quiet():
        args = TrainingArguments(
            output_dir=str(where), max_steps=2, save_steps=2, per_device_train_batch_size=2, report_to=[],
            logging_strategy="no", use_cpu=True, disable_tqdm=True,
        )  # fmt: skip
        trainer = Trainer(model=_tiny_bert(), args=args, train_dataset=_Rows())
        trainer.train()
        trainer.save_model()
    return where
