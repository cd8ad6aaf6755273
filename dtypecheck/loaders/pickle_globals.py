"""How dangerous is each global a pickle references? ``ok`` (data), ``warn`` (unknown class), ``fail`` (runs code).

The safe unpickler never imports any of them; this table only decides what a scan reports, so a checkpoint that
*would* run ``os.system`` under ``torch.load(weights_only=False)`` fails the scan even though scanning it is safe.
"""

from __future__ import annotations

from dtypecheck.loaders.base import Finding, Level
from dtypecheck.loaders.pickle_vm import GlobalRef

HARMLESS: frozenset[str] = frozenset(
    {
        "collections.OrderedDict",
        "collections.defaultdict",
        "collections.deque",
        "argparse.Namespace",
        "copyreg._reconstructor",
        "copyreg.__newobj__",
        "_codecs.encode",
        "codecs.encode",
        "builtins.set",
        "builtins.frozenset",
        "builtins.slice",
        "builtins.list",
        "builtins.dict",
        "builtins.tuple",
        "builtins.bytearray",
        "builtins.bytes",
        "builtins.complex",
        "builtins.int",
        "builtins.float",
        "builtins.str",
        "builtins.bool",
        "builtins.range",
        "builtins.object",
        "__builtin__.set",
        "__builtin__.frozenset",
        "__builtin__.slice",
        "__builtin__.complex",
        "__builtin__.object",
        "pathlib.Path",
        "pathlib.PosixPath",
        "pathlib.WindowsPath",
        "pathlib.PurePosixPath",
        "pathlib.PureWindowsPath",
        "datetime.datetime",
        "datetime.date",
        "datetime.time",
        "datetime.timedelta",
        "datetime.timezone",
        "decimal.Decimal",
        "fractions.Fraction",
        "uuid.UUID",
        "numpy.dtype",
        "numpy.ndarray",
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray.scalar",
        "torch.Size",
        "torch.per_tensor_affine",
        "torch.per_channel_affine",
        "torch.per_tensor_symmetric",
        "torch.per_channel_symmetric",
        "torch.per_channel_affine_float_qparams",
        "torch.strided",
        "torch.sparse_coo",
        "torch.sparse_csr",
        "torch.contiguous_format",
        "torch.channels_last",
        "torch.device",
        "torch.serialization._get_layout",
        "torch._tensor._rebuild_from_type_v2",
        "torch.nn.parameter.Parameter",
        "torch.nn.modules.container.ParameterDict",
        "torch.distributed.checkpoint.filesystem._StorageInfo",
        "torch.distributed.checkpoint.filesystem._StoragePrefix",
    }
)
"""Data types and the reconstruction helpers torch, numpy and the standard library pickle with."""

HARMLESS_MODULE_PREFIXES: tuple[str, ...] = (
    "torch._utils._rebuild_",
    "torch.nn.modules.",  # a whole pickled nn.Module: torch's own classes, rebuilt from their __dict__
    "numpy.random._pickle.",  # numpy's RNG state (Lightning and HF Trainer save it)
    "numpy.random._pcg64.",
    "numpy.random._mt19937.",
    "numpy.random._philox.",
    "numpy.random._sfc64.",
    "numpy.random.bit_generator.",
    "torch.distributed.checkpoint.metadata.",
    "torch.distributed.checkpoint.planner.",
    "numpy.dtypes.",
)

DANGEROUS_MODULES: tuple[str, ...] = (
    "os",
    "posix",
    "nt",
    "sys",
    "subprocess",
    "runpy",
    "importlib",
    "imp",
    "shutil",
    "socket",
    "webbrowser",
    "pty",
    "ctypes",
    "multiprocessing",
    "code",
    "codeop",
    "pdb",
    "bdb",
    "timeit",
    "asyncio",
    "http",
    "urllib",
    "ftplib",
    "smtplib",
    "telnetlib",
    "pickle",
    "_pickle",
    "marshal",
    "dill",
    "cloudpickle",
    "joblib",
    "shelve",
    "tempfile",
    "signal",
    "threading",
    "_thread",
    "types",
    "inspect",
    "pydoc",
    "pip",
    "setuptools",
    "distutils",
    "torch.hub",
    "torch.jit",
    "torch.package",
    "torch.utils.cpp_extension",
    "numpy.testing",
    "builtins.__loader__",
)
"""Modules any of whose globals can run code, touch files or the network, or unpickle again."""

DANGEROUS_NAMES: frozenset[str] = frozenset(
    {
        f"{builtins}.{name}"
        for builtins in ("builtins", "__builtin__")
        for name in (
            "eval",
            "exec",
            "execfile",
            "compile",
            "open",
            "file",
            "getattr",
            "setattr",
            "delattr",
            "__import__",
            "globals",
            "locals",
            "vars",
            "input",
            "breakpoint",
            "apply",
            "reload",
            "exit",
            "quit",
            "help",
            "memoryview",
            "type",
            "classmethod",
            "staticmethod",
            "property",
        )
    }
    | {
        "operator.attrgetter",
        "operator.itemgetter",
        "operator.methodcaller",
        "functools.partial",
        "functools.reduce",
        "torch.load",
        "torch.serialization.load",
        "torch.serialization._load",
        "torch.from_file",
        "torch.storage._load_from_bytes",
        "numpy.load",
        "numpy.fromfile",
        "numpy.lib.npyio.load",
        "copyreg.extension",
    }
)


def classify(ref: GlobalRef) -> Level:
    """The level a scan reports for a pickle that references ``ref``."""
    qualname = ref.qualname
    if qualname in DANGEROUS_NAMES or any(
        ref.module == module or ref.module.startswith(module + ".") for module in DANGEROUS_MODULES
    ):
        return "fail"
    if ref.module.startswith("copyreg.extension"):
        return "fail"
    if qualname in HARMLESS or any(qualname.startswith(prefix) for prefix in HARMLESS_MODULE_PREFIXES):
        return "ok"
    if ref.module == "torch" and (ref.name.endswith("Storage") or _is_torch_dtype_name(ref.name)):
        return "ok"
    if ref.module == "torch.storage" and ref.name in {"UntypedStorage", "TypedStorage"}:
        return "ok"
    return "warn"


def _is_torch_dtype_name(name: str) -> bool:
    from dtypecheck.loaders.torch_objects import TORCH_DTYPE_NAMES

    return name in TORCH_DTYPE_NAMES


def global_findings(refs: list[GlobalRef]) -> list[Finding]:
    """One ``pickle-global`` finding per referenced global (detail ``module.name``), worst first, then in the
    stream's order. A ``fail`` global would run code under ``torch.load(weights_only=False)``; it was not run."""
    return worst_first([Finding("pickle-global", classify(ref), ref.qualname) for ref in refs])


def worst_first(findings: list[Finding]) -> list[Finding]:
    """Findings sorted fail, warn, ok; stable within a level."""
    order = {"fail": 0, "warn": 1, "ok": 2}
    return sorted(findings, key=lambda f: order[f.level])
