"""Where numba keeps the compiled kernels: the user's cache folder, never the installed package's own.

numba's ``cache=True`` writes next to the source, into ``dtypecheck/scan/__pycache__``, whenever it can: a shared
or system-wide install gets every user's machine code written into it (or, read-only, tries on each run). Here the
kernels are compiled without ``cache=True`` and given a cache of their own, whose only locations are numba's
``NUMBA_CACHE_DIR`` when the user sets it, else ``cache_root()``.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """``$DTYPECHECK_CACHE_DIR/numba`` when set, else ``dtypecheck/numba`` in the user's cache folder:
    ``$XDG_CACHE_HOME`` or ``~/.cache`` (Linux and the other Unixes), ``~/Library/Caches`` (macOS),
    ``%LOCALAPPDATA%`` (Windows)."""
    explicit = os.environ.get("DTYPECHECK_CACHE_DIR")
    if explicit:
        return Path(explicit) / "numba"
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "dtypecheck" / "numba"


@functools.cache
def _writable_once(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


@functools.cache
def _function_cache(root: Path) -> Any:
    """numba's ``FunctionCache`` with the in-tree and numba-wide locations replaced by ``root``; None when numba's
    caching classes are not where the numba versions this was written for keep them."""
    try:
        from numba.core import caching
    except ImportError:
        return None
    base = (getattr(caching, "_SourceFileBackedLocatorMixin", None), getattr(caching, "_CacheLocator", None))
    if None in base or not hasattr(caching, "CompileResultCacheImpl"):
        return None

    class InUserCache(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
        def __init__(self, py_func: Any, py_file: str) -> None:
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            # numba's own naming: the source folder's name and a hash of its path, so two installs never mix.
            self._cache_path = str(root / self.get_suitable_cache_subpath(py_file))  # type: ignore[no-untyped-call]

        def get_cache_path(self) -> str:
            return self._cache_path

    class Impl(caching.CompileResultCacheImpl):
        _locator_classes: list[type[object]] = [caching.UserProvidedCacheLocator, InUserCache]  # noqa: RUF012  (numba's own)

    class FunctionCache(caching.FunctionCache):
        _impl_class = Impl

    return FunctionCache


def compile_cached(njit: Any, func: Any, options: dict[str, Any]) -> Any:
    """``njit(**options)(func)``, its machine code cached in ``cache_root()`` rather than beside ``func``'s source
    when ``options`` asks for a cache. A cache folder that cannot be written means no cache (compiled on every
    run, slower to start, but nothing written into the package); a numba whose caching classes moved gets its
    own ``cache=True``."""
    if not options.get("cache"):
        return njit(**options)(func)
    root = cache_root()
    cache = _function_cache(root)
    if cache is None:
        return njit(**options)(func)
    dispatcher = njit(**{**options, "cache": False})(func)
    if not _writable_once(root):
        return dispatcher
    dispatcher._cache = cache(dispatcher.py_func)  # what Dispatcher.enable_caching does, with our cache class
    return dispatcher
