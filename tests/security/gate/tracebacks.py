"""Inputs that once gave dtypecheck's own traceback, or no ``error:`` line (issue 27, class 6).

File names that are not UTF-8 (a path Python holds with surrogates, which torch's reader would take for a
file object); ``estimate-memory`` configs that ``json`` cannot turn into numbers (a 5001-digit integer) or
nest 100,000 deep; an ``auto_map`` (transformers would prompt to run the model's own code); a billion layers; a
``file.py:factory`` whose module's ``parameters()``/``named_parameters()`` raise (the user's code: their
frames, then one ``error:`` line).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.security.corpus import Hostile

KLASS = "own-tracebacks"
CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}
RAISING_FACTORY = """import torch


class Raising(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)

    def parameters(self, recurse=True):
        raise RuntimeError("parameters() of the user's module raised")

    def named_parameters(self, *args, **kwargs):
        raise RuntimeError("named_parameters() of the user's module raised")


def make():
    return Raising()
"""


def not_utf8(folder: Path, name: bytes) -> Path:
    """``folder/name`` for a byte name that is not UTF-8 (held by Python with surrogate escapes)."""
    return Path(os.fsdecode(os.fsencode(folder) + b"/" + name))


def _config(folder: Path, name: str, text: str) -> Path:
    (folder / name).mkdir()
    path = folder / name / "config.json"
    path.write_text(text)
    return path


def build(folder: Path) -> list[Hostile]:
    import torch
    from safetensors.torch import save_file

    out: list[Hostile] = []

    def add(name: str, args: tuple[str, ...], expect: set[int], **extra: object) -> None:
        out.append(Hostile(name, KLASS, args, frozenset(expect), loader="none", **extra))  # type: ignore[arg-type]

    # --- names that are not UTF-8: a torch zip (torch's reader), a side file, a legacy file ---------------------
    zipped = not_utf8(folder, b"weights-\xff.pt")
    torch.save({"w": torch.ones(2)}, zipped)
    add("non-utf8-torch-zip", ("scan-model", str(zipped)), {0}, benign=True)
    side = folder / "non-utf8-side-file"
    side.mkdir()
    save_file({"w": torch.ones(2)}, side / "model.safetensors")
    torch.save({"step": 1}, not_utf8(side, b"optimizer-\xfe.pt"))
    add("non-utf8-side-file", ("scan-model", str(side)), {0}, benign=True)
    legacy = not_utf8(folder, b"legacy-\xfd.pt")
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    add("non-utf8-legacy", ("scan-model", str(legacy)), {0}, benign=True)

    # --- estimate-memory configs -------------------------------------------------------------------------------
    text = json.dumps(CONFIG)
    huge = _config(folder, "config-5001-digits", text[:-1] + ', "rope_theta": ' + "7" * 5001 + "}")
    add("config-5001-digit-integer", ("estimate-memory", str(huge)), {3})
    deep = _config(folder, "config-100k-deep", "[" * 100_000 + "]" * 100_000)
    add("config-100k-deep", ("estimate-memory", str(deep)), {3})
    remote = {**CONFIG, "model_type": "custom-remote", "architectures": ["CustomModel"]}
    remote["auto_map"] = {"AutoConfig": "configuration_custom.CustomConfig", "AutoModel": "modeling_custom.CustomModel"}
    auto_map = _config(folder, "config-auto-map", json.dumps(remote))
    add("config-auto-map", ("estimate-memory", str(auto_map)), {3})
    for name, layers in (("config-layers-1e9", 1e9), ("config-layers-int-1e9", 10**9)):
        path = _config(folder, name, json.dumps({**CONFIG, "num_hidden_layers": layers}))
        add(name, ("estimate-memory", str(path)), {3})

    # --- a factory whose module's own methods raise ----------------------------------------------------------
    factory = folder / "raising_factory.py"
    factory.write_text(RAISING_FACTORY)
    add("factory-parameters-raise-scan", ("scan-model", f"{factory}:make"), {3})
    add("factory-parameters-raise-estimate", ("estimate-memory", f"{factory}:make"), {3})
    return out
