"""What libraries beside transformers import from a model folder (red team, round 6): ``SentenceTransformer(folder)``
and ``CrossEncoder(folder)`` a module ``type`` in ``modules.json``, a Dense module's ``activation_function`` and a
cross-encoder's ``activation_fn``, each a dotted path that sentence-transformers imports (and for the activations,
calls; before 6.0 a local folder needed no ``trust_remote_code``, and the activations still need none for any
``torch.`` path); ``torch.hub.load(folder, "model", source="local")`` the folder's ``hubconf.py``.

Each payload is a real sentence-transformers save (a one-layer BERT, saved by ``SentenceTransformer.save`` and
``CrossEncoder.save``, no download) with one field changed to name a module shipped in the folder, and is proven
live by the class that loads it, with the folder first on the path (as a script beside the model imports its
neighbours). The saves themselves, unchanged, are the benign inputs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.security.corpus import Hostile, code_payload

KLASS = "library-loaders"


def _tiny_bert(where: Path, *, cross_encoder: bool) -> Path:
    """A one-layer BERT and its tokenizer (from a vocabulary written here), as ``save_pretrained`` writes them."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizerFast

    from tests.security.gate.benign import _quiet

    where.mkdir(parents=True, exist_ok=True)
    (where / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
    config = BertConfig(vocab_size=7, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    with _quiet():
        BertTokenizerFast(vocab_file=str(where / "vocab.txt")).save_pretrained(where)
        if cross_encoder:
            config.num_labels = 1
            BertForSequenceClassification(config).save_pretrained(where)
        else:
            BertModel(config).save_pretrained(where)
    return where


def _saves(folder: Path) -> tuple[Path, Path]:
    """A sentence embedder (Transformer, Pooling, Dense with tanh, Normalize) and a cross-encoder, as
    sentence-transformers saves them."""
    import torch
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    from tests.security.gate.benign import _quiet

    with _quiet():
        encoder = models.Transformer(str(_tiny_bert(folder / "bert", cross_encoder=False)))
        dense = models.Dense(8, 4, activation_function=torch.nn.Tanh())
        embedder = SentenceTransformer(modules=[encoder, models.Pooling(8), dense, models.Normalize()])
        embedder.save(str(folder / "sentence-embedder"))
        CrossEncoder(str(_tiny_bert(folder / "bert-ce", cross_encoder=True))).save(str(folder / "cross-encoder"))
    return folder / "sentence-embedder", folder / "cross-encoder"


def _edit(path: Path, change: dict[str, object]) -> None:
    document = json.loads(path.read_text())
    document.update(change)
    path.write_text(json.dumps(document, indent=2))


def build(folder: Path) -> list[Hostile]:
    embedder, cross = _saves(folder)
    out: list[Hostile] = []

    def payload(name: str, like: Path, loader: str = "sentence_transformers") -> tuple[Path, Path]:
        model = folder / name
        shutil.copytree(like, model)
        canary = folder / f"canary-{name}"
        out.append(Hostile(name, KLASS, ("scan-model", str(model)), frozenset({1}), canary, model, loader=loader))
        return model, canary

    model, canary = payload("module-type", embedder)
    modules = json.loads((model / "modules.json").read_text())
    modules[-1]["type"] = "custom_normalize.Normalize"  # imported as the folder's own module code
    (model / "modules.json").write_text(json.dumps(modules, indent=2))
    (model / "custom_normalize.py").write_text(f"{code_payload(canary)}\nclass Normalize:\n    pass\n")

    model, canary = payload("dense-activation", embedder)
    _edit(model / "2_Dense" / "config.json", {"activation_function": "fast_tanh.Tanh"})
    (model / "fast_tanh.py").write_text(f"{code_payload(canary)}\nimport torch\n\nTanh = torch.nn.Tanh\n")

    model, canary = payload("cross-encoder-activation", cross)
    _edit(model / "config.json", {"sentence_transformers": {"activation_fn": "calibrated.Sigmoid"}})
    settings = json.loads((model / "config_sentence_transformers.json").read_text())
    settings.pop("activation_fn", None)  # as versions 4 and 5 wrote it: in config.json only
    (model / "config_sentence_transformers.json").write_text(json.dumps(settings, indent=2))
    (model / "calibrated.py").write_text(f"{code_payload(canary)}\nimport torch\n\nSigmoid = torch.nn.Sigmoid\n")

    # a folder that is also a local hub repository: torch.hub.load runs its hubconf.py
    model, canary = payload("hubconf", embedder, "torch.hub")
    source = f"{code_payload(canary)}\ndependencies = ['torch']\n\n\ndef model():\n    return None\n"
    (model / "hubconf.py").write_text(source)

    for name, model in (("sentence-embedder", embedder), ("cross-encoder", cross)):
        out.append(Hostile(name, KLASS, ("scan-model", str(model)), frozenset({0}), benign=True, loader="none"))
    return out
