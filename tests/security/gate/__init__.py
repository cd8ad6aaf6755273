"""Issue 27's corpus (the gate fails closed), one module per area, each a ``build(folder) -> list[Hostile]``.

Every payload carries its own canary (``Hostile.canary``) and says how to prove it live (``torch_load``,
``loader``, ``cwd``); every benign input is marked ``benign=True``. ``benchmarks/hostile_corpus.py --only`` and the
tests in this folder share them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.security.corpus import Hostile
from tests.security.gate import (
    benign,
    bounded,
    code_globals,
    compressed_pickles,
    library_loaders,
    model_folders,
    readings,
    roles,
    shipped_config,
    sized_calls,
    stored_callables,
    tracebacks,
)

GATE_BUILDERS: dict[str, Callable[[Path], list[Hostile]]] = {
    "code-globals": code_globals.build,
    "readings": readings.build,
    "shipped-config": shipped_config.build,
    "roles": roles.build,
    "bounded-time": bounded.build,
    "own-tracebacks": tracebacks.build,
    "benign-frameworks": benign.build,
    "folder-loaders": model_folders.build,
    "stored-callables": stored_callables.build,
    "library-loaders": library_loaders.build,
    "compressed-pickles": compressed_pickles.build,
    "sized-calls": sized_calls.build,
}
