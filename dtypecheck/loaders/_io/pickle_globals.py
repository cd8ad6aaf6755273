"""How dangerous is each global a pickle references? ``ok`` (inert), ``warn`` (a vetted framework class, rebuilt
only as plain data), ``fail`` (anything that can run code under ``torch.load(weights_only=False)``).

The safe unpickler never imports any of them; this table only decides what a scan reports, so a checkpoint that
*would* run code under ``torch.load(weights_only=False)`` fails the scan even though scanning it is safe. The rule
fails closed: a global is judged by its name *and* by how the stream uses it (``pickle_vm.USES``).

- ``ok``: exactly the fully-qualified names in ``ALLOWED`` (what torch's own ``weights_only`` unpickler accepts,
  numpy arrays, dtypes and RNG state, the standard library's value types, ``torch.distributed.checkpoint``
  metadata), plus, checked against the real objects of already-imported torch/numpy modules, subclasses of
  ``torch.nn.Module`` defined under ``torch.nn.modules`` (a whole pickled model, rebuilt by torch's own code), of
  ``torch.optim.Optimizer`` and ``LRScheduler`` under ``torch.optim``, of ``numpy.dtype`` in ``numpy.dtypes``, and
  enum classes in torch; plus a *plain reference* (pushed and stored, never called, constructed, built or handed
  to a call) to a public function of ``torch.nn.functional`` or ``torch._C._nn`` (``torch.nn.functional.relu`` as
  a TransformerEncoderLayer's activation) or a numpy scalar type. Any other torch or numpy name stored as a value
  fails: code that runs on the loaded object may call it (``Optimizer.__setstate__`` calls ``self.state.get(p,
  [])``, and a rebuilt module whose ``get`` attribute is ``numpy.savetxt`` writes the file ``p`` names). Even the
  allowed ones fail when the stream ``BUILD``s onto the global itself (monkeypatching a module or class), calls
  an instance of it, calls a module, optimizer or scheduler class with arguments (``torch.save`` only ever makes a
  bare instance and ``BUILD``s its ``__dict__``; ``torch.nn.Linear(10**6, 10**6)`` allocates 4 TB), or calls one
  of ``pickle_vm.SIZED_CALLS`` with a size over ``SIZE_LIMIT`` (``bytearray(10**12)``, ``range(10**12)``).
- ``warn``: a class of ``VETTED`` (framework classes that frameworks really pickle, ``TrainingArguments`` and its
  enums), used only the way its entry allows (a bare instance then ``BUILD`` of a plain ``__dict__``, or an enum
  called with one plain value), whose top-level package is not shipped beside the checkpoint. A test checks each
  real installed class is inert on that path (no own ``__new__``, ``__setstate__``, ``__getattr__``,
  ``__setattr__``, enum ``_missing_``). ``--fail-on warn`` makes those fail too.
- ``fail``: everything else: any name that walks attributes (protocol 4 resolves ``torch.nn.modules.module`` +
  ``__builtins__.get`` attribute by attribute) or touches a dunder, any name that is not a plain identifier, the
  extension registry, any other name of the standard library, torch or numpy that is used (called, constructed,
  built, handed to a call), any global of any other package whatever it is reached through (importing an unvetted
  module runs its code), and any global whose top-level module is shipped beside the checkpoint or in the working
  folder (``torch.load`` run there imports it from ``sys.path[0]``; see ``imports_beside``).
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from importlib.machinery import all_suffixes
from pathlib import Path
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

VETTED: dict[str, str] = {
    # transformers.Trainer's training_args.bin: the dataclass (NEWOBJ without arguments, BUILD of its __dict__)
    # and the enums its fields hold (IntervalStrategy("steps"))
    "transformers.training_args.TrainingArguments": "state",
    "transformers.training_args_seq2seq.Seq2SeqTrainingArguments": "state",
    "transformers.trainer_pt_utils.AcceleratorConfig": "state",  # TrainingArguments.accelerator_config
    "accelerate.state.PartialState": "state",  # TrainingArguments.distributed_state (its __getattr__ only raises)
    "transformers.training_args.OptimizerNames": "enum",
    "transformers.trainer_utils.IntervalStrategy": "enum",
    "transformers.trainer_utils.SaveStrategy": "enum",
    "transformers.trainer_utils.HubStrategy": "enum",
    "transformers.trainer_utils.SchedulerType": "enum",
    "transformers.trainer_utils.FSDPOption": "enum",
    "transformers.debug_utils.DebugOption": "enum",
    "transformers.utils.generic.PaddingStrategy": "enum",
    "accelerate.utils.dataclasses.DistributedType": "enum",
    # joblib.dump's stand-in for a numpy array (sklearn models, scalers): joblib.load reads the array's bytes after
    # it (pickle_files reads past them the same way), and importing joblib runs only joblib's own code
    "joblib.numpy_pickle.NumpyArrayWrapper": "state",
}
"""Framework classes rebuilt only as plain data (``warn``), each with the one way a pickle may use it: ``state``
(a bare instance, then ``BUILD`` of a plain ``__dict__``) or ``enum`` (called with one plain value: a member
lookup). ``tests/security/test_gate_globals.py`` checks every installed class here is inert on that path."""

_VETTED_USES: dict[str, frozenset[str]] = {
    "state": frozenset({"new", "state"}),
    "enum": frozenset({"value"}),
}


@dataclass(frozen=True)
class Shipped:
    """What ``torch.load`` run beside the checkpoint could import from there instead of the installed packages."""

    names: frozenset[str] = frozenset()
    """Top-level names importable from the checkpoint's folder or the working folder (files, packages, and any
    folder, which imports as a namespace package): a global under one of them imports the shipped one."""
    code: frozenset[str] = frozenset()
    """Modules with code of their own in the checkpoint's folder (``NAME.py``, compiled modules, packages with an
    ``__init__``): any import that torch has not already done may reach one of them (``torch.utils.tensorboard``
    imports ``tensorboard``). The working folder is the project's own, whose packages are not counted here."""


