"""The checkpoint formats dtypecheck reads: one row each, from which everything that lists them derives.

``FORMATS`` is the one place that names a format. Content detection (``detect``), the opener, the suffixes a folder
scan treats as "named like a checkpoint", the ``scan-model`` help text, the "not a checkpoint" error and the
``files:`` pattern of ``.pre-commit-hooks.yaml`` (checked by a test) are all read from it. Adding a format is a
row here plus its loader module.

This module is imported by the CLI to build its help text, so it imports no loader (and no torch) until a file is
actually detected or opened.
"""

from __future__ import annotations

import importlib
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from dtypecheck.loaders.base import Checkpoint

SNIFF_BYTES = 32
"""How many leading bytes ``detect`` functions see."""


@dataclass(frozen=True)
class Sniffed:
    """What content detection looks at: the file, its first ``SNIFF_BYTES`` bytes and its size."""

    path: Path
    head: bytes
    size: int


@dataclass(frozen=True)
class Format:
    """One checkpoint format."""

    name: str
    """The ``format`` a report names (``Checkpoint.format``)."""
    kind: Literal["file", "folder"]
    """``file``: one file, opened by content. ``folder``: a folder recognised by the files in it."""
    suffixes: tuple[str, ...]
    """File name endings the format is usually saved under (lower case, with the dot). Detection never relies on
    them; they decide which files a folder scan reports as "named like a checkpoint" and what pre-commit passes."""
    description: str
    """A few words for help texts and error messages."""
    detect: Callable[[Sniffed], bool]
    """For a ``file`` format: True when the content is this format (the first matching row wins). For a
    ``folder`` format: called with the folder itself (``head`` empty)."""
    opener: str
    """``module:callable`` taking the path, imported only when a file of this format is opened."""
    file_names: tuple[str, ...] = ()
    """For a ``folder`` format: the file names (glob patterns) that mark a folder as this format."""

    def open(self, path: Path) -> Checkpoint:
        module, _, attribute = self.opener.partition(":")
        opener: Callable[[Path], Checkpoint] = getattr(importlib.import_module(module), attribute)
        return opener(path)


def _safetensors(s: Sniffed) -> bool:
    from dtypecheck.loaders._io.safetensors_head import looks_like_safetensors

    return looks_like_safetensors(s.head, s.size)


def _zip(s: Sniffed) -> bool:
    return s.head.startswith(b"PK\x03\x04")


def _zip_names(s: Sniffed) -> list[str] | None:
    """The names in a zip's central directory, or None (not a zip, or one ``zipfile`` cannot list)."""
    if not _zip(s):
        return None
    try:
        with zipfile.ZipFile(s.path) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError, KeyError, IndexError):
        return None  # the torch-zip loader reports what is wrong with it


def _torchscript(s: Sniffed) -> bool:
    """A zip whose archive folder holds ``constants.pkl``: ``torch.load`` hands such an archive to
    ``torch.jit.load`` (``_is_torchscript_zip``: that exact name among the records, with or without a ``code/``)."""
    names = _zip_names(s) or []
    return any(n.count("/") == 1 and n.endswith("/constants.pkl") for n in names)


def _torch_package(s: Sniffed) -> bool:
    """A zip whose archive folder holds ``.data/extern_modules`` (what ``torch.package.PackageImporter`` reads
    first) and no ``data.pkl`` (which would make it a checkpoint ``torch.load`` reads)."""
    names = {name.lower() for name in _zip_names(s) or []}
    marks = (name for name in names if name.count("/") == 2 and name.endswith("/.data/extern_modules"))
    folders = {name.split("/", 1)[0] for name in marks}
    return any(f"{folder}/data.pkl" not in names for folder in folders)


def _legacy_torch(s: Sniffed) -> bool:
    from dtypecheck.loaders.formats.torch_legacy import looks_like_legacy_torch

    return looks_like_legacy_torch(s.head)


def _gguf(s: Sniffed) -> bool:
    return s.head.startswith(b"GGUF")


def _has_file(*patterns: str) -> Callable[[Sniffed], bool]:
    return lambda s: any(next(s.path.glob(pattern), None) is not None for pattern in patterns)


TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")

