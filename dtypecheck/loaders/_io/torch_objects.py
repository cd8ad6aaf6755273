"""What torch's pickles mean, interpreted without torch.load: storages, tensor rebuilds, and key paths.

The safe unpickler hands every call to ``torch_call``; the known rebuild functions become ``TensorRef``s (a view of
a storage, by key), a few plain containers become plain data, everything else stays an inert ``PickleObject``.
``collect_tensors`` then walks the result and names each tensor by its key path.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from dtypecheck.errors import InputError
from dtypecheck.loaders._io.pickle_vm import GlobalRef, IdentityKey, PickleObject, _safe_key
from dtypecheck.loaders.base import MAX_TENSOR_DIMS, Finding, check_count

MAX_WALK_DEPTH = 1000
"""Deepest nesting of containers a checkpoint may have; deeper is a hostile file (names would grow quadratically)."""

TORCH_DTYPE_NAMES: frozenset[str] = frozenset(
    {
        "float64", "float32", "float16", "bfloat16", "double", "float", "half",
        "complex128", "complex64", "complex32", "cdouble", "cfloat", "chalf",
        "int64", "int32", "int16", "int8", "long", "int", "short", "uint8", "uint16", "uint32", "uint64", "bool",
        "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
        "qint8", "qint32", "quint8", "quint4x2", "quint2x4",
    }
)  # fmt: skip

_ALIASES = {
    "double": "float64", "float": "float32", "half": "float16", "cdouble": "complex128", "cfloat": "complex64",
    "chalf": "complex32", "long": "int64", "int": "int32", "short": "int16",
}  # fmt: skip

_STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool", "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64", "QInt8Storage": "qint8", "QInt32Storage": "qint32",
    "QUInt8Storage": "quint8", "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
    "UntypedStorage": "uint8",
}  # fmt: skip

_UNSUPPORTED_REBUILDS = {
    "_rebuild_qtensor": "quantized",
    "_rebuild_sparse_tensor": "sparse",
    "_rebuild_sparse_csr": "sparse",
    "_rebuild_nested_tensor": "nested",
    "_rebuild_meta_tensor_no_storage": "meta (no data)",
    "_rebuild_wrapper_subclass": "wrapper subclass",
    "_rebuild_device_tensor_from_numpy": "numpy-backed device",
    "_rebuild_mkldnn_tensor": "mkldnn",
    "_rebuild_xla_tensor": "xla",
}


def dtype_from_global(value: Any) -> str | None:
    """``torch.float32`` (a GlobalRef) -> ``"float32"``; None when ``value`` is not a torch dtype."""
    if isinstance(value, GlobalRef) and value.module == "torch" and value.name in TORCH_DTYPE_NAMES:
        return _ALIASES.get(value.name, value.name)
    return None


@cache
def torch_dtype_available(name: str) -> bool:
    import torch

    return isinstance(getattr(torch, name, None), torch.dtype)


@dataclass(frozen=True, eq=False)
class StorageRef:
    """A storage named by a pickle's persistent id: its key in the archive, dtype and saved location."""

    key: str
    dtype: str
    location: str
    declared_numel: int


@dataclass(frozen=True, eq=False)
class TensorRef:
    """A tensor as the pickle describes it: a strided view of a storage, by element offset."""

    storage: StorageRef
    dtype: str
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        expected = 1
        for size, step in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if size != 1 and step != expected:
                return False
            expected *= size
        return True

    def last_element(self) -> int:
        """Index of the last storage element the view touches (for a non-empty view)."""
        return self.offset + sum((size - 1) * step for size, step in zip(self.shape, self.stride, strict=True))


@dataclass(frozen=True, eq=False)
class UnsupportedTensor:
    """A tensor kind whose values cannot be read as a plain strided array (quantized, sparse, meta...)."""

    kind: str


def storage_from_pid(pid: Any) -> StorageRef:
    """Interpret a torch persistent id ``('storage', StorageType, key, location, numel[, view_metadata])``."""
    if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage":
        raise ValueError(f"unexpected persistent id {type(pid).__name__}")
    _, storage_type, key, location, numel = pid[:5]
    if len(pid) > 5 and pid[5] is not None:
        raise ValueError("storage views from torch < 0.4 are not supported")
    if not isinstance(storage_type, GlobalRef) or storage_type.name not in _STORAGE_DTYPES:
        raise ValueError(f"unknown storage type {storage_type}")
    if not isinstance(key, str | int) or not isinstance(location, str) or not isinstance(numel, int) or numel < 0:
        raise ValueError("malformed storage persistent id")
    if isinstance(key, int) and not 0 <= key <= INT64_MAX:
        raise ValueError("malformed storage persistent id (key out of range)")
    return StorageRef(str(key), _STORAGE_DTYPES[storage_type.name], location, numel)


