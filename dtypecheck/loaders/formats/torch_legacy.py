"""Legacy (non-zip) torch files, ``torch.save(..., _use_new_zipfile_serialization=False)``.

Layout: five pickles back to back (magic number, protocol version, system info, the object, the sorted list of
storage keys), then each storage as an int64 element count followed by its raw bytes. Only the pickles and the
8-byte counts are read; storages are located by walking the counts, each checked against the file size.
"""

from __future__ import annotations

import struct
from typing import Any

from dtypecheck.errors import InputError
from dtypecheck.loaders._io.mapped import FileCheckpoint, Window, itemsize_of, read_range
from dtypecheck.loaders._io.pickle_globals import global_findings, worst_first
from dtypecheck.loaders._io.pickle_vm import SafeUnpickler
from dtypecheck.loaders._io.torch_objects import (
    StorageRef,
    TensorRef,
    collect_tensors,
    require_tensors,
    storage_from_pid,
    torch_call,
)
from dtypecheck.loaders.base import TensorRecord
from dtypecheck.loaders.formats.torch_zip import check_total_work, make_record

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
MAGIC_PREFIX = b"\x80\x02\x8a\x0a" + MAGIC_NUMBER.to_bytes(10, "little")


def looks_like_legacy_torch(head: bytes) -> bool:
    return head.startswith(MAGIC_PREFIX)


class LegacyTorchCheckpoint(FileCheckpoint):
    format = "torch-legacy"

    def _parse(self) -> None:
        where = self.source
        stream = Window(self._map.buffer, 0, self._map.size)
        # torch.load unpickles all five pickles (not only the object): every one's globals are judged.
        machines: list[SafeUnpickler] = []

        def load(**hooks: Any) -> Any:
            machines.append(SafeUnpickler(stream, where=where, **hooks))
            return machines[-1].load()

        magic = load()
        protocol = load()
        if magic != MAGIC_NUMBER or protocol != PROTOCOL_VERSION:
            raise InputError(f"{where}: not a legacy torch file (magic {magic!r}, protocol {protocol!r})")
        sys_info = load()
        if isinstance(sys_info, dict) and sys_info.get("little_endian") is False:
            raise InputError(f"{where}: big-endian checkpoints are not supported")
        storages: dict[str, StorageRef] = {}

        def persistent_load(pid: Any) -> Any:
            if isinstance(pid, tuple) and len(pid) == 4 and pid[0] == "module":
                # A whole pickled nn.Module names each module class as ('module', cls, source file, source):
                # torch's _legacy_load returns the class (it only compares the saved source with the current one).
                return pid[1]
            storage = storage_from_pid(pid)
            storages.setdefault(storage.key, storage)
            return storage

        root = load(call=torch_call, persistent_load=persistent_load)
        keys = load()
        self.findings = global_findings(
            list(dict.fromkeys(ref for machine in machines for ref in machine.globals_seen))
        )
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise InputError(f"{where}: malformed storage key list")
        self._ranges = self._locate(keys, storages, stream.tell())
        self._tensors, unsupported = collect_tensors(root, where)
        require_tensors(self._tensors, len(keys), where)
        self.findings = worst_first([*self.findings, *unsupported])
        missing = {ref.storage.key for _, ref in self._tensors} - set(self._ranges)
        if missing:
            raise InputError(f"{where}: storage {sorted(missing)[0]} is missing from the file")
        self._records = [self._record(name, ref) for name, ref in self._tensors]  # bounds checked before any read
        check_total_work(self._records, self._map.size, where)
        from dtypecheck.loaders._io.pickle_files import polyglot_findings

        # torch.load tries tarfile.open before it reads this stream: a file that is also a tar runs the tar's.
        self.findings = worst_first(
            [*self.findings, *polyglot_findings(self._map.buffer, self._map.size, where, self.format)]
        )

    def _locate(self, keys: list[str], storages: dict[str, StorageRef], position: int) -> dict[str, tuple[int, int]]:
        buffer, size = self._map.buffer, self._map.size
        ranges: dict[str, tuple[int, int]] = {}
        for key in keys:
            if key not in storages:
                raise InputError(f"{self.source}: storage key {key!r} is not used by any tensor")
            if position + 8 > size:
                raise InputError(f"{self.source}: truncated file (storage {key} missing)")
            (numel,) = struct.unpack("<q", read_range(buffer, position, 8))
            nbytes = numel * itemsize_of(storages[key].dtype)
            if numel < 0 or position + 8 + nbytes > size:
                raise InputError(f"{self.source}: storage {key} of {numel} elements runs past the end (truncated?)")
            ranges[key] = (position + 8, nbytes)
            position += 8 + nbytes
        return ranges

    def _record(self, name: str, ref: TensorRef) -> TensorRecord:
        offset, nbytes = self._ranges[ref.storage.key]
        return make_record(name, ref, self._map.buffer, offset, nbytes, self.source, self._map.size)
