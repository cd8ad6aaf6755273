"""Checkpoints made of several files: Hugging Face sharded folders (``*.index.json``) and model folders.

A sharded checkpoint is a ``CompositeCheckpoint`` whose ``parts()`` are the shard files, each opened by content,
so a scanner can read shards in parallel. The index is checked against the shards' own headers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from dtypecheck.errors import InputError, NotACheckpointError
from dtypecheck.loaders._io.pickle_globals import worst_first
from dtypecheck.loaders.base import Checkpoint, Finding, TensorRecord
from dtypecheck.loaders.formats import checkpoint_suffixes

MAX_INDEX_BYTES = 64 * 1024 * 1024
INDEX_PREFERENCE = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SAME_WEIGHTS = (("model.safetensors", "pytorch_model.bin"), ("adapter_model.safetensors", "adapter_model.bin"))
"""Hugging Face folders often hold the same weights twice; the safetensors copy is read."""
_DIFFUSERS_WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")
OpenFile = Callable[[Path], Checkpoint]


class CompositeCheckpoint:
    """Several part checkpoints read as one; ``findings`` holds its own plus every part's, deduplicated."""

    def __init__(self, source: str, format: str, parts: list[Checkpoint], own_findings: list[Finding]) -> None:
        self.source = source
        self.format = format
        self._parts = parts
        self._own = own_findings

    @property
    def findings(self) -> list[Finding]:
        merged: dict[tuple[str, str, str, str | None], Finding] = {}
        for finding in [*self._own, *(f for part in self._parts for f in part.findings)]:
            merged.setdefault((finding.kind, finding.level, finding.detail, finding.tensor), finding)
        return worst_first(list(merged.values()))

    def add_findings(self, findings: list[Finding]) -> None:
        self._own.extend(findings)

    def records(self) -> Iterator[TensorRecord]:
        for part in self._parts:
            yield from part.records()

    def parts(self) -> list[Checkpoint]:
        return list(self._parts)

    def close(self) -> None:
        for part in self._parts:
            part.close()


CHECKPOINT_SUFFIXES = checkpoint_suffixes()


def open_index_folder(folder: Path, open_file: OpenFile) -> Checkpoint:
    """A folder holding a ``*.index.json`` with its shards (the safetensors index preferred), each shard opened
    by ``open_file``."""
    indexes = sorted(folder.glob("*.index.json"))
    preferred = [folder / name for name in INDEX_PREFERENCE if (folder / name).is_file()]
    sharded = open_sharded(preferred[0] if preferred else indexes[0], open_file)
    try:
        sharded.add_findings(side_findings(folder, {Path(part.source) for part in sharded.parts()}))
    except BaseException:
        sharded.close()
        raise
    return sharded


def open_folder(folder: Path, open_file: OpenFile, sniff: Callable[[Path], bool]) -> Checkpoint:
    """A folder of one or more checkpoint files (a folder with an index is ``open_index_folder``'s)."""
    candidates = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    files = [p for p in candidates if sniff(p)]
    if not files and _is_file(folder / "model_index.json"):
        return _open_pipeline(folder, open_file, sniff)
    if not files:
        raise InputError(f"{folder}: no checkpoint found in this folder")
    # A file named like a checkpoint whose content is not one (truncated, corrupt) must not vanish silently.
    skipped = [
        Finding("unreadable-file", "warn", f"{p.name}: named like a checkpoint, but its content is not one (skipped)")
        for p in candidates
        if p not in files and p.suffix.lower() in CHECKPOINT_SUFFIXES
    ]
    names = {p.name for p in files}
    for safetensors, duplicate in SAME_WEIGHTS:
        if safetensors in names:
            files = [p for p in files if p.name != duplicate]
    # The folder is judged file by file: one file of no format dtypecheck reads (a torch.package archive) is that
    # file's finding, not the whole folder's exit 3; its pickles are still judged below, as every side file's.
    opened, unread = _open_each(files, open_file)
    try:
        side = side_findings(folder, set(opened))
    except BaseException:
        for part in opened.values():
            part.close()
        raise
    extra = skipped + unread + side
    if len(files) == 1 and opened:
        (single,) = opened.values()
        return CompositeCheckpoint(str(folder), single.format, [single], extra) if extra else single
    # Several files (a Trainer checkpoint: model, optimizer, scheduler...): each file's names get its stem as a
    # prefix, so the optimizer's tensors read "optimizer.state.0.exp_avg_sq".
    stems = [p.stem for p in opened]
    prefixes = stems if len(set(stems)) == len(stems) else [p.name for p in opened]
    parts: list[Checkpoint] = [
        PrefixedCheckpoint(part, prefix + ".") for part, prefix in zip(opened.values(), prefixes, strict=True)
    ]
    return CompositeCheckpoint(str(folder), "folder", parts, extra)


