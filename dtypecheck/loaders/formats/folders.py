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
from dtypecheck.loaders.formats.side_files import is_file

MAX_INDEX_BYTES = 64 * 1024 * 1024
INDEX_PREFERENCE = (
    "model.safetensors.index.json", "diffusion_pytorch_model.safetensors.index.json", "pytorch_model.bin.index.json",
    "diffusion_pytorch_model.bin.index.json",
)  # fmt: skip
"""The index read when a folder holds several (the safetensors one first, as ``from_pretrained`` loads it)."""
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
    index = preferred_index(folder)
    if index is None:
        raise InputError(f"{folder}: no *.index.json file in this folder")
    sharded = open_sharded(index, open_file)
    try:
        sharded.add_findings(side_findings(folder, _scanned({index: sharded})))
    except BaseException:
        sharded.close()
        raise
    return sharded


def preferred_index(folder: Path) -> Path | None:
    """The shard index ``from_pretrained`` would load ``folder`` through: ``INDEX_PREFERENCE``'s first, else a
    safetensors index, else any ``*.index.json``; None when there is none."""
    indexes = sorted(p for p in folder.glob("*.index.json") if not p.is_dir())  # a FIFO is read, and refused
    preferred = [folder / name for name in INDEX_PREFERENCE if is_file(folder / name)]
    safetensors = [p for p in indexes if p.name.endswith(".safetensors.index.json")]
    return next(iter(preferred + safetensors + indexes), None)


def _is_index(path: Path) -> bool:
    return path.name.endswith(".index.json")


def _scanned(opened: dict[Path, Checkpoint]) -> set[Path]:
    """The files read for tensors: each opened file, or for an index the shards it names."""
    scanned: set[Path] = set()
    for path, checkpoint in opened.items():
        if _is_index(path):
            scanned.update(Path(part.source) for part in checkpoint.parts())
        else:
            scanned.add(path)
    return scanned


def open_folder(folder: Path, open_file: OpenFile, sniff: Callable[[Path], bool]) -> Checkpoint:
    """A folder of one or more checkpoint files (a folder with an index is ``open_index_folder``'s)."""
    files, unsniffed = _sniffed(folder, sniff)
    if not files and is_file(folder / "model_index.json"):
        return _open_pipeline(folder, open_file, sniff)
    if not files:
        raise InputError(f"{folder}: no checkpoint found in this folder")
    files = _one_of_each(files)
    modules, unsniffed_below = _module_weights(folder, sniff)
    # A file named like a checkpoint whose content is not one (truncated, corrupt) must not vanish silently.
    skipped = [
        Finding("unreadable-file", "warn", f"{label}: named like a checkpoint, but its content is not one (skipped)")
        for label in (p.relative_to(folder).as_posix() for p in unsniffed + unsniffed_below)
    ]
    # The folder is judged file by file: one file of no format dtypecheck reads (a torch.package archive) is that
    # file's finding, not the whole folder's exit 3; its pickles are still judged below, as every side file's.
    opened, unread, side = _open_judged(folder, files + modules, open_file)
    extra = skipped + unread + side
    top = {path: part for path, part in opened.items() if path.parent == folder}
    below: list[Checkpoint] = [
        PrefixedCheckpoint(part, f"{path.parent.relative_to(folder).as_posix()}/{path.stem}.")
        for path, part in opened.items()
        if path.parent != folder
    ]
    if len(files) == 1 and len(top) == 1 and not below:
        (single,) = top.values()
        return CompositeCheckpoint(str(folder), single.format, [single], extra) if extra else single
    if len(files) == 1 and len(top) == 1:  # one model file and a sentence-transformers module's: its names as they are
        return CompositeCheckpoint(str(folder), "folder", [*top.values(), *below], extra)
    # Several files (a Trainer checkpoint: model, optimizer, scheduler...): each file's names get its stem as a
    # prefix, so the optimizer's tensors read "optimizer.state.0.exp_avg_sq".
    stems = [p.stem for p in top]
    prefixes = stems if len(set(stems)) == len(stems) else [p.name for p in top]
    parts: list[Checkpoint] = [
        PrefixedCheckpoint(part, prefix + ".") for part, prefix in zip(top.values(), prefixes, strict=True)
    ]
    return CompositeCheckpoint(str(folder), "folder", parts + below, extra)


def _one_of_each(files: list[Path], also: tuple[tuple[str, str], ...] = ()) -> list[Path]:
    """``files`` less the ``pytorch_model.bin`` twin of a ``model.safetensors`` beside it (and of ``also``'s
    pairs): loaders read the safetensors one; the twin is judged as a side file."""
    names = {p.name for p in files}
    for safetensors, duplicate in (*SAME_WEIGHTS, *also):
        if safetensors in names:
            files = [p for p in files if p.name != duplicate]
    return files


def _sniffed(folder: Path, sniff: Callable[[Path], bool]) -> tuple[list[Path], list[Path]]:
    """The files directly in ``folder`` (hidden ones left out), sorted: those ``sniff`` takes for a checkpoint,
    and those named like one (``CHECKPOINT_SUFFIXES``) that it does not."""
    candidates = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    files = [p for p in candidates if sniff(p)]
    return files, [p for p in candidates if p not in files and p.suffix.lower() in CHECKPOINT_SUFFIXES]


