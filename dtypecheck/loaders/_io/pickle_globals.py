"""How dangerous is each global a pickle references? ``ok`` (data), ``warn`` (a class of an unknown package),
``fail`` (anything else that could run code).

The safe unpickler never imports any of them; this table only decides what a scan reports, so a checkpoint that
*would* run code under ``torch.load(weights_only=False)`` fails the scan even though scanning it is safe.

The rule is an allowlist, not a list of known-bad names (a denylist misses ``pkgutil.resolve_name``,
``_operator.methodcaller`` and every other gadget nobody listed):

- ``ok``: exactly the fully-qualified names in ``ALLOWED`` (what torch's own ``weights_only`` unpickler accepts,
  numpy arrays, dtypes and RNG state, the standard library's value types, ``torch.distributed.checkpoint``
  metadata), plus, checked against the real objects of already-imported torch/numpy modules, subclasses of
  ``torch.nn.Module`` defined under ``torch.nn.modules`` (a whole pickled model), of ``torch.optim.Optimizer``
  and ``LRScheduler`` under ``torch.optim``, of ``numpy.dtype`` in ``numpy.dtypes``, and enum classes in torch
  (calling an enum class only looks a member up).
- ``fail``: any other name of the standard library, torch or numpy; any name that walks attributes
  (protocol 4 resolves ``torch.nn.modules.module`` + ``__builtins__.get`` attribute by attribute, so only the whole
  path is judged) or touches a dunder; any name that is not a plain identifier; any function-like (not CapWords)
  name of any other module; the extension registry (``EXT1``/``EXT2``/``EXT4``).
- ``warn``: a CapWords class of a package outside the standard library, torch and numpy (Lightning's
  ``AttributeDict``, ``transformers.TrainingArguments``, ``omegaconf.DictConfig``, the user's own classes) that the
  pickle only rebuilds from plain state (no-argument ``NEWOBJ`` then ``BUILD`` of a dict) or calls with one plain
  value (an enum member): ``torch.load(weights_only=False)`` would import that package and make a bare instance,
  which is as safe as the package. ``fail_on="warn"`` (``--fail-on warn``) makes those fail too.
- ``fail`` as well: such a class that the pickle *calls* with arguments (``REDUCE``, ``NEWOBJ``/``NEWOBJ_EX``,
  ``INST``, ``OBJ``, or ``BUILD`` of a state only a custom ``__setstate__`` takes), since its code then runs on the
  pickle's data (``sympy.Lambda("x", code)`` evals ``code``); see ``_judge_class``.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from dtypecheck.findings import rank
from dtypecheck.loaders._io.pickle_vm import GlobalRef
from dtypecheck.loaders.base import Finding, Level

_STORAGE_NAMES = (
    "DoubleStorage", "FloatStorage", "HalfStorage", "BFloat16Storage", "LongStorage", "IntStorage", "ShortStorage",
    "CharStorage", "ByteStorage", "BoolStorage", "ComplexDoubleStorage", "ComplexFloatStorage", "QInt8Storage",
    "QInt32Storage", "QUInt8Storage", "QUInt4x2Storage", "QUInt2x4Storage",
)  # fmt: skip
_TENSOR_TYPE_NAMES = (
    "DoubleTensor", "FloatTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor", "ShortTensor",
    "CharTensor", "ByteTensor", "BoolTensor",
)  # fmt: skip
_TORCH_CONSTANTS = (
    "float64", "float32", "float16", "bfloat16", "double", "float", "half", "complex128", "complex64", "complex32",
    "cdouble", "cfloat", "chalf", "int64", "int32", "int16", "int8", "long", "int", "short", "uint8", "uint16",
    "uint32", "uint64", "bool", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
    "float8_e8m0fnu", "float4_e2m1fn_x2", "qint8", "qint32", "quint8", "quint4x2", "quint2x4", "bits1x8", "bits2x4",
    "bits4x2", "bits8", "bits16", "int1", "int2", "int3", "int4", "int5", "int6", "int7", "uint1", "uint2", "uint3",
    "uint4", "uint5", "uint6", "uint7",
    "strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn", "jagged",
    "contiguous_format", "channels_last", "channels_last_3d", "preserve_format",
    "per_tensor_affine", "per_channel_affine", "per_tensor_symmetric", "per_channel_symmetric",
    "per_channel_affine_float_qparams",
    "Size", "Tensor", "device", "dtype", "layout", "memory_format", "qscheme", "UntypedStorage", "TypedStorage",
)  # fmt: skip
_REBUILDS = (
    "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
    "_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_sparse_tensor", "_rebuild_sparse_csr",
    "_rebuild_nested_tensor", "_rebuild_meta_tensor_no_storage", "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_numpy", "_rebuild_device_tensor_from_cpu_tensor", "_rebuild_mkldnn_tensor",
    "_rebuild_xla_tensor",
)  # fmt: skip
_DCP_CLASSES = (
    "metadata.Metadata", "metadata.TensorStorageMetadata", "metadata.BytesStorageMetadata",
    "metadata.ChunkStorageMetadata", "metadata.TensorProperties", "metadata.MetadataIndex", "metadata.StorageMeta",
    "metadata._MEM_FORMAT_ENCODING", "filesystem._StorageInfo", "filesystem._StoragePrefix",
    "planner.WriteItemType", "planner.LoadItemType",
)  # fmt: skip
_STDLIB_VALUES = (
    "collections.OrderedDict", "collections.defaultdict", "collections.deque", "collections.Counter",
    "argparse.Namespace",  # Lightning's hparams: setattr on itself only
    "copyreg._reconstructor", "copyreg.__newobj__", "copyreg.__newobj_ex__",  # call only other (judged) globals
    "_codecs.encode", "codecs.encode",  # protocol 0-2 spelling of bytes
    "builtins.set", "builtins.frozenset", "builtins.slice", "builtins.list", "builtins.dict", "builtins.tuple",
    "builtins.bytearray", "builtins.bytes", "builtins.complex", "builtins.int", "builtins.float", "builtins.str",
    "builtins.bool", "builtins.range", "builtins.object",
    "pathlib.Path", "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib.PurePath", "pathlib.PurePosixPath",
    "pathlib.PureWindowsPath",
    "datetime.datetime", "datetime.date", "datetime.time", "datetime.timedelta", "datetime.timezone",
    "decimal.Decimal", "fractions.Fraction", "uuid.UUID", "enum.Enum",
)  # fmt: skip
_NUMPY = (
    "numpy.ndarray", "numpy.dtype", "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar", "numpy.core.numeric._frombuffer",
    "numpy._core.numeric._frombuffer",
    # RNG state, as Lightning and the HF Trainer save it
    "numpy.random._pickle.__randomstate_ctor", "numpy.random._pickle.__generator_ctor",
    "numpy.random._pickle.__bit_generator_ctor", "numpy.random.__RandomState_ctor", "numpy.random.mtrand.RandomState",
    "numpy.random._generator.Generator", "numpy.random._mt19937.MT19937", "numpy.random._pcg64.PCG64",
    "numpy.random._pcg64.PCG64DXSM", "numpy.random._philox.Philox", "numpy.random._sfc64.SFC64",
    "numpy.random.bit_generator.SeedSequence", "numpy.random.bit_generator.__pyx_unpickle_SeedSequence",
)  # fmt: skip

ALLOWED: frozenset[str] = frozenset(
    {
        *_STDLIB_VALUES,
        *_NUMPY,
        *(f"torch.{name}" for name in (*_STORAGE_NAMES, *_TENSOR_TYPE_NAMES, *_TORCH_CONSTANTS)),
        *(f"torch.cuda.{name}" for name in (*_STORAGE_NAMES, *_TENSOR_TYPE_NAMES)),
        *(f"torch.{kind}.{name}" for kind in ("sparse", "cuda.sparse") for name in _TENSOR_TYPE_NAMES),
        *(f"torch.storage.{name}" for name in ("UntypedStorage", "TypedStorage")),
        *(f"torch._utils.{name}" for name in _REBUILDS),
        *(f"torch.distributed.checkpoint.{name}" for name in _DCP_CLASSES),
        "torch._tensor._rebuild_from_type_v2",
        "torch.serialization._get_layout",
        "torch.nn.parameter.Parameter",
        "torch.nn.parameter.Buffer",
        "torch.nn.parameter.UninitializedParameter",
        "torch.nn.parameter.UninitializedBuffer",
    }
)
"""Exact fully-qualified names that are ``ok``: data types and the reconstruction helpers torch, numpy and the
standard library pickle with. Nothing here calls a callable it was not handed as another (judged) global."""

TRUSTED_ROOTS: frozenset[str] = frozenset({"torch", "numpy", "__builtin__", "copy_reg"} | set(sys.stdlib_module_names))
"""Top-level packages whose names are fully known here: whatever of theirs is not allowed fails."""

SHIPPED_WITH_TORCH: frozenset[str] = frozenset(
    {"sympy", "mpmath", "networkx", "jinja2", "markupsafe", "fsspec", "filelock", "typing_extensions", "setuptools"}
)
"""Packages installed with torch (its requirements and theirs): present wherever a checkpoint is loaded, and none of
them defines data a checkpoint needs, so a class of theirs that a pickle calls fails even with one argument."""

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CLASS_NAME = re.compile(r"^_?[A-Z][A-Za-z0-9_]*$")
_SUBCLASS_RULES: tuple[tuple[str, str, str], ...] = (
    ("torch.nn.modules.", "torch.nn", "Module"),
    ("torch.optim.", "torch.optim", "Optimizer"),
    ("torch.optim.lr_scheduler", "torch.optim.lr_scheduler", "LRScheduler"),
    ("numpy.dtypes", "numpy", "dtype"),
)
"""(module prefix, where the base class lives, base class): classes under the prefix that subclass it are ok."""


def classify(ref: GlobalRef) -> Level:
    """The level a scan reports for a pickle that references ``ref``."""
    return judge(ref)[0]


def judge(ref: GlobalRef) -> tuple[Level, str]:
    """(level, why) for one global."""
    module, name = ref.module, ref.name
    if module.startswith("copyreg.extension"):
        return "fail", "the extension registry can name any callable"
    parts = module.split(".")
    if not all(_IDENTIFIER.match(part) for part in parts) or not _IDENTIFIER.match(name.replace(".", "_") or "-"):
        return "fail", "not a plain Python name"
    if "." in name:
        return "fail", "resolved attribute by attribute (only exact names are trusted)"
    if ref.qualname in ALLOWED:
        return "ok", "data"
    if any(part.startswith("__") and part.endswith("__") for part in (*parts, name)) and module != "__main__":
        return "fail", "reaches into a dunder attribute"
    if _known_safe_class(module, name):
        return "ok", "data"
    if parts[0] in TRUSTED_ROOTS:
        return "fail", "can run code or touch files under torch.load(weights_only=False)"
    if _CLASS_NAME.match(name):
        return _judge_class(ref, parts[0])
    return "fail", "a function of an unvetted package: torch.load(weights_only=False) would call it"


def _judge_class(ref: GlobalRef, root: str) -> tuple[Level, str]:
    """A class of a package outside the standard library, torch and numpy: ``warn`` when it is only rebuilt from
    plain state (as a dataclass or ``TrainingArguments`` is), ``fail`` when the pickle calls it with arguments (its
    ``__init__``/``__new__``/``__setstate__`` then runs on the pickle's data: ``sympy.Lambda("x", code)`` evals
    ``code``). A call with one plain value is how an enum member is pickled (``IntervalStrategy("steps")`` in
    ``training_args.bin``) and stays ``warn``, except in the packages that ship with torch, whose names are known."""
    module = ref.module
    if ref.called and (not ref.single_value or root in SHIPPED_WITH_TORCH):
        return (
            "fail",
            f"a class of {module} that the pickle calls with arguments: torch.load would run its code on them",
        )
    if ref.called:
        return "warn", f"a class of an unvetted package called with one value (an enum member?): imports {module}"
    return "warn", f"class of an unvetted package: torch.load(weights_only=False) would import {module}"


def _known_safe_class(module: str, name: str) -> bool:
    """Whether ``module.name`` is, in the already-imported real module, a class the rules above allow. Nothing is
    imported and no attribute hook runs: the module's ``__dict__`` is read directly."""
    if module.split(".", maxsplit=1)[0] == "torch":
        import torch  # noqa: F401  (dtypecheck's own dependency: its classes are the reference)
    loaded = sys.modules.get(module)
    if loaded is None or not isinstance(getattr(loaded, "__dict__", None), dict):
        return False
    value: Any = vars(loaded).get(name)
    if not isinstance(value, type) or getattr(value, "__module__", None) != module:
        return False
    if module.split(".", maxsplit=1)[0] == "torch":
        import enum

        if issubclass(value, enum.Enum):
            return True
    for prefix, base_module, base_name in _SUBCLASS_RULES:
        if module.startswith(prefix) and base_module in sys.modules:
            base = vars(sys.modules[base_module]).get(base_name)
            if isinstance(base, type) and issubclass(value, base):
                return True
    return False


def global_findings(refs: list[GlobalRef]) -> list[Finding]:
    """One ``pickle-global`` finding per referenced global (detail ``module.name``), worst first, then in the
    stream's order. A ``fail`` global would run code under ``torch.load(weights_only=False)``; it was not run."""
    return worst_first([Finding("pickle-global", classify(ref), ref.qualname) for ref in refs])


def worst_first(findings: list[Finding]) -> list[Finding]:
    """Findings sorted fail, warn, ok; stable within a level."""
    return sorted(findings, key=lambda f: -rank(f.level))