def _open_pipeline(folder: Path, open_file: OpenFile, sniff: Callable[[Path], bool]) -> Checkpoint:
    """A diffusers pipeline folder (``model_index.json``, weights only in its components' subfolders: ``unet/``,
    ``vae/``, ``text_encoder/``...): the checkpoint files directly in each subfolder are read, their tensors named
    ``SUBFOLDER/STEM.NAME``; every file of the folder is judged as ``side_findings`` judges them. A component's
    shard index is not checked against its shards (each shard is read on its own)."""
    subfolders = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    files: list[Path] = []
    for sub in subfolders:
        found = sorted(p for p in sub.iterdir() if p.is_file() and not p.name.startswith(".") and sniff(p))
        names = {p.name for p in found}
        for safetensors, duplicate in (*SAME_WEIGHTS, _DIFFUSERS_WEIGHTS):
            if safetensors in names:
                found = [p for p in found if p.name != duplicate]
        files.extend(found)
    if not files:
        raise InputError(f"{folder}: a diffusers pipeline (model_index.json) with no component weights found")
    opened, unread = _open_each(files, open_file)
    try:
        side = side_findings(folder, set(opened))
    except BaseException:
        for part in opened.values():
            part.close()
        raise
    parts: list[Checkpoint] = [
        PrefixedCheckpoint(part, f"{path.parent.name}/{path.stem}.") for path, part in opened.items()
    ]
    return CompositeCheckpoint(str(folder), "folder", parts, unread + side)


MAX_SIDE_FILES = 20_000
"""Most files of a folder (its subfolders included) judged as ``torch.load`` would read them; past it, an
``unreadable-file`` ``fail`` (what the rest would run is unknown)."""
MAX_SIDE_DEPTH = 16
"""Deepest subfolder judged; a deeper one is an ``unreadable-file`` ``fail``."""
SKIPPED_FOLDERS = frozenset({".git"})
"""Subfolders no loader reads (a clone's object store, zlib data): never judged."""


def side_findings(folder: Path, scanned: set[Path]) -> list[Finding]:
    """Every file of ``folder`` and of its subfolders that is not scanned for tensors (``training_args.bin``
    beside an index, the ``pytorch_model.bin`` twin of ``model.safetensors``, a raw pickle of any protocol, a
    legacy tar, a Trainer's ``checkpoint-500/optimizer.pt``, a diffusers component's ``unet/*.bin``, an ``.npy`` or
    ``.npz`` of objects) has judged what ``torch.load`` or ``np.load(allow_pickle=True)`` of it would run: whoever
    loads the folder (resumes from it, loads a ``subfolder=``) runs it. ``torch.load`` accepts any file (it
    unpickles whatever is not a zip or a tar), so every file is read as it would, not only those that look like a
    pickle; every JSON file is checked for code ``trust_remote_code`` would import (``shipped_code``). A FIFO,
    socket or device among them is refused (``InputError``) before it is opened."""
    return _below_findings(folder, scanned, "")


def _below_findings(folder: Path, scanned: set[Path], prefix: str) -> list[Finding]:
    """``side_findings`` of ``folder``, each file labelled ``prefix`` + its path relative to ``folder``."""
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
        findings.extend(_distributed_findings(path, prefix + label, scanned))
    findings.extend(Finding("unreadable-file", "fail", detail) for detail in beyond)
    return findings


def _distributed_findings(path: Path, label: str, scanned: set[Path]) -> list[Finding]:
    """What ``dcp.load`` of a distributed checkpoint in a subfolder (an FSDP ``pytorch_model_fsdp_0/``) would
    run: its security findings, read as a scan of it reads them (its bytes items are ``torch.save`` archives inside
    its ``.distcp`` files, which no reading of a whole file finds), each naming the subfolder.

    A ``.metadata`` that is no distributed checkpoint's and references no global the unpickler could import (a
    plain text or JSON file some other tool wrote; text's ``c`` reads as a ``GLOBAL`` of no Python name) is no
    ``Metadata``: ``FileSystemReader.read_metadata`` ``pickle.load``s it and stops there (it fails, or sets
    ``storage_meta`` on a plain value, which fails), having run nothing. Such a
    subfolder is judged file by file like any other; any other unreadable one stays an ``unreadable-file`` fail."""
    from dtypecheck.findings import is_security
    from dtypecheck.loaders._io.pickle_files import file_globals, importable
    from dtypecheck.loaders.formats.dcp import DcpCheckpoint

    try:
        checkpoint = DcpCheckpoint(path)
    except InputError as exc:
        try:
            report = file_globals(path / ".metadata")
        except (InputError, OSError, ValueError):
            report = None
        if report is not None and not any(importable(ref) for ref in report.globals) and not report.limited:
            return _below_findings(path, scanned, label)
        return [Finding("unreadable-file", "fail", f"{label}: a distributed checkpoint dcp.load would read ({exc})")]
    try:
        found = [f for f in checkpoint.findings if is_security(f) or f.kind == "unreadable-file"]
    finally:
        checkpoint.close()
    return [replace(f, detail=f"{f.detail} (in {label})") for f in found]


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
                if _is_file(path / ".metadata"):
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


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