NOTHING_SHIPPED = Shipped()
_BESIDE: ContextVar[tuple[Path | None, Path | None, list[Shipped]]] = ContextVar(
    "imports_beside", default=(None, None, [])
)
_MODULE_SUFFIXES = tuple(all_suffixes())


@contextmanager
def imports_beside(checkpoint_folder: Path, working_folder: Path | None = None) -> Iterator[None]:
    """Judge the globals read inside this block knowing what ``torch.load`` run from the checkpoint's folder, or
    from the working folder, could import from them."""
    working = None if working_folder is None else working_folder.resolve()
    token = _BESIDE.set((checkpoint_folder.resolve(), working, []))  # the list: the folders' Shipped, once read
    try:
        yield
    finally:
        _BESIDE.reset(token)


def shipped() -> Shipped:
    """``Shipped`` for the folders of the enclosing ``imports_beside`` (nothing outside one)."""
    checkpoint_folder, working_folder, cache = _BESIDE.get()
    if checkpoint_folder is None:
        return NOTHING_SHIPPED
    if not cache:  # a folder of many shards judges many pickles: its listing is read once
        beside = _modules_in(checkpoint_folder)
        here = _modules_in(working_folder) if working_folder not in (None, checkpoint_folder) else {}
        code = frozenset(name for name, has_code in beside.items() if has_code)
        cache.append(Shipped(frozenset(beside) | frozenset(here), code))
    return cache[0]


def shipped_modules(folder: Path) -> dict[str, bool]:
    """Top-level module names importable from ``folder``, each with whether it holds code of its own."""
    return _modules_in(folder)


def _modules_in(folder: Path | None) -> dict[str, bool]:
    names: dict[str, bool] = {}
    try:
        entries = list(folder.iterdir()) if folder is not None else []
    except OSError:
        return names
    for entry in entries:
        stem = entry.name
        for suffix in _MODULE_SUFFIXES:
            if stem.endswith(suffix):
                names.setdefault(stem[: -len(suffix)], True)
                break
        else:
            if _is_folder(entry):
                names[stem] = names.get(stem, False) or _exists(entry / "__init__.py")
    # ``__init__.py`` (the checkpoint's folder is a package itself) and ``__pycache__`` are no top-level module
    return {name: code for name, code in names.items() if name.isidentifier() and not name.startswith("__")}


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:
        return False


