"""nan-trace's checks in C++: watch mode's per-step checks (one call checks every tensor of a list, one call
snapshots them) and the full trace's check of each op's CPU output (``extrema``).

On CPU each torch op costs ~1 us of dispatch, and a step's checks touch ~200 small tensors (gradients, parameters,
optimizer states): done one op per tensor they cost as much as a fifth of a 2 ms step. ``checks.cpp`` reads the
contiguous CPU tensors' bits in a plain loop instead (a value is non-finite exactly when its exponent bits are all
ones), and copies a snapshot with ``memcpy``; it writes nothing the user owns (no version counter moves). The full
trace reads each floating CPU output's extremes (and in half precision its count below the smallest normal) in one
pass, where ``aminmax`` and two more ops were dispatched from Python for each.

``dispatch.cpp`` is the full trace's per-op path: the tracer's dispatch mode's ops are offered to it first, and the
ones it can vouch for run and are booked without Python (``load_dispatch``; the tracer's ``_attach_native``).

It is compiled with ``torch.utils.cpp_extension`` (g++ and ninja) once per machine, source and torch version, into
``$XDG_CACHE_HOME/dtypecheck/native/<key>/`` (``~/.cache`` by default): by ``make .venv`` or
``python -m dtypecheck.nantrace.native``, or, the first time nan-trace runs without it, by a build started in the
background (the run itself uses the pure-Python checks; the next one finds the module). Without a compiler, or with
``DTYPECHECK_NATIVE=0``, the pure-Python checks run, with the same results (tests run both).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

_NAME = "_dtypecheck_native"
_SOURCE = Path(__file__).with_name("checks.cpp")
_DISPATCH_NAME = "_dtypecheck_dispatch"
_DISPATCH_SOURCE = Path(__file__).with_name("dispatch.cpp")
"""The full trace's per-op path (``dispatch.cpp``), built apart: it implements torch's interpreter interface, which
changes between torch versions, and a torch it does not compile against must not cost watch mode its checks."""


def enabled() -> bool:
    """``DTYPECHECK_NATIVE=0`` turns the C++ checks off (the pure-Python ones run)."""
    return os.environ.get("DTYPECHECK_NATIVE", "1") != "0"


def dispatch_enabled() -> bool:
    """``DTYPECHECK_NATIVE_DISPATCH=0`` keeps the full trace's ops in its Python dispatch mode (the C++ checks of
    their outputs stay on unless ``DTYPECHECK_NATIVE=0``)."""
    return enabled() and os.environ.get("DTYPECHECK_NATIVE_DISPATCH", "1") != "0"


def build_folder(source: Path = _SOURCE) -> Path:
    """Where the module for this source, torch and Python is built (one folder per combination)."""
    import torch

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.glob("*.h")):  # what the sources include
        digest.update(header.read_bytes())
    key = digest.hexdigest()[:12]
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    prefix = "" if source == _SOURCE else f"{source.stem}-"
    return cache / "dtypecheck" / "native" / f"{prefix}{python}-torch{torch.__version__}-{key}"


def _library(folder: Path, name: str = _NAME) -> Path:
    return folder / f"{name}.so"  # cpp_extension's name for it, whatever Python's suffix


def load(*, build_in_background: bool = True) -> ModuleType | None:
    """The compiled module, or None (off, not built yet, or unbuildable); the first call without one starts its
    build in the background (unless ``build_in_background`` is false). Asked for at every check: remembered."""
    return _load_once(build_in_background)


def load_dispatch() -> ModuleType | None:
    """The full trace's per-op path in C++, or None (off, not built, or not buildable against this torch: the
    Python dispatch mode then takes every op). Built with the checks (``build``), never on its own."""
    return _load_dispatch_once() if dispatch_enabled() else None


@functools.cache
def _load_dispatch_once() -> ModuleType | None:
    try:
        folder = build_folder(_DISPATCH_SOURCE)
        library = _library(folder, _DISPATCH_NAME)
        if library.exists():
            return _import(library, _DISPATCH_NAME)
        if not (folder / "failed").exists():
            _start_background_build(folder)
    except (OSError, ImportError):
        pass
    return None


@functools.cache
def _load_once(build_in_background: bool) -> ModuleType | None:
    if not enabled():
        return None
    try:
        folder = build_folder()
        library = _library(folder)
        if library.exists():
            return _import(library)
        if build_in_background:
            _start_background_build(folder)
    except (OSError, ImportError):
        pass
    return None


def _import(library: Path, name: str = _NAME) -> ModuleType:
    import torch  # noqa: F401  (its libraries must be loaded before the module's are resolved)

    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start_background_build(folder: Path) -> None:
    """Start ``python -m dtypecheck.nantrace.native`` detached, unless a build is under way (its ``building``
    marker); two that start at once are serialised by ``build``'s marker."""
    if not compiler_available():
        return
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "building"
    if marker.exists():
        if time.time() - marker.stat().st_mtime < 600:
            return  # being built
        marker.unlink(missing_ok=True)  # a build that died (a killed machine) left it: tried again
    with (folder / "build.log").open("ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", "dtypecheck.nantrace.native", "--quiet"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def compiler_available() -> bool:
    return shutil.which(os.environ.get("CXX", "c++")) is not None and shutil.which("ninja") is not None


def build(*, wait_s: float = 600) -> Path:
    """Compile the checks into their folder (a no-op when they are there), then the full trace's per-op path,
    whose failure (a torch it does not fit) is remembered in its folder and leaves the checks; the checks' path.
    One build at a time per folder (the ``building`` marker, also the background build's): a second caller waits
    for the first's result."""
    library = _build_one(_SOURCE, _NAME, wait_s)
    folder = build_folder(_DISPATCH_SOURCE)
    if not (folder / "failed").exists():
        try:
            _build_one(_DISPATCH_SOURCE, _DISPATCH_NAME, wait_s)
        except Exception as exc:  # noqa: BLE001  (whatever the compiler said: the Python path stays)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "failed").write_text(str(exc)[-4000:], encoding="utf-8")
    return library


def dispatch_built() -> bool:
    """Whether the full trace's per-op path is built for this torch."""
    return _library(build_folder(_DISPATCH_SOURCE), _DISPATCH_NAME).exists()


def _build_one(source: Path, name: str, wait_s: float) -> Path:
    from torch.utils.cpp_extension import load as compile_extension

    folder = build_folder(source)
    library = _library(folder, name)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "building"
    deadline = time.monotonic() + wait_s
    while not library.exists():
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - marker.stat().st_mtime > 600:  # a build that died (a killed machine) left it
                    marker.unlink(missing_ok=True)
            if time.monotonic() > deadline:
                raise TimeoutError(f"another build of {library} has not finished in {wait_s:.0f} s") from None
            time.sleep(0.5)
            continue
        work = folder / f"build-{os.getpid()}"
        try:
            if not library.exists():  # built between our look and the marker
                work.mkdir(exist_ok=True)
                compile_extension(name, [str(source)], build_directory=str(work), extra_cflags=["-O3"])
                _library(work, name).replace(library)  # atomic: a reader never sees half a library
        finally:
            shutil.rmtree(work, ignore_errors=True)
            marker.unlink(missing_ok=True)
    return library
