"""Issue 27, class 1: every global that can run code fails the gate, however it is reached (nested rebuilds,
numpy's RNG constructors, BUILD into a custom ``__setstate__``, INST/OBJ, memo aliases, monkeypatching BUILDs,
shipped modules, DCP metadata, selections), and every payload here is proven live under ``torch.load``."""

from __future__ import annotations

import enum
import inspect
import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dtypecheck.loaders._io.pickle_globals import (
    NOTHING_SHIPPED,
    VETTED,
    classify,
    imports_beside,
    judge,
    shipped,
    shipped_modules,
)
from dtypecheck.loaders._io.pickle_vm import GlobalRef, unpickle
from tests.conftest import CliResult
from tests.security import corpus
from tests.security.gate import code_globals
from tests.security.harness import prove_live, run_cli

# name -> the global that must be reported ``fail`` for it
EXPECTED_FAIL = {
    "from-type-sympy-lambda": "sympy.Lambda",
    "from-type-sympy-matrix": "sympy.Matrix",
    "reconstructor-sympy-matrix": "sympy.matrices.dense.MutableDenseMatrix",
    "numpy-generator-ctor": "torch.utils.collect_env.run",
    "numpy-randomstate-ctor": "torch.utils.collect_env.run",
    "mmapcache-newobj": "fsspec.caching.MMapCache",
    "mmapcache-inst": "fsspec.caching.MMapCache",
    "mmapcache-obj": "fsspec.caching.MMapCache",
    "mmapcache-reconstructor": "fsspec.caching.MMapCache",
    "memo-alias-binget": "torch.utils.collect_env.run",
    "memo-alias-long-binget": "torch.utils.collect_env.run",
    "build-monkeypatches-module": "torch.serialization",
    "module-instance-called": "torch.nn.modules.linear.Identity",
    "shipped-helpers": "helpers.Config",
    "shipped-package": "custom_pkg.Net",
    "shipped-configuration": "configuration_custom.CustomConfig",
    "shipped-stdlib-shadow": "decimal.Decimal",
    "shipped-torch-optional-import": "torch.utils.tensorboard.SummaryWriter",
    "dcp-metadata-numpy-ctor": "torch.utils.collect_env.run",
    "include-selection": "fsspec.caching.MMapCache",
    "weights-only-selection": "fsspec.caching.MMapCache",
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[corpus.Hostile]:
    return corpus.build(tmp_path_factory.mktemp("gate"), ("code-globals",))


def _levels(result: CliResult) -> dict[str, str]:
    return {f["detail"]: f["level"] for f in result.json()["findings"] if f["kind"] == "pickle-global"}


def test_every_payload_fails_the_gate(inputs: list[corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    assert {h.name for h in inputs} == set(EXPECTED_FAIL)
    for hostile in inputs:
        assert hostile.canary is not None
        hostile.canary.unlink(missing_ok=True)
        result = cli(*hostile.args, "--format", "json")
        assert result.exit_code == 1, (hostile.name, result.stderr)
        assert _levels(result)[EXPECTED_FAIL[hostile.name]] == "fail", (hostile.name, _levels(result))
        assert [t["name"] for t in result.json()["tensors"]] == ["w"], hostile.name  # the weight is still scanned
        assert not hostile.canary.exists(), hostile.name


def test_shipped_modules_fail_from_their_folder_and_never_run(inputs: list[corpus.Hostile]) -> None:
    """Run as CI runs it, from the checkpoint's folder: the scan fails and imports nothing shipped there (not
    even ``python -m dtypecheck``, whose working folder comes first on the path, imports the shipped
    ``decimal.py``)."""
    shipped = [h for h in inputs if h.cwd is not None]
    assert len(shipped) == 5
    assert len({h.cwd for h in shipped}) == 1
    for hostile in shipped:
        assert hostile.canary is not None
        hostile.canary.unlink(missing_ok=True)
    folder = shipped[0].cwd
    assert folder is not None
    done = run_cli(("scan-model", str(folder), "--format", "json"), cwd=folder)  # the whole folder, from inside
    assert done.returncode == 1, done.stderr
    levels = {
        f["detail"].split(" ")[0]: f["level"]
        for f in json.loads(done.stdout)["findings"]
        if f["kind"] == "pickle-global"
    }
    assert all(levels[EXPECTED_FAIL[h.name]] == "fail" for h in shipped), levels
    assert not [h.name for h in shipped if h.canary is not None and h.canary.exists()]


def test_every_payload_is_live(inputs: list[corpus.Hostile]) -> None:
    assert prove_live(inputs) == set(EXPECTED_FAIL)


def _uses(payload: bytes) -> dict[str, frozenset[str]]:
    _, refs = unpickle(corpus.program(payload), where="t", persistent_load=lambda pid: pid)
    return {ref.qualname: ref.uses for ref in refs}


def test_uses_recorded_by_hand() -> None:
    """What each opcode pattern records, spelled out byte by byte."""
    run = corpus.glob("torch.utils.collect_env", "run")
    # a plain reference in a dict: nothing
    assert _uses(b"}" + corpus.text("a") + run + b"s") == {"torch.utils.collect_env.run": frozenset()}
    # REDUCE with no arguments is still a call
    assert _uses(run + b")R") == {"torch.utils.collect_env.run": frozenset({"call"})}
    # handed to numpy's constructor (allowed), which calls it
    ctor = corpus.glob("numpy.random._pickle", "__generator_ctor")
    handed = _uses(corpus.call(ctor, corpus.text("x"), run))
    assert handed == {
        "numpy.random._pickle.__generator_ctor": frozenset({"call"}),
        "torch.utils.collect_env.run": {"handed"},
    }
    # BUILD onto the global itself
    assert _uses(run + b"}b") == {"torch.utils.collect_env.run": frozenset({"patched"})}
    # the reconstructor with object/None makes a bare instance; another base calls both
    cls, obj = corpus.glob("pkg", "C"), corpus.glob("builtins", "object")
    reconstructor = corpus.glob("copyreg", "_reconstructor")
    assert _uses(corpus.call(reconstructor, cls, obj, b"N") + b"}b")["pkg.C"] == {"new", "state"}
    assert _uses(corpus.call(reconstructor, cls, obj, b"N") + b"]b")["pkg.C"] == {"new", "setstate"}
    assert _uses(corpus.call(reconstructor, cls, cls, b"N"))["pkg.C"] == {"call"}
    # an enum member lookup, then a real call: both recorded
    assert _uses(b"(" + corpus.call(cls, corpus.text("steps")) + corpus.call(cls, b"K\x01K\x02") + b"l")["pkg.C"] == {
        "value",
        "call",
    }


@pytest.mark.parametrize("uses", [frozenset(), frozenset({"call"}), frozenset({"new", "state"})])
def test_shipped_package_fails_whatever_it_is(tmp_path: Path, uses: frozenset[str]) -> None:
    (tmp_path / "transformers").mkdir()  # a namespace package would do: torch.load imports from here
    ref = GlobalRef("transformers.training_args", "TrainingArguments", uses)
    assert shipped_modules(tmp_path) == {"transformers": False}
    assert classify(ref, NOTHING_SHIPPED) == ("warn" if uses <= {"new", "state"} else "fail")
    with imports_beside(tmp_path / "nowhere", tmp_path):  # in the working folder: the same
        assert shipped().names == {"transformers"}
        assert classify(ref) == "fail"
        assert "shipped" in judge(ref)[1]


def test_shipped_code_beside_the_checkpoint_fails_later_imports(tmp_path: Path) -> None:
    """Any module with code beside the checkpoint: a torch name that torch does not import yet fails (its import
    may reach the shipped one); one already imported with torch runs nothing."""
    (tmp_path / "helpers.py").write_text("")
    project = tmp_path / "project"
    (project / "mypackage").mkdir(parents=True)
    (project / "mypackage" / "__init__.py").write_text("")
    with imports_beside(tmp_path, project):
        assert shipped().code == {"helpers"}  # the working folder's own packages are the project's
        assert classify(GlobalRef("torch.utils.tensorboard", "SummaryWriter")) == "fail"
        assert classify(GlobalRef("torch.nn.functional", "relu")) == "ok"
    with imports_beside(project / "mypackage", project):  # a project's packages: no false alarm
        assert shipped().code == frozenset()
        # not for what a shipped module could do (stored, a class that is no data type fails for itself)
        assert "shipped" not in judge(GlobalRef("torch.utils.tensorboard", "SummaryWriter"))[1]
        assert classify(GlobalRef("mypackage", "Thing")) == "fail"  # but its names are shadowed


def test_shipped_module_names(tmp_path: Path) -> None:
    for name in ("helpers.py", "fast.cpython-311-x86_64-linux-gnu.so", "compiled.pyc", "notes.txt", "bad-name.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    found = shipped_modules(tmp_path)
    assert found == {"helpers": True, "fast": True, "compiled": True, "pkg": True, "runs": False}


def _own(cls: type, name: str) -> bool:
    """Whether ``cls`` or a base other than object/Enum/a builtin defines ``name``."""
    for base in inspect.getmro(cls):
        if base in (object, enum.Enum, str, int) or base.__module__ in {"enum", "builtins"}:
            continue
        if name in vars(base):
            return True
    return False


@pytest.mark.parametrize("qualname", sorted(VETTED))
def test_vetted_classes_are_inert_on_their_path(qualname: str) -> None:
    """The real installed class: no hook that a bare instance plus a plain-dict BUILD (``state``), or an enum
    lookup (``enum``), would run."""
    import importlib

    module_name, _, name = qualname.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        pytest.skip(f"{module_name} is not installed")
    cls = getattr(module, name)
    assert isinstance(cls, type)
    assert cls.__module__ == module_name
    hooks = (
        "__new__",
        "__setstate__",
        "__getattr__",
        "__getattribute__",
        "__setattr__",
        "__reduce__",
        "__init_subclass__",
    )
    if VETTED[qualname] == "enum":
        assert issubclass(cls, enum.Enum)
        assert type(cls) is enum.EnumMeta  # no metaclass of its own
        assert cls.__new__ is enum.Enum.__new__  # the member lookup, not a constructor of its own
        missing_method: Any = cls._missing_
        missing = missing_method.__func__
        if missing.__qualname__ == "ExplicitEnum._missing_":  # transformers' enums: a clearer ValueError, nothing else
            assert missing.__code__.co_names == ("ValueError", "__name__", "list", "_value2member_map_", "keys")
            with pytest.raises(ValueError, match="is not a valid"):
                cls("not a member")
        else:
            assert not _own(cls, "_missing_")
    else:
        own = [hook for hook in hooks if _own(cls, hook)]
        if qualname == "accelerate.state.PartialState":  # a __getattr__ that only words its AttributeError
            assert own == ["__getattr__"]
            assert vars(cls)["__getattr__"].__code__.co_names == ("_known_attrs", "AttributeError")
            own = []
        assert not own
        assert type(cls) is type
        assert pickle.loads(pickle.dumps(object.__new__(cls))).__class__ is cls  # plain object.__new__ path


def test_code_globals_class_is_registered() -> None:
    assert code_globals.KLASS in corpus.GATE_CLASSES
