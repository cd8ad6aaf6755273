"""``torch.package`` archives (``PackageExporter``): the tensors of their pickles, read without importing anything.

An archive is a zip under one folder: a pickle per resource (``<package path>/<resource>``, e.g.
``model/model.pkl``), the storages they share as ``.data/<key>.storage`` (persistent id ``("storage", StorageType,
key, location, numel)``, as ``torch.save``'s), the modules the exporter *externed* listed in ``.data/extern_modules``
(imported from the installed packages) and the source of every module it *interned* or mocked (``mymodel.py``,
``pkg/__init__.py``). ``PackageImporter.load_pickle`` resolves each global of a pickle through that tree (its
``_load_module``): a module under an extern name is the installed one, any other module is compiled from the
archive's own source and run. So:

- every pickle is read by the safe unpickler, its tensors named by their key paths (prefixed with the pickle's
  path in the archive when it holds more than one pickle);
- a global of an installed (extern) module is judged as in any pickle (``pickle_globals.judge``); a global whose
  module, or a package above it, is the archive's own source is ``fail`` (the archive's code runs), and so is one
  the importer cannot find at all (nothing but a broken or hand-made archive has one);
- a ``reduce_package`` persistent id (``func(importer, *args)``: how a ScriptModule is packaged) calls its global;
- the archive's Python sources are reported in one ``contains-code`` finding: ``fail`` when a pickle imports one of
  them, ``warn`` when none does (``importer.import_module`` of them would still run them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from dtypecheck.errors import InputError
from dtypecheck.loaders._io.mapped import FileCheckpoint
from dtypecheck.loaders._io.pickle_files import bytes_globals, importable, shown
from dtypecheck.loaders._io.pickle_globals import judge, worst_first
from dtypecheck.loaders._io.pickle_vm import GlobalRef, PickleObject, unpickle
from dtypecheck.loaders._io.torch_objects import (
    TensorRef,
    collect_tensors,
    require_tensors,
    torch_call,
)
from dtypecheck.loaders._io.zip_records import (
    ZipEntry,
    read_entry,
    record_key,
)
from dtypecheck.loaders.base import Finding, TensorRecord
from dtypecheck.loaders.formats.torch_zip import (
    StorageLookup,
    check_one_folder,
    check_total_work,
    make_record,
    open_archive,
)

EXTERN_LIST = ".data/extern_modules"
"""The record that makes a zip a package (``PackageImporter`` reads it first, and refuses an archive without it)."""
MAX_EXTERN_BYTES = 1 << 20
IMPLICIT_IMPORTS = frozenset({"numpy", "numpy.core", "numpy.core._multiarray_umath", "builtins"})
"""``torch.package.package_importer.IMPLICIT_IMPORT_ALLOWLIST``: imported from the installed packages even when
the archive does not extern them."""

Origin = Literal["installed", "archive", "missing"]


@dataclass
class _Node:
    """A node of ``PackageImporter``'s module tree (``_PackageNode``, ``_ModuleNode`` or ``_ExternNode``)."""

    kind: Literal["package", "module", "extern"] = "package"
    source: str | None = None
    children: dict[str, _Node] = field(default_factory=dict)


class ModuleTree:
    """Where ``PackageImporter`` takes each module from, built as its ``_add_extern`` and ``_add_file`` build it."""

    def __init__(self, externs: Iterable[str], records: Iterable[str]) -> None:
        self._root = _Node()
        for name in externs:
            *parents, last = name.split(".")
            package = self._package(parents)
            if package is not None and package.kind != "extern":
                package.children[last] = _Node("extern")
        for record in records:
            *folders, last = record.split("/")
            if folders[:1] == [".data"] and len(folders) > 1:
                continue  # the importer skips .data/'s subfolders (storages, TorchScript code)
            package = self._package(folders)
            if package is None or package.kind == "extern":
                continue  # PackageImporter refuses such an archive ("inconsistent module structure")
            if last == "__init__.py":
                package.source = record
            elif last.endswith(".py"):
                package.children[last.removesuffix(".py")] = _Node("module", record)

    def _package(self, atoms: list[str]) -> _Node | None:
        node = self._root
        for atom in atoms:
            child = node.children.setdefault(atom, _Node())
            if child.kind == "extern":
                return child
            if child.kind == "module":
                return None
            node = child
        return node

    def origin(self, module: str) -> tuple[Origin, str | None]:
        """Where importing ``module`` (and, first, each package above it) takes code from: ``installed`` (an extern
        or implicit import), ``archive`` (with the first of the archive's sources it runs) or ``missing`` (not found,
        or an empty package the archive only implies, which holds no name)."""
        atoms = module.split(".")
        for end in range(1, len(atoms) + 1):
            found, source = self._load(atoms[:end])
            if found != "empty":
                return found, source
        return "missing", None

    def _load(self, atoms: list[str]) -> tuple[Origin | Literal["empty"], str | None]:
        """``PackageImporter._load_module`` of one name: what it finds (an ``Origin`` or ``empty``, a package of
        the archive without an ``__init__.py``) and the source it runs."""
        node = self._root
        for atom in atoms:
            if node.kind == "module" or atom not in node.children:
                return ("installed" if ".".join(atoms) in IMPLICIT_IMPORTS else "missing"), None
            node = node.children[atom]
            if node.kind == "extern":
                return "installed", None
        return ("archive", node.source) if node.source is not None else ("empty", None)


@dataclass(frozen=True)
class _Judged:
    finding: Finding
    archive_source: str | None