FORMATS: tuple[Format, ...] = (
    Format(
        "safetensors",
        "file",
        (".safetensors",),
        "safetensors",
        _safetensors,
        "dtypecheck.loaders.formats.safetensors_format:SafetensorsCheckpoint",
    ),
    Format(
        "torchscript",
        "file",
        TORCH_SUFFIXES,
        "TorchScript archive",
        _torchscript,
        "dtypecheck.loaders.formats.torchscript:TorchScriptCheckpoint",
    ),
    Format(
        "torch-package",
        "file",
        TORCH_SUFFIXES,
        "torch.package archive",
        _torch_package,
        "dtypecheck.loaders.formats.torch_package:TorchPackageCheckpoint",
    ),
    Format(
        "torch-zip",
        "file",
        TORCH_SUFFIXES,
        "torch.save zip",
        _zip,
        "dtypecheck.loaders.formats.torch_zip:TorchZipCheckpoint",
    ),
    Format(
        "torch-legacy",
        "file",
        TORCH_SUFFIXES,
        "legacy torch.save (Python 2 era too)",
        _legacy_torch,
        "dtypecheck.loaders.formats.torch_legacy:LegacyTorchCheckpoint",
    ),
    Format("gguf", "file", (".gguf",), "GGUF", _gguf, "dtypecheck.loaders.formats.gguf_format:GgufCheckpoint"),
    Format(
        "torch-dcp",
        "folder",
        (".distcp",),
        "torch.distributed.checkpoint folder",
        _has_file(".metadata"),
        "dtypecheck.loaders.formats.dcp:DcpCheckpoint",
        file_names=(".metadata",),
    ),
    Format(
        "hf-sharded",
        "folder",
        (),
        "Hugging Face sharded folder",
        _has_file("*.index.json"),
        "dtypecheck.loaders:open_index_folder",
        file_names=("*.index.json",),
    ),
)
"""Every format, in detection order (TorchScript and torch.package before the torch zip they also are)."""


def formats_of(kind: Literal["file", "folder"]) -> tuple[Format, ...]:
    return tuple(f for f in FORMATS if f.kind == kind)


def checkpoint_suffixes() -> tuple[str, ...]:
    """Every suffix of every format, once each, in table order."""
    return tuple(dict.fromkeys(suffix for f in FORMATS for suffix in f.suffixes))


def file_suffixes() -> tuple[str, ...]:
    """The suffixes of single-file formats: what a pre-commit hook should pass to ``scan-model``."""
    return tuple(dict.fromkeys(suffix for f in formats_of("file") for suffix in f.suffixes))


def pre_commit_pattern() -> str:
    """The ``files:`` regex of ``.pre-commit-hooks.yaml``: any single-file format's suffix."""
    return r"\.(" + "|".join(re.escape(s.removeprefix(".")) for s in file_suffixes()) + ")$"


NOT_WEIGHTS = ("training_args.bin", "scheduler.pt")
"""Files a Hugging Face Trainer saves beside the weights under a checkpoint's name that never hold a tensor: a
scan of one alone fails with ``no-tensors``, so the pre-commit hook leaves them out (``pre_commit_exclude``)."""


def pre_commit_exclude() -> str:
    """The ``exclude:`` regex of ``.pre-commit-hooks.yaml``: ``NOT_WEIGHTS`` in any folder."""
    return r"(^|/)(" + "|".join(re.escape(name) for name in NOT_WEIGHTS) + ")$"


def describe_formats() -> str:
    """``safetensors (.safetensors), ..., torch.distributed.checkpoint folder (.metadata + *.distcp), ...``."""
    parts = []
    for f in FORMATS:
        folder_names = [*f.file_names, *("*" + s for s in f.suffixes)]
        names = "/".join(f.suffixes) if f.kind == "file" else " + ".join(folder_names)
        parts.append(f"{f.description} ({names})")
    return ", ".join(parts)


def detect(path: Path) -> Format | None:
    """The file format of ``path`` by its content, or None (unreadable files included)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(SNIFF_BYTES)
    except OSError:
        return None
    sniffed = Sniffed(path, head, size)
    return next((f for f in formats_of("file") if f.detect(sniffed)), None)


def detect_folder(path: Path) -> Format | None:
    """The folder format of ``path`` by the files it holds, or None (a plain folder of checkpoint files)."""
    sniffed = Sniffed(path, b"", 0)
    return next((f for f in formats_of("folder") if f.detect(sniffed)), None)
