"""Code a model folder tells its loaders to import: ``auto_map`` and ``custom_pipelines`` in its JSON configs,
custom components of a diffusers ``model_index.json``, the dotted paths sentence-transformers imports,
``custom_generate/generate.py``, and a ``hubconf.py`` (``torch.hub.load(folder, name, source="local")`` runs it).

``AutoConfig``/``AutoModel``/``AutoTokenizer``/``pipeline``'s ``from_pretrained(folder, trust_remote_code=True)``
imports the modules a config's ``auto_map`` (or ``custom_pipelines``) names, from the folder itself or, for a
``repo--module.Class`` reference, from another Hub repository; ``generate(custom_generate=...)`` imports
``custom_generate/generate.py``; ``DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)`` imports
``unet/my_unet.py`` for a component ``"unet": ["my_unet", "MyUNet"]``. Loading such a folder the way its files
ask runs that code, which no pickle rule sees: each is a ``contains-code`` ``fail``.

``SentenceTransformer(folder)`` and ``CrossEncoder(folder)`` import a dotted path from several files: each module's
``type`` in ``modules.json``, a Router's ``types`` (``router_config.json``), a WordEmbeddings' ``tokenizer_class``,
a Dense module's ``activation_function`` and a cross-encoder's ``activation_fn`` (which it calls; in
``config_sentence_transformers.json``, or ``config.json`` as older versions wrote it). Before
sentence-transformers 6.0 a local folder was trusted without ``trust_remote_code`` (the activations still are, for
any ``torch.`` path). A path is inert only inside the ``sentence_transformers`` package, or for an activation, as
one of torch's activation classes (built with no arguments), or a name with no module path (GPT-2's config.json
says ``"activation_function": "gelu_new"``, which no import can resolve); a module ``path`` that leaves the folder
loads what this scan never read. Anything else fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dtypecheck.errors import InputError
from dtypecheck.loaders.base import Finding

MAX_CONFIG_BYTES = 64 << 20
"""Largest JSON file parsed for code references (a tokenizer.json may hold tens of MB)."""
CODE_KEYS = ("auto_map", "custom_pipelines")
"""Keys of a transformers config whose values name modules ``trust_remote_code=True`` imports."""
_HINTS = (*(key.encode() for key in CODE_KEYS), b"activation_f", b"\\u")
"""Bytes without which no JSON file can hold a key naming code: ``CODE_KEYS``, or an activation sentence-transformers
imports (``\\u`` escapes can spell any of them)."""
GENERATE = ("custom_generate", "generate.py")
HUBCONF = "hubconf.py"
"""What ``torch.hub.load(folder, model, source="local")`` imports and runs (any folder of the tree can be one)."""
PIPELINE_INDEX = "model_index.json"
"""A diffusers pipeline's index: its components' ``[library, class]`` may name code shipped in the folder."""
SENTENCE_FILES = ("modules.json", "router_config.json", "wordembedding_config.json", "config.json")
"""Files whose dotted paths sentence-transformers imports (a Router's legacy ``config.json`` holds its ``types``)."""
_ACTIVATIONS = frozenset(
    (
        "CELU",
        "ELU",
        "GELU",
        "GLU",
        "Hardshrink",
        "Hardsigmoid",
        "Hardswish",
        "Hardtanh",
        "Identity",
        "LeakyReLU",
        "LogSigmoid",
        "LogSoftmax",
        "Mish",
        "PReLU",
        "RReLU",
        "ReLU",
        "ReLU6",
        "SELU",
        "SiLU",
        "Sigmoid",
        "Softmax",
        "Softmax2d",
        "Softmin",
        "Softplus",
        "Softshrink",
        "Softsign",
        "Tanh",
        "Tanhshrink",
        "Threshold",
    )
)
"""torch's activation classes (``torch.nn.modules.activation``, and ``Identity``): what sentence-transformers
writes as an activation, each built with no arguments and inert."""
_ACTIVATION_PREFIXES = ("torch.nn.modules.activation.", "torch.nn.modules.linear.", "torch.nn.modules.", "torch.nn.")


def code_references(path: Path, label: str) -> list[Finding]:
    """A ``contains-code`` ``fail`` when ``path`` (a ``*.json`` of a model folder) names code a loader imports,
    or ``custom_generate/generate.py`` itself; nothing otherwise."""
    if path.name == GENERATE[1] and path.parent.name == GENERATE[0]:
        detail = f"{label}: generate(custom_generate=..., trust_remote_code=True) imports and runs it"
        return [Finding("contains-code", "fail", detail)]
    if path.name == HUBCONF:
        detail = f"{label}: torch.hub.load(folder, ..., source='local') imports and runs it"
        return [Finding("contains-code", "fail", detail)]
    if path.suffix.lower() != ".json":
        return []
    from dtypecheck.loaders._io.regular import read_regular_file

    try:
        too_big = path.stat().st_size > MAX_CONFIG_BYTES
        raw = b"" if too_big else read_regular_file(path, MAX_CONFIG_BYTES, "config")
    except (InputError, OSError):
        return []  # unreadable: the folder's reading of the same file as a pickle reports it
    # A file whose name a loader reads code references from is parsed whatever its bytes; any other only when it
    # holds a key that names code (the same test for one too large to parse, read a block at a time).
    always = path.name == PIPELINE_INDEX or path.name in SENTENCE_FILES
    if not always and not (_mentions_code(path) if too_big else any(hint in raw for hint in _HINTS)):
        return []
    if too_big:
        detail = (
            f"{label}: over {MAX_CONFIG_BYTES} bytes, not checked for code a loader imports (a loader would read it)"
        )
        return [Finding("unreadable-file", "fail", detail)]
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return []  # transformers' json.loads fails the same way: nothing is imported
    pipeline = path.name == PIPELINE_INDEX
    named = _named_code(document) | (_pipeline_code(document, path.parent) if pipeline else set())
    imported = sentence_transformers_code(document, path.name)
    findings = []
    if named:
        detail = (
            f"{label}: names code ({_shown(named)}) that from_pretrained(..., trust_remote_code=True) imports and runs"
        )
        findings.append(Finding("contains-code", "fail", detail))
    if imported:
        detail = (
            f"{label}: names {_shown(imported)}, which sentence-transformers imports (from outside its own package)"
        )
        findings.append(Finding("contains-code", "fail", detail))
    return findings


def _shown(names: set[str]) -> str:
    """The first three of ``names`` in order, and how many more."""
    return ", ".join(sorted(names)[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def sentence_transformers_code(document: Any, name: str) -> set[str]:
    """The dotted paths (and module paths leaving the folder) in a sentence-transformers file named ``name`` that
    are not shown inert (see the module's docstring)."""
    named: set[str] = set()

    def class_ref(where: str, value: Any) -> None:
        if not (isinstance(value, str) and value.startswith("sentence_transformers.")):
            named.add(f"{where} {value!r}")

    def activation(where: str, value: Any) -> None:
        if isinstance(value, str) and "." not in value:
            return  # a transformers config's own name ("gelu_new"): no module path, nothing to import
        if isinstance(value, str):
            for prefix in _ACTIVATION_PREFIXES:
                if value.startswith(prefix) and value.removeprefix(prefix) in _ACTIVATIONS:
                    return
        if value is not None:
            named.add(f"{where} {value!r}")

    if name == "modules.json" and isinstance(document, list):
        for entry in document:
            if isinstance(entry, dict):
                class_ref("a module of type", entry.get("type"))
                where = entry.get("path")
                if isinstance(where, str) and (where.startswith(("/", "\\")) or ".." in Path(where).parts):
                    named.add(f"a module at {where!r} (outside the folder)")
    if not isinstance(document, dict):
        return named
    if name in ("router_config.json", "config.json") and isinstance(document.get("types"), dict):
        for value in document["types"].values():
            class_ref("a Router module of type", value)
    if name == "wordembedding_config.json" and "tokenizer_class" in document:
        class_ref("the tokenizer class", document["tokenizer_class"])
    if "activation_function" in document:
        activation("the activation", document["activation_function"])
    nested = document.get("sentence_transformers")
    if isinstance(nested, dict) and "activation_fn" in nested:
        activation("the activation", nested["activation_fn"])
    if "activation_fn" in document:  # config_sentence_transformers.json (6.x)
        activation("the activation", document["activation_fn"])
    if "sbert_ce_default_activation_function" in document:
        activation("the activation", document["sbert_ce_default_activation_function"])
    return named


def _pipeline_code(document: Any, folder: Path) -> set[str]:
    """What a diffusers ``model_index.json`` makes ``DiffusionPipeline.from_pretrained(...,
    trust_remote_code=True)`` import from the folder: a component ``[library, class]`` whose ``library.py`` is
    shipped in the component's subfolder (or beside the index), and a custom pipeline (``_class_name`` given as
    ``[module, class]``)."""
    if not isinstance(document, dict):
        return set()
    named: set[str] = set()
    for key, value in document.items():
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and value[0]):
            continue
        if key == "_class_name":
            named.add(".".join(str(part) for part in value))
            continue
        module = f"{value[0]}.py"
        if _is_file(folder / str(key) / module) or _is_file(folder / module):
            named.add(f"{key}/{module}")
    return named


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a key that is no file name
        return False


def _mentions_code(path: Path) -> bool:
    """Whether a file too large to parse holds any of ``_HINTS`` (read a block at a time; unreadable: True)."""
    overlap = max(len(hint) for hint in _HINTS)
    try:
        with path.open("rb") as handle:
            tail = b""
            while block := handle.read(1 << 20):
                window = tail + block
                if any(hint in window for hint in _HINTS):
                    return True
                tail = window[-overlap:]
    except OSError:
        return True
    return False


def _named_code(document: Any) -> set[str]:
    """Every string under a ``CODE_KEYS`` key anywhere in ``document`` (an empty mapping names nothing)."""
    named: set[str] = set()
    pending: list[tuple[Any, bool]] = [(document, False)]
    while pending:
        value, under_key = pending.pop()
        if isinstance(value, dict):
            pending.extend((item, under_key or key in CODE_KEYS) for key, item in value.items())
        elif isinstance(value, list):
            pending.extend((item, under_key) for item in value)
        elif under_key and isinstance(value, str) and value:
            named.add(value)
        elif under_key and value is not None and not isinstance(value, str):
            named.add(repr(value))
    return named
