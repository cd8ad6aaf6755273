"""The files of a model folder that are not scanned for tensors, judged as their other loaders would read them.

Kept apart from ``folders`` (which opens the tensors) and ``dcp`` (which reads a distributed checkpoint), which both
judge a folder's other files this way: a distributed checkpoint in a subfolder is handed to the ``distributed``
reader the caller gives, so that neither module imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dtypecheck.loaders.base import Finding

DistributedReader = Callable[[Path, str, set[Path]], list[Finding]]
"""(subfolder holding a ``.metadata``, its label, the files scanned for tensors) -> what ``dcp.load`` of it would
run."""

MAX_SIDE_FILES = 20_000
"""Most files of a folder (its subfolders included) judged as ``torch.load`` would read them; past it, an
``unreadable-file`` ``fail`` (what the rest would run is unknown)."""
MAX_SIDE_DEPTH = 16
"""Deepest subfolder judged; a deeper one is an ``unreadable-file`` ``fail``."""
SKIPPED_FOLDERS = frozenset({".git"})
"""Subfolders no loader reads (a clone's object store, zlib data): never judged."""


def judge_below(folder: Path, scanned: set[Path], prefix: str, read_distributed: DistributedReader) -> list[Finding]:
    """Every file of ``folder`` and of its subfolders that is not scanned for tensors (``training_args.bin``
    beside an index, the ``pytorch_model.bin`` twin of ``model.safetensors``, a raw pickle of any protocol, a
    legacy tar, a Trainer's ``checkpoint-500/optimizer.pt``, a diffusers component's ``unet/*.bin``, an ``.npy`` or
    ``.npz`` of objects) has judged what ``torch.load`` or ``np.load(allow_pickle=True)`` of it would run: whoever
    loads the folder (resumes from it, loads a ``subfolder=``) runs it. ``torch.load`` accepts any file (it
    unpickles whatever is not a zip or a tar), so every file is read as it would, not only those that look like a
    pickle; every JSON file is checked for code ``trust_remote_code`` would import (``shipped_code``). A FIFO,
    socket or device among them is refused (``InputError``) before it is opened. Each file is labelled ``prefix``
    + its path relative to ``folder``; a subfolder holding a ``.metadata`` is read by ``read_distributed``."""
    from dtypecheck.loaders._io.pickle_files import side_file_findings
    from dtypecheck.loaders._io.regular import require_regular
    from dtypecheck.loaders._io.shipped_code import code_references

    findings: list[Finding] = []
    files, beyond, distributed = _files_below(folder)
    for path, label in files:
        if path in scanned or not path.exists():  # a dangling symlink: nothing torch could load
            continue
        require_regular(path)
        findings.extend(code_references(path, prefix + label))
        findings.extend(side_file_findings(path, prefix + label))
    for path, label in distributed:
        findings.extend(read_distributed(path, prefix + label, scanned))
    findings.extend(Finding("unreadable-file", "fail", detail) for detail in beyond)
    return findings


def _files_below(folder: Path) -> tuple[list[tuple[Path, str]], list[str], list[tuple[Path, str]]]:
    """(path, label relative to ``folder``) of every file below it, a folder level at a time, each level's names
    sorted; subfolders reached twice (symlinks) are read once. Also what was left out past the limits, and the
    subfolders that are distributed checkpoints (a ``.metadata``), read as such instead of file by file."""
    files: list[tuple[Path, str]] = []
    beyond: list[str] = []
    distributed: list[tuple[Path, str]] = []
    seen = {folder.resolve()}
    level: list[tuple[Path, str]] = [(folder, "")]
    for depth in range(MAX_SIDE_DEPTH + 1):
        below: list[tuple[Path, str]] = []
        for where, prefix in level:
            try:
                entries = sorted(where.iterdir())
            except OSError as exc:  # a subfolder this user cannot list: what it holds is unknown
                beyond.append(f"{prefix or folder}: cannot be listed ({exc.strerror or exc}): not judged")
                continue
            for path in entries:
                label = prefix + path.name
                if not path.is_dir():
                    files.append((path, label))
                    continue
                real = path.resolve()
                if path.name in SKIPPED_FOLDERS or real in seen:
                    continue
                seen.add(real)
                if is_file(path / ".metadata"):
                    distributed.append((path, label + "/"))
                else:
                    below.append((path, label + "/"))
            if len(files) > MAX_SIDE_FILES:
                beyond.append(f"{folder}: over {MAX_SIDE_FILES} files below it: the rest was not judged")
                return files[:MAX_SIDE_FILES], beyond, distributed
        if not below:
            return files, beyond, distributed
        if depth == MAX_SIDE_DEPTH:
            beyond.append(f"{below[0][1]}: nested over {MAX_SIDE_DEPTH} folders deep: not judged")
        level = below
    return files, beyond, distributed


def is_file(path: Path) -> bool:
    """``path.is_file()``, False where it cannot be asked (a name too long, a loop of links)."""
    try:
        return path.is_file()
    except OSError:
        return False