def _is_folder(entry: Path) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CLASS_NAME = re.compile(r"^_?[A-Z][A-Za-z0-9_]*$")
_SUBCLASS_RULES: tuple[tuple[str, str, str], ...] = (
    ("torch.nn.modules.", "torch.nn", "Module"),
    ("torch.optim.", "torch.optim", "Optimizer"),
    ("torch.optim.lr_scheduler", "torch.optim.lr_scheduler", "LRScheduler"),
    ("numpy.dtypes", "numpy", "dtype"),
)
"""(module prefix, where the base class lives, base class): classes under the prefix that subclass it are ok."""


def classify(ref: GlobalRef, beside: Shipped | None = None) -> Level:
    """The level a scan reports for a pickle that references ``ref``."""
    return judge(ref, beside)[0]


def judge(ref: GlobalRef, beside: Shipped | None = None) -> tuple[Level, str]:
    """(level, why) for one global. ``beside``: what is shipped beside the checkpoint (default: ``shipped()``,
    that of the enclosing ``imports_beside``)."""
    module, name = ref.module, ref.name
    if module.startswith("copyreg.extension"):
        return "fail", "the extension registry can name any callable"
    parts = module.split(".")
    if not all(_IDENTIFIER.match(part) for part in parts) or not _IDENTIFIER.match(name.replace(".", "_") or "-"):
        return "fail", "not a plain Python name"
    if "." in name:
        return "fail", "resolved attribute by attribute (only exact names are trusted)"
    beside = shipped() if beside is None else beside
    if parts[0] in beside.names:
        return "fail", f"a module {parts[0]!r} is shipped beside the checkpoint: torch.load run there imports it"
    if "patched" in ref.uses:
        return "fail", "the pickle sets attributes of the global itself (BUILD onto a module or class)"
    if "instance-called" in ref.uses:
        return "fail", "the pickle calls an instance of it that it rebuilt"
    if beside.code and not _imported_with_torch(module) and ref.qualname not in ALLOWED:
        return "fail", f"importing {module} may import a module shipped beside the checkpoint"
    if "sized" in ref.uses:
        return "fail", (
            "called with a size the gate cannot bound (over 16 Mi elements): torch.load would allocate or loop that "
            "much (bytearray(10**12), torch.FloatStorage(10**12)); torch.save never calls it with a size"
        )
    if ref.qualname in ALLOWED:
        return "ok", "data"
    if any(part.startswith("__") and part.endswith("__") for part in (*parts, name)):
        return "fail", "reaches into a dunder attribute"
    if _known_safe_class(module, name):
        if ref.uses <= (_SAFE_CLASS_USES if _is_module_like(module, name) else _SAFE_CLASS_USES | {"value"}):
            return "ok", "data"
        return "fail", (
            f"a torch module, optimizer, scheduler or enum class, but {_how(ref)}: torch.load would run its "
            "constructor on the pickle's arguments (torch.nn.Linear(10**6, 10**6) allocates 4 TB); torch.save "
            "rebuilds these as a bare instance and a BUILD of its __dict__ (an enum: a lookup by one value)"
        )
    if parts[0] in {"torch", "numpy"} and not ref.uses and _inert_reference(module, name):
        return "ok", "a plain reference to an activation function or a numpy scalar type (stored, never called)"
    if parts[0] in {"torch", "numpy"} and not ref.uses:
        return "fail", (
            "a plain reference, but to no activation function or scalar type: code that unpickles or uses the object "
            "holding it may call it (an optimizer's __setstate__ calls its state's get)"
        )
    if parts[0] in TRUSTED_ROOTS:
        return "fail", f"{_how(ref)}: can run code or touch files under torch.load(weights_only=False)"
    kind = VETTED.get(ref.qualname)
    if kind is not None and ref.uses <= _VETTED_USES[kind]:
        return "warn", f"a vetted {kind} class of {parts[0]}, rebuilt as plain data: torch.load imports {module}"
    if kind is not None:
        return (
            "fail",
            f"a vetted class of {parts[0]}, but {_how(ref)}: torch.load would run its code on the pickle's data",
        )
    return "fail", f"{_how(ref)}: torch.load(weights_only=False) would import {module} (unvetted) and run its code"


