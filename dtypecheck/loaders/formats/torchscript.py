"""TorchScript archives (``torch.jit.save``): a torch zip whose folder also holds ``code/`` and ``constants.pkl``.

The module's attributes are pickled in ``data.pkl`` (storages under ``data/``), the tensors its code uses as
constants in ``constants.pkl`` (storages under ``constants/``). Both pickles are read with the safe unpickler, like
any torch zip; nothing in ``code/`` is compiled or run. Tensors of ``data.pkl`` are named as ``state_dict()``
names them (``fc.weight``); constants are ``constants.0``, ``constants.1``...

TorchScript's own globals (the ``__torch__.*`` classes of its code, ``torch.jit._pickle.build_intlist`` and its
kin) are part of every archive; instead of one finding each, the archive gets one ``contains-code`` ``fail``, since
``torch.jit.load`` (and ``torch.load``, which hands it any zip holding ``constants.pkl``) compiles that code and
runs it while loading (a ``__setstate__`` runs as the module is unpickled: ``torch.from_file`` creates files, for
one). Any other global is reported as in every pickle.
"""

from __future__ import annotations

from typing import Any

from dtypecheck.loaders._io.mapped import FileCheckpoint
from dtypecheck.loaders._io.pickle_globals import global_findings, worst_first
from dtypecheck.loaders._io.pickle_vm import GlobalRef, unpickle
from dtypecheck.loaders._io.torch_objects import (
    collect_tensors,
    require_tensors,
    torch_call,
)
from dtypecheck.loaders._io.zip_records import (
    ZipEntry,
    read_entry,
)
from dtypecheck.loaders.base import Finding, TensorRecord
from dtypecheck.loaders.formats.torch_zip import StorageLookup, archive_prefix, make_record, open_archive

PICKLES = (("data.pkl", "data/", ""), ("constants.pkl", "constants/", "constants."))
"""(pickle, folder of its storages, prefix of its tensors' names)."""

CODE_ADVICE = (
    "torch.jit.load compiles and runs the Python code in its code/ folder ({files} files; nothing was run here): "
    "load it only from a source you trust, or share the weights alone (model.state_dict() saved as safetensors)"
)


def jit_call(factory: Any, args: tuple[Any, ...], kwargs: dict[Any, Any] | None) -> Any:
    """``torch_call``, plus the jit pickler's wrappers (``build_intlist(list)``, ``build_tensorlist(list)``,
    ``restore_type_tag(value, type)``), which stand for their first argument: ``ts.0``, not ``ts.0.0``."""
    if isinstance(factory, GlobalRef) and factory.module == "torch.jit._pickle" and args:
        return args[0]
    return torch_call(factory, args, kwargs)


def is_torchscript_global(ref: GlobalRef) -> bool:
    """A global every TorchScript archive references: its own compiled classes and the jit pickler's helpers."""
    return ref.module == "__torch__" or ref.module.startswith("__torch__.") or ref.module == "torch.jit._pickle"


class TorchScriptCheckpoint(FileCheckpoint):
    """A ``torch.jit.save`` archive (``.pt``, ``.pth``): its attributes' and constants' tensors."""

    format = "torchscript"

    def _parse(self) -> None:
        where, buffer, size = self.source, self._map.buffer, self._map.size
        entries, prefix, findings = open_archive(buffer, size, where, archive_prefix)
        records: list[TensorRecord] = []
        globals_seen: list[GlobalRef] = []
        for pickle_name, folder, name_prefix in PICKLES:
            entry = entries.get(prefix + pickle_name)
            if entry is None:
                continue
            storages = StorageLookup(entries, prefix + folder, where)
            root, seen = unpickle(self._read(entry, pickle_name), where=where, call=jit_call, persistent_load=storages)
            globals_seen.extend(ref for ref in seen if ref not in globals_seen)
            tensors, unsupported = collect_tensors(root, where)
            require_tensors(tensors, sum(name.startswith(prefix + folder) for name in entries), where)
            findings.extend(unsupported)
            for name, ref in tensors:
                storage = storages.entry(ref.storage)
                records.append(make_record(name_prefix + name, ref, buffer, storage.offset, storage.size, where, size))
        code_files = sum(1 for name in entries if name.startswith(prefix + "code/") and name.endswith(".py"))
        own = [ref for ref in globals_seen if not is_torchscript_global(ref)]
        findings.append(Finding("contains-code", "fail", CODE_ADVICE.format(files=code_files)))
        self.findings = worst_first([*global_findings(own), *findings])
        self._records = records

    def _read(self, entry: ZipEntry, what: str) -> bytes:
        return read_entry(self._map.buffer, entry, self.source, what)