class TorchPackageCheckpoint(FileCheckpoint):
    """A ``torch.package.PackageExporter`` archive: the tensors of every pickle it holds."""

    format = "torch-package"

    def _parse(self) -> None:
        where, buffer, size = self.source, self._map.buffer, self._map.size
        entries, prefix, findings = open_archive(buffer, size, where, check_one_folder)
        extern_entry = entries.get(record_key(prefix + EXTERN_LIST))
        if extern_entry is None:
            raise InputError(f"{where}: a torch.package archive without {EXTERN_LIST} (PackageImporter refuses it)")
        try:
            externs = read_entry(buffer, extern_entry, where, EXTERN_LIST, MAX_EXTERN_BYTES).decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{where}: {EXTERN_LIST} is not UTF-8 text") from None
        records = [name.removeprefix(prefix) for name in entries]
        tree = ModuleTree(externs.splitlines(), records)
        sources = sorted(name for name in records if name.endswith(".py") and not name.startswith(".data/"))
        resources = {
            name: read_entry(buffer, entries[record_key(prefix + name)], where, name)
            for name in records
            if not name.startswith(".data/") and name not in {"byteorder", *sources}
        }
        pickles = [name for name, data in resources.items() if data[:1] == b"\x80"]
        judged: list[_Judged] = []
        for name, data in resources.items():
            if name not in pickles:  # a text or binary resource: judged only for what the importer could import
                refs = [ref for ref in bytes_globals(data, where).globals if _importable(ref, tree)]
                judged.extend(_judge(ref, tree, f" (in {name})") for ref in refs)
        storages = _Storages(entries, prefix, where)
        tensors: list[tuple[str, TensorRef]] = []
        for name in pickles:
            root, seen = unpickle(resources.pop(name), where=where, call=torch_call, persistent_load=storages)
            called = storages.take_called()
            refs = [replace(ref, uses=ref.uses | {"call"}) if ref in called else ref for ref in seen]
            judged.extend(_judge(ref, tree, f" (in {name})" if len(pickles) > 1 else "") for ref in refs)
            found, unsupported = collect_tensors(root, where)
            findings.extend(unsupported)
            tensors.extend((f"{name}.{path}" if len(pickles) > 1 else path, ref) for path, ref in found)
        require_tensors(
            tensors, sum(name.startswith(".data/") and name.endswith(".storage") for name in records), where
        )
        self._records = [self._record(path, ref, storages.entry(ref.storage)) for path, ref in tensors]
        check_total_work(self._records, size, where)
        reached = sorted({j.archive_source for j in judged if j.archive_source is not None})
        if sources:
            findings.append(_code_finding(sources, reached))
        self.findings = worst_first([*(j.finding for j in judged), *findings])

    def _record(self, name: str, ref: TensorRef, entry: ZipEntry) -> TensorRecord:
        return make_record(name, ref, self._map.buffer, entry.offset, entry.size, self.source, self._map.size)


def _importable(ref: GlobalRef, tree: ModuleTree) -> bool:
    return importable(ref) and tree.origin(ref.module)[0] != "missing"


def _judge(ref: GlobalRef, tree: ModuleTree, where: str) -> _Judged:
    origin, source = tree.origin(ref.module)
    if origin == "installed":
        return _Judged(Finding("pickle-global", judge(ref)[0], shown(ref) + where), None)
    if origin == "archive":
        detail = f"{shown(ref)}{where}: PackageImporter imports it from the archive's own code ({source}) and runs it"
        return _Judged(Finding("pickle-global", "fail", detail), source)
    detail = f"{shown(ref)}{where}: neither in the archive nor among its extern modules (PackageImporter refuses it)"
    return _Judged(Finding("pickle-global", "fail", detail), None)


def _code_finding(sources: list[str], reached: list[str]) -> Finding:
    listed = ", ".join(sources[:5]) + (f" and {len(sources) - 5} more" if len(sources) > 5 else "")
    if reached:
        detail = (
            f"the archive holds Python code ({listed}) that PackageImporter.load_pickle compiles and runs to rebuild "
            f"its objects (its pickles import {', '.join(reached[:5])}; nothing was run here): load it only from a "
            "source you trust, "
            "or share the weights alone (a state_dict saved as safetensors)"
        )
        return Finding("contains-code", "fail", detail)
    detail = (
        f"the archive holds Python code ({listed}); its pickles do not import it, but PackageImporter.import_module "
        "of it would run it (nothing was run here)"
    )
    return Finding("contains-code", "warn", detail)


class _Storages(StorageLookup):
    """The persistent-id hook of a package's pickles: storages are ``.data/<key>.storage``; a ``reduce_package`` id
    (``func(importer, *args)``) stays inert, and the globals in it are recorded as called."""

    def __init__(self, entries: dict[str, ZipEntry], prefix: str, where: str) -> None:
        super().__init__(entries, prefix + ".data/", where, ".storage")
        self._called: set[GlobalRef] = set()

    def __call__(self, pid: object) -> Any:
        if isinstance(pid, tuple) and pid[:1] == ("reduce_package",):
            parts = [*pid[1:], *(item for part in pid[1:] if isinstance(part, tuple) for item in part)]
            self._called.update(part for part in parts if isinstance(part, GlobalRef))
            return PickleObject(GlobalRef("torch.package", "reduce_package"), pid[1:])
        return super().__call__(pid)

    def take_called(self) -> set[GlobalRef]:
        """The globals called by the ``reduce_package`` ids read since the last call."""
        called, self._called = self._called, set()
        return called