def _int_tuple(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple | list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"tensor {what} is not a tuple of integers")
    if any(v < 0 for v in value):
        raise ValueError(f"tensor {what} has a negative entry")
    if any(v > INT64_MAX for v in value):
        raise ValueError(f"tensor {what} has an entry beyond int64 (torch cannot hold it)")
    return tuple(value)


INT64_MAX = 2**63 - 1
"""The largest size, stride or offset torch can hold; anything beyond is refused before it reaches a message
(Python will not print an int of more than 4300 digits) or ``torch.as_strided`` (which overflows)."""


def _rebuild_tensor(args: tuple[Any, ...], dtype: str | None) -> TensorRef:
    if len(args) < 4 or not isinstance(args[0], StorageRef):
        raise ValueError("tensor rebuild without a storage")
    storage, offset = args[0], args[1]
    if not isinstance(offset, int) or not 0 <= offset <= INT64_MAX:
        raise ValueError("tensor storage offset is not an integer between 0 and 2**63-1")
    shape, stride = _int_tuple(args[2], "shape"), _int_tuple(args[3], "stride")
    if len(shape) != len(stride):
        raise ValueError("tensor shape and stride differ in length")
    if len(shape) > MAX_TENSOR_DIMS:
        raise ValueError(f"a tensor of {len(shape)} dimensions, over the {MAX_TENSOR_DIMS} limit")
    return TensorRef(storage, dtype or storage.dtype, offset, shape, stride)


def torch_call(factory: Any, args: tuple[Any, ...], kwargs: dict[Any, Any] | None) -> Any:
    """The safe unpickler's call hook for torch checkpoints. Never calls anything."""
    if not isinstance(factory, GlobalRef):
        return PickleObject(factory, args, kwargs)
    module, name = factory.module, factory.name
    if module == "torch._utils" and name in {"_rebuild_tensor", "_rebuild_tensor_v2"}:
        return _rebuild_tensor(args, None)
    if module == "torch._utils" and name == "_rebuild_tensor_v3":
        dtype = dtype_from_global(args[6]) if len(args) > 6 else None
        if dtype is None:
            raise ValueError("_rebuild_tensor_v3 without a dtype")
        return _rebuild_tensor(args, dtype)
    if module == "torch._utils" and name in {"_rebuild_parameter", "_rebuild_parameter_with_state"}:
        return args[0] if args else PickleObject(factory, args, kwargs)
    if name == "_rebuild_from_type_v2" and module in {"torch._tensor", "torch._utils"} and len(args) >= 3:
        inner_args = args[2]
        return torch_call(args[0], tuple(inner_args) if isinstance(inner_args, tuple | list) else (), None)
    if module == "torch._utils" and name in _UNSUPPORTED_REBUILDS:
        return UnsupportedTensor(_UNSUPPORTED_REBUILDS[name])
    if factory.qualname == "collections.OrderedDict":
        # Python 3 pickles an OrderedDict's items with SETITEMS; Python 2 passed them as a list of [key, value]
        # lists (old torch files, e.g. lpips' weights). Keys keep the safe unpickler's hashing rules.
        result: dict[Any, Any] = {}
        if args and isinstance(args[0], list):
            pairs = [pair for pair in args[0] if isinstance(pair, tuple | list) and len(pair) == 2]
            result.update((_safe_key(key), value) for key, value in pairs)
        return result
    if factory.qualname == "torch.Size" and args and isinstance(args[0], tuple | list):
        return tuple(args[0])
    if factory.qualname in {"torch.serialization._get_layout", "torch.device"} and args:
        return ":".join(str(a) for a in args)
    if factory.qualname in {"_codecs.encode", "codecs.encode"} and args and isinstance(args[0], str):
        return args[0].encode("latin-1", errors="replace")
    if factory.qualname == "copyreg._reconstructor" and args:
        return PickleObject(args[0], args[2:3] if len(args) > 2 and args[2] is not None else ())
    return PickleObject(factory, args, kwargs)


