"""Torch without importing ``torch._dynamo`` until something compiles.

Importing ``torch._dynamo`` takes 0.7 s to 1.5 s of CPU, and neither an estimate nor most training scripts compile
anything. Things in torch import it all the same:

- ``FakeTensorMode.__init__`` runs ``import torch._dynamo.config``, which first runs the whole package (most of
  what a config-only estimate spent beyond importing torch);
- functions wrapped by ``torch._disable_dynamo`` (a dispatch mode's ``__torch_dispatch__``, the elementwise
  reference implementations that fake tensors run, ``Optimizer.__init__``) import it on their first call to build
  their dynamo-disable frame;
- every ``optimizer.step()`` calls ``torch._dynamo.graph_break()``, a no-op outside a compiled frame.

The last two made a quarter to a half of a small ``nan-trace`` run's CPU time: the traced script builds an
optimizer.

:func:`defer_dynamo_import` puts a stand-in package in its place, in the way torch itself defers the import
(``torch.__getattr__``): the stand-in holds the real ``torch._dynamo.config`` module, loaded alone, an identity
``disable`` and a no-op ``graph_break`` (nothing can be compiling while dynamo is not loaded). Anything else
(another attribute, a submodule import) imports the real package at once, which then takes over: it reuses the
same config module, and the functions the stand-in's ``disable`` served lose their identity frame, so that their
next call builds the real one. What the package's import does to the rest of torch (``torch.manual_seed`` wrapped
in a dynamo-disable frame, one class of its own allowed to ``torch.load(weights_only=True)``) happens then too.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

NAME = "torch._dynamo"
_CACHE_ATTRIBUTE = "__dynamo_disable"
"""Where ``torch._disable_dynamo``'s wrapper caches the frame it built for a function."""
_lock = threading.RLock()


def defer_dynamo_import() -> None:
    """Stand in for ``torch._dynamo`` until something needs the real package; a no-op once it is imported (or
    where torch's layout differs from the one this was written for)."""
    import torch

    with _lock:
        if NAME in sys.modules or "_dynamo" in vars(torch):
            return
        spec = importlib.util.find_spec(NAME)
        if spec is None or spec.submodule_search_locations is None:
            return
        stand_in = _StandIn(NAME, list(spec.submodule_search_locations))
        stand_in.__spec__ = spec  # what importlib.util.find_spec(NAME) answers, as for the real package
        stand_in.__file__ = spec.origin
        sys.modules[NAME] = stand_in
        try:
            importlib.import_module(f"{NAME}.config")
        except Exception:  # noqa: BLE001 - a torch whose config needs its package: let the real one load
            sys.modules.pop(f"{NAME}.config", None)
            del sys.modules[NAME]
            return
        torch._dynamo = stand_in
        sys.meta_path.insert(0, _SUBMODULES)


class _StandIn(types.ModuleType):
    """``torch._dynamo`` while the real package is not imported."""

    def __init__(self, name: str, locations: list[str]) -> None:
        super().__init__(name)
        self.__path__ = locations
        self.served: list[Callable[..., Any]] = []
        """The functions ``disable`` returned as they are: their cached frame is dropped when the real one loads."""

    def disable(self, fn: Callable[..., Any] | None = None, recursive: bool = True, **kwargs: Any) -> Any:
        if fn is not None and kwargs == {"wrapping": False}:
            # torch's own lazy wrapper (``torch._disable_dynamo``) asking for the frame it caches on ``fn``:
            # nothing is compiled while dynamo is not loaded, so ``fn`` itself serves until the real one loads.
            self.served.append(fn)
            return fn
        # A decorator (``torch.compiler.disable``, the user's own): it must be the real one, kept for good.
        return _load_real().disable(fn, recursive, **kwargs)

    def graph_break(self, msg: str = "") -> None:
        """What the real one does outside a compiled frame: nothing (``Optimizer``'s ``_use_grad`` calls it at
        every step). Inside one, dynamo is loaded and this stand-in gone."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            # Module introspection (inspect.getmodule asks every module for __file__) is no use of dynamo.
            raise AttributeError(name)
        return getattr(_load_real(), name)


def _load_real() -> types.ModuleType:
    """Replace the stand-in by the real ``torch._dynamo`` (imported now) and return it."""
    import torch

    with _lock:
        stand_in = sys.modules.get(NAME)
        if isinstance(stand_in, _StandIn):
            del sys.modules[NAME]
            if _SUBMODULES in sys.meta_path:
                sys.meta_path.remove(_SUBMODULES)
            for fn in stand_in.served:
                if getattr(fn, _CACHE_ATTRIBUTE, None) is fn:
                    delattr(fn, _CACHE_ATTRIBUTE)
            if vars(torch).get("_dynamo") is stand_in:
                del torch._dynamo
        return importlib.import_module(NAME)


class _Submodules(importlib.abc.MetaPathFinder):
    """Imports the real package before any submodule of it other than the config the stand-in holds."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(f"{NAME}.") or not isinstance(sys.modules.get(NAME), _StandIn):
            return None
        _load_real()
        module = importlib.import_module(fullname)  # the real package may have imported it already
        # Handed back as it is: a fresh spec for an already-loaded module would make import run it a second time.
        original = module.__spec__
        module.__spec__ = None
        return importlib.util.spec_from_loader(fullname, _Loaded(module, original))


class _Loaded(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType, spec: importlib.machinery.ModuleSpec | None) -> None:
        self.module = module
        self.spec = spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec


_SUBMODULES = _Submodules()