class PrefixedCheckpoint:
    """A part of a folder whose tensor names are prefixed with the file's stem."""

    def __init__(self, inner: Checkpoint, prefix: str) -> None:
        self.inner = inner
        self.prefix = prefix
        self.source = inner.source
        self.format = inner.format

    @property
    def findings(self) -> list[Finding]:
        return [replace(f, tensor=self.prefix + f.tensor) if f.tensor is not None else f for f in self.inner.findings]

    def records(self) -> Iterator[TensorRecord]:
        for record in self.inner.records():
            yield replace(record, name=self.prefix + record.name)

    def parts(self) -> list[Checkpoint]:
        return [self]

    def close(self) -> None:
        self.inner.close()


def _open_each(paths: list[Path], open_file: OpenFile) -> tuple[dict[Path, Checkpoint], list[Finding]]:
    """Each file opened, or, when it holds no format dtypecheck reads (``NotACheckpointError``), an
    ``unreadable-file`` warning in its place. Any other input error (truncated, hostile, refused) still ends
    the scan of the whole folder, as it would of that file alone."""
    opened: dict[Path, Checkpoint] = {}
    unread: list[Finding] = []
    try:
        for path in paths:
            try:
                opened[path] = open_file(path)
            except NotACheckpointError as error:
                reason = str(error).removeprefix(f"{path}: ")
                unread.append(Finding("unreadable-file", "warn", f"{path.name}: {reason} (skipped)"))
    except BaseException:
        for part in opened.values():
            part.close()
        raise
    return opened, unread


def _open_all(paths: list[Path], open_file: OpenFile) -> list[Checkpoint]:
    opened: list[Checkpoint] = []
    try:
        for path in paths:
            opened.append(open_file(path))
    except BaseException:
        for part in opened:
            part.close()
        raise
    return opened


def _read_index(index: Path) -> tuple[dict[str, str], Any]:
    from dtypecheck.loaders._io.regular import read_regular_file

    raw = read_regular_file(index, MAX_INDEX_BYTES, "index file")
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"{index}: malformed index JSON ({exc})") from None
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise InputError(f"{index}: index has no weight_map of tensor name -> shard file")
    metadata = document.get("metadata")
    total_size = metadata.get("total_size") if isinstance(metadata, dict) else None
    return weight_map, total_size


def open_sharded(index: Path, open_file: OpenFile) -> CompositeCheckpoint:
    """A Hugging Face sharded checkpoint; the index is checked against what the shards hold."""
    folder = index.parent
    weight_map, total_size = _read_index(index)
    findings: list[Finding] = []
    shard_names: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        shard_names.setdefault(shard, []).append(tensor)
    shards: list[str] = []
    for shard in sorted(shard_names):
        path = folder / shard
        inside = not Path(shard).is_absolute() and ".." not in Path(shard).parts
        if not inside:
            findings.append(Finding("missing-shard", "fail", f"index names a shard outside the folder: {shard}"))
        elif not path.is_file():
            findings.append(
                Finding("missing-shard", "fail", f"{shard} missing ({len(shard_names[shard])} tensors not scanned)")
            )
        else:
            shards.append(shard)
    parts = _open_all([folder / shard for shard in shards], open_file)
    real_total = 0
    for shard, part in zip(shards, parts, strict=True):
        listed = set(shard_names[shard])
        present: set[str] = set()
        for record in part.records():
            present.add(record.name)
            real_total += record.nbytes
            if record.name not in weight_map:
                findings.append(Finding("index-mismatch", "warn", f"not in the index, found in {shard}", record.name))
            elif weight_map[record.name] != shard:
                where = f"index says {weight_map[record.name]}, found in {shard}"
                findings.append(Finding("index-mismatch", "warn", where, record.name))
        findings.extend(
            Finding("index-mismatch", "fail", f"in the index but not in {shard}", name)
            for name in sorted(listed - present)
        )
    complete = len(shards) == len(shard_names)
    if complete and isinstance(total_size, int) and not isinstance(total_size, bool) and total_size != real_total:
        findings.append(
            Finding("index-total-size", "warn", f"index metadata.total_size {total_size} != {real_total} bytes")
        )
    return CompositeCheckpoint(str(folder), "hf-sharded", parts, findings)
