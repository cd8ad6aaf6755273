"""Checkpoint loaders, one module per format, each yielding ``TensorRecord``s lazily.

``open_checkpoint`` detects the format by content, never by file extension, from the rows of
``formats.FORMATS``. No loader executes anything from a checkpoint: pickles go through
``pickle_vm.SafeUnpickler``. See ``base`` for how to consume a ``Checkpoint``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from dtypecheck.errors import InputError, NotACheckpointError
from dtypecheck.loaders.base import Checkpoint, Finding, TensorRecord, TensorSource
from dtypecheck.loaders.formats import SNIFF_BYTES, describe_formats, detect, detect_folder
from dtypecheck.usercode import python_target


def open_checkpoint(target: str) -> Checkpoint:
    """Open a checkpoint file, a checkpoint folder, a live model ``file.py:factory``, or a Hugging Face Hub id
    ``org/name[@revision]`` (``hub.resolve_hub_id``; a local path that exists wins), by content.

    A checkpoint that holds no tensor at all gets a ``no-tensors`` finding at level ``fail`` (see
    ``NoTensors``): a scan that found nothing to judge never reads as "ok". (A file holding tensor data that
    its pickle does not lead to is an ``InputError`` of its loader instead.)
    """
    checkpoint = _open(target)
    if next(iter(checkpoint.records()), None) is None:
        return NoTensors(checkpoint)
    return checkpoint


def _open(target: str) -> Checkpoint:
    live = python_target(target)
    if live is not None and live[0].is_file():
        from dtypecheck.loaders.formats.live_model import open_live_model

        return open_live_model(target)
    path = Path(target)
    if not path.exists():
        from dtypecheck.loaders.hub import resolve_hub_id

        resolved = resolve_hub_id(target)  # org/name[@revision]; None when not shaped like one
        if resolved is None:
            raise InputError(f"no such file or directory: {target}")
        path = resolved
    from dtypecheck.loaders._io.pickle_globals import imports_beside

    # torch.load of this checkpoint, run from its folder or from here, imports what is shipped there: its globals
    # are judged knowing that (every pickle is read while the checkpoint opens).
    with imports_beside(path if path.is_dir() else path.parent, Path.cwd()):
        return _open_path(path)


def _open_path(path: Path) -> Checkpoint:
    if path.is_dir():
        folder_format = detect_folder(path)
        if folder_format is not None:
            return folder_format.open(path)
        from dtypecheck.loaders.formats.folders import open_folder

        return open_folder(path, open_file, lambda p: detect(p) is not None)
    return open_file(path)


def open_file(path: Path) -> Checkpoint:
    """Open one checkpoint file by its first bytes."""
    if not path.is_file():
        raise InputError(f"not a regular file: {path}")
    size = path.stat().st_size
    if size == 0:
        raise InputError(f"{path}: empty file")
    found = detect(path)
    if found is not None:
        return found.open(path)
    from dtypecheck.loaders._io.safetensors_head import truncated_safetensors_header

    with path.open("rb") as handle:
        head = handle.read(SNIFF_BYTES)
    declared = truncated_safetensors_header(head, size)
    if declared is not None:
        raise InputError(f"{path}: truncated safetensors file (header of {declared} bytes, file of {size})")
    from dtypecheck.loaders._io.pickle_files import side_file_findings

    # torch.load unpickles any file that is not a zip (a raw pickle of any protocol, a legacy tar): what it would
    # run there is judged, so such a file is a report of findings, not a "not a checkpoint" that hides them.
    runs = [f for f in side_file_findings(path, path.name) if f.kind != "unreadable-file" or f.level == "fail"]
    if runs:
        return PickleOnly(str(path), runs)
    raise NotACheckpointError(f"{path}: not a checkpoint: expected one of {describe_formats()}")


class PickleOnly:
    """A file dtypecheck reads no tensor from but whose pickles ``torch.load`` would run (a raw pickle, a legacy
    tar): its findings say what they reference."""

    format = "pickle"

    def __init__(self, source: str, findings: list[Finding]) -> None:
        self.source = source
        self.findings = findings

    def records(self) -> Iterator[TensorRecord]:
        return iter(())

    def parts(self) -> list[Checkpoint]:
        return [self]

    def close(self) -> None:
        pass


def open_index_folder(folder: Path) -> Checkpoint:
    """The ``hf-sharded`` folder format's opener: ``folders.open_index_folder`` with each shard opened by content
    (handed in, so that ``folders`` does not import this package back)."""
    from dtypecheck.loaders.formats.folders import open_index_folder as open_shards

    return open_shards(folder, open_file)


class NoTensors:
    """A checkpoint without a single tensor, with a ``no-tensors`` finding that says so plainly."""

    def __init__(self, inner: Checkpoint) -> None:
        self.inner = inner
        self.source = inner.source
        self.format = inner.format
        unread = sum(1 for f in inner.findings if f.kind == "unsupported-tensor")
        detail = (
            f"holds no tensor dtypecheck can read ({unread} not scanned: see the unsupported-tensor findings)"
            if unread
            else "holds no tensors: nothing was scanned (is it the weights file? training_args.bin and "
            "scheduler.pt hold none)"
        )
        self.finding = Finding("no-tensors", "fail", detail)

    @property
    def findings(self) -> list[Finding]:
        return [self.finding, *self.inner.findings]

    def records(self) -> Iterator[TensorRecord]:
        return iter(())

    def parts(self) -> list[Checkpoint]:
        return [self]

    def close(self) -> None:
        self.inner.close()


__all__ = ["Checkpoint", "Finding", "TensorRecord", "TensorSource", "open_checkpoint"]