def _module_weights(folder: Path, sniff: Callable[[Path], bool]) -> tuple[list[Path], list[Path]]:
    """The weight files of a sentence-transformers model's modules (``modules.json``: a Dense layer's
    ``2_Dense/model.safetensors``; a Router's routes, named by the ``types`` of its ``router_config.json``:
    ``2_Router/query_0_Dense/model.safetensors``), which ``SentenceTransformer(folder)`` loads beside the root
    model's: each such subfolder inside the folder, its checkpoint files directly in it. An unreadable or malformed
    JSON file names none (the library cannot load such a folder); a module path leaving the folder is
    ``shipped_code``'s fail. Also the files there named like a checkpoint that are not one (``_sniffed``)."""
    document = _small_json(folder / "modules.json")
    root = folder.resolve()
    found: list[Path] = []
    unsniffed: list[Path] = []

    def read(sub: Path) -> None:
        if not sub.is_dir() or sub.is_symlink() or not sub.resolve().is_relative_to(root) or sub.resolve() == root:
            return
        weights, named_only = _sniffed(sub, sniff)
        found.extend(p for p in _one_of_each(weights) if p not in found)
        unsniffed.extend(p for p in named_only if p not in unsniffed)
        router = _small_json(sub / "router_config.json")
        routes = router.get("types") if isinstance(router, dict) else None
        for name in routes if isinstance(routes, dict) else []:
            if isinstance(name, str) and name and name == Path(name).name:
                read(sub / name)

    for entry in document if isinstance(document, list) else []:
        where = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(where, str) and where:
            read(folder / where)
    return found, unsniffed


def _small_json(path: Path) -> Any:
    """``path`` parsed, or None when it is missing, not a regular file, too large or not JSON."""
    from dtypecheck.loaders._io.regular import read_regular_file

    if not is_file(path):
        return None
    try:
        return json.loads(read_regular_file(path, MAX_INDEX_BYTES, path.name))
    except (InputError, UnicodeDecodeError, ValueError, RecursionError):
        return None


def _open_pipeline(folder: Path, open_file: OpenFile, sniff: Callable[[Path], bool]) -> Checkpoint:
    """A diffusers pipeline folder (``model_index.json``, weights only in its components' subfolders: ``unet/``,
    ``vae/``, ``text_encoder/``...): the checkpoint files directly in each subfolder are read, their tensors named
    ``SUBFOLDER/STEM.NAME``; a sharded component is read through its index as ``from_pretrained`` loads it
    (``open_sharded``: a shard named outside the folder or missing fails, the index is checked against the shards);
    every other file of the folder is judged as ``side_findings`` judges them."""
    subfolders = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    files: list[Path] = []
    for sub in subfolders:
        index = preferred_index(sub)
        if index is not None:
            files.append(index)
            continue
        found = sorted(p for p in sub.iterdir() if p.is_file() and not p.name.startswith(".") and sniff(p))
        files.extend(_one_of_each(found, (_DIFFUSERS_WEIGHTS,)))
    if not files:
        raise InputError(f"{folder}: a diffusers pipeline (model_index.json) with no component weights found")

    def open_component(path: Path) -> Checkpoint:
        return open_sharded(path, open_file, f"{path.parent.name}/{path.name}") if _is_index(path) else open_file(path)

    opened, unread, side = _open_judged(folder, files, open_component)
    parts: list[Checkpoint] = [
        PrefixedCheckpoint(part, f"{path.parent.name}/{_weights_stem(path)}.") for path, part in opened.items()
    ]
    return CompositeCheckpoint(str(folder), "folder", parts, unread + side)


def _weights_stem(path: Path) -> str:
    """``diffusion_pytorch_model`` for that file, and for its shard index (``....safetensors.index.json``)."""
    return Path(path.name.removesuffix(".index.json")).stem if _is_index(path) else path.stem


def side_findings(folder: Path, scanned: set[Path]) -> list[Finding]:
    """Every file of ``folder`` and of its subfolders that is not scanned for tensors judged as its loaders would
    read it (``side_files.judge_below``), a distributed checkpoint among the subfolders read as ``dcp.load`` reads
    it."""
    from dtypecheck.loaders.formats.dcp import distributed_findings
    from dtypecheck.loaders.formats.side_files import judge_below

    return judge_below(folder, scanned, "", distributed_findings)


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


def _open_judged(
    folder: Path, files: list[Path], open_file: OpenFile
) -> tuple[dict[Path, Checkpoint], list[Finding], list[Finding]]:
    """``_open_each`` of ``files``, then the folder's other files judged (``side_findings``); what was opened is
    closed again when that judging refuses the folder."""
    opened, unread = _open_each(files, open_file)
    try:
        side = side_findings(folder, _scanned(opened))
    except BaseException:
        for part in opened.values():
            part.close()
        raise
    return opened, unread, side


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


def open_sharded(index: Path, open_file: OpenFile, label: str = "") -> CompositeCheckpoint:
    """A Hugging Face sharded checkpoint; the index is checked against what the shards hold. ``label`` (the
    index's path in a pipeline folder) starts each finding's detail."""
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
    if label:
        findings = [replace(f, detail=f"{label}: {f.detail}") for f in findings]
    return CompositeCheckpoint(str(folder), "hf-sharded", parts, findings)