_SAFE_CLASS_USES = frozenset({"new", "state"})
"""How a pickle may use a class that ``_known_safe_class`` allows: a bare instance (``new``) given a plain
``__dict__`` (``state``), as ``torch.save`` pickles modules, optimizers and schedulers; torch's enums and numpy's
dtype classes may also be called with one plain value (``value``: a member lookup). Calling a module, optimizer or
scheduler class, even with one value (``torch.nn.BatchNorm1d(10**12)``), runs its constructor."""


def _is_module_like(module: str, name: str) -> bool:
    """Whether the allowed class ``module.name`` is a torch module, optimizer or scheduler (not an enum, not a
    numpy dtype class): one whose constructor allocates from its arguments."""
    if module.split(".", maxsplit=1)[0] != "torch":
        return False
    import enum

    value: Any = vars(sys.modules[module]).get(name)
    return not (isinstance(value, type) and issubclass(value, enum.Enum))


def _imported_with_torch(module: str) -> bool:
    """Whether ``module`` is already imported once torch is (``torch.load`` runs after ``import torch``), so that
    importing it again runs nothing, shipped modules or not. This process's imports stand for torch.load's."""
    import torch  # noqa: F401  (dtypecheck's own dependency)

    return module in sys.modules


def _how(ref: GlobalRef) -> str:
    uses = sorted(ref.uses)
    return f"used as {'/'.join(uses)}" if uses else "referenced"


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


_ACTIVATION_MODULES = ("torch.nn.functional", "torch._C._nn")
"""Where the activation functions a pickled transformer layer stores live (``F.relu``; ``F.gelu`` pickles as
``torch._C._nn.gelu``)."""


def _inert_reference(module: str, name: str) -> bool:
    """Whether a plain reference to ``module.name`` stays inert wherever the pickle stores it, even where code that
    runs on the loaded object calls it (``Optimizer.__setstate__`` calls ``self.state.get(param, [])``: a state
    whose ``get`` is ``numpy.savetxt`` writes a file): a public function of ``_ACTIVATION_MODULES`` (tensor maths)
    or a numpy scalar type, checked against the already-imported real module (nothing is imported)."""
    if module.split(".", maxsplit=1)[0] == "torch":
        import torch  # noqa: F401  (dtypecheck's own dependency: its functions are the reference)
    loaded = sys.modules.get(module)
    if loaded is None or not isinstance(getattr(loaded, "__dict__", None), dict):
        return False
    value: Any = vars(loaded).get(name)
    if module in _ACTIVATION_MODULES:
        functions = (types.FunctionType, types.BuiltinFunctionType)
        own = getattr(value, "__module__", None) in _ACTIVATION_MODULES
        return isinstance(value, functions) and own and not name.startswith("_")
    if module.split(".", maxsplit=1)[0] == "numpy" and "numpy" in sys.modules:
        generic = vars(sys.modules["numpy"]).get("generic")
        return isinstance(value, type) and isinstance(generic, type) and issubclass(value, generic)
    return False


def global_findings(refs: list[GlobalRef]) -> list[Finding]:
    """One ``pickle-global`` finding per referenced global (detail ``module.name``), worst first, then in the
    stream's order. A ``fail`` global would run code under ``torch.load(weights_only=False)``; it was not run."""
    beside = shipped()
    return worst_first([Finding("pickle-global", classify(ref, beside), ref.qualname) for ref in refs])


def worst_first(findings: list[Finding]) -> list[Finding]:
    """Findings sorted fail, warn, ok; stable within a level."""
    return sorted(findings, key=lambda f: -rank(f.level))