def _children(value: Any) -> Iterator[tuple[str | None, Any]]:
    """(key, child) pairs; a ``None`` key keeps the parent's path (an object's state)."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield _key_text(key), child
    elif isinstance(value, list | tuple):
        for index, child in enumerate(value):
            yield str(index), child
    elif isinstance(value, PickleObject):
        for index, arg in enumerate(value.args):
            yield str(index), arg
        if value.kwargs:
            for key, child in value.kwargs.items():
                yield _key_text(key), child
        if _is_module_state(value.state):
            # A whole pickled nn.Module: name tensors as state_dict() does (fc.weight, not _modules.fc._parameters...)
            for key, child in value.state.items():
                yield (None if key in _MODULE_CONTAINERS else _key_text(key)), child
        elif value.state is not None:
            yield None, value.state
        for key, child in value.dict_items:
            yield _key_text(key), child
        for index, child in enumerate(value.list_items):
            yield str(index), child


_MODULE_CONTAINERS = frozenset({"_parameters", "_buffers", "_modules"})


def _is_module_state(state: Any) -> bool:
    return isinstance(state, dict) and "_parameters" in state and "_modules" in state


def _key_text(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool | int | float) or key is None:
        return repr(key)
    if isinstance(key, bytes):
        return key.decode("utf-8", errors="replace")
    if isinstance(key, IdentityKey | PickleObject | GlobalRef):
        return str(key)
    return str(key)[:200]


def require_tensors(tensors: list[tuple[str, TensorRef]], storages: int, where: str) -> None:
    """An ``InputError`` when the file holds tensor data but its pickle led to no tensor: a layout this reader
    does not understand must never pass as a file without tensors."""
    if storages and not tensors:
        raise InputError(
            f"{where}: holds {storages} tensor storage(s) but no tensor was found in its pickle "
            "(a layout dtypecheck does not read); nothing could be scanned"
        )


def collect_tensors(root: Any, where: str) -> tuple[list[tuple[str, TensorRef]], list[Finding]]:
    """Every tensor reachable from ``root`` with its key path (``a.b.0.c``), in the pickle's order.

    A container is expanded once (a shared sub-dict is named by its first path); a tensor reached by two keys
    (tied weights) is listed under both, as ``state_dict()`` lists it, up to ``MAX_ALIASES`` names for the same
    view of the same storage; further names of it are counted in one ``aliases`` finding instead (a pickle can
    name one tensor a million times in a few bytes each).
    """
    tensors: list[tuple[str, TensorRef]] = []
    findings: list[Finding] = []
    expanded: set[int] = set()
    names: dict[tuple[str, str, int, tuple[int, ...], tuple[int, ...]], list[str]] = {}
    unlisted: dict[tuple[str, str, int, tuple[int, ...], tuple[int, ...]], int] = {}
    pending: list[tuple[str, Any, int]] = [("", root, 0)]
    while pending:
        path, value, depth = pending.pop()
        if isinstance(value, TensorRef):
            key = (value.storage.key, value.dtype, value.offset, value.shape, value.stride)
            listed = names.setdefault(key, [])
            if len(listed) < MAX_ALIASES:
                listed.append(path or "(root)")
                tensors.append((path or "(root)", value))
                check_count(len(tensors), where)
            else:
                unlisted[key] = unlisted.get(key, 0) + 1
            continue
        if isinstance(value, UnsupportedTensor):
            findings.append(Finding("unsupported-tensor", "warn", f"{value.kind} tensor not scanned", path or "(root)"))
            continue
        if not isinstance(value, dict | list | tuple | PickleObject) or id(value) in expanded:
            continue
        if depth > MAX_WALK_DEPTH:
            raise InputError(f"{where}: pickle nests deeper than {MAX_WALK_DEPTH} levels")
        expanded.add(id(value))
        children = [
            (path if key is None else f"{path}.{key}" if path else key, child) for key, child in _children(value)
        ]
        pending.extend((child_path, child, depth + 1) for child_path, child in reversed(children))
    findings.extend(
        Finding("aliases", "warn", f"{count} more names view the same data as {names[key][0]!r} (not listed)")
        for key, count in unlisted.items()
    )
    return tensors, findings


MAX_ALIASES = 16
"""Names listed for one view of one storage; real checkpoints tie a weight to two or three names."""
