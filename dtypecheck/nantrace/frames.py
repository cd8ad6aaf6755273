"""Where the user's own code called an op: a cheap frame walk per op, text only for what gets reported."""

from __future__ import annotations

import linecache
import sys
import sysconfig
from pathlib import Path
from types import CodeType, FrameType

from dtypecheck.nantrace.report import Location

FrameKey = tuple[CodeType, int]
"""(code object, line number): enough to rebuild a ``Location`` later, and cheap to take per op."""

_STAND_INS: dict[CodeType, str] = {}
"""Frames of dtypecheck's own that re-run the user's calls (watch mode's replay of a model call): by code object,
the name of the local that holds the ``FrameKey`` of the user's line that made the call the first time."""

_USER, _INTERNAL, _RUNNER, _STAND_IN = 0, 1, 2, 3


def stand_in(code: CodeType, local: str) -> None:
    """Ops called below a frame running ``code`` are the user's line that its local ``local`` (a ``FrameKey``
    or None) names: a replay calls the user's model from a hook, whose own caller line is not where the model
    was called. Register before the ``FrameFinder`` that should honour it is made."""
    _STAND_INS[code] = local


def _internal_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(torch and dtypecheck, the standard library): the frames that are never the user's."""
    import torch

    ours = (str(Path(torch.__file__).parent), str(Path(__file__).resolve().parent.parent))
    stdlib = tuple(dict.fromkeys(p for k in ("stdlib", "platstdlib") if (p := sysconfig.get_paths().get(k))))
    return ours, stdlib


class FrameFinder:
    """Finds the first frame outside torch, dtypecheck and the standard library.

    ``sys._getframe`` walking with a per-code-object verdict costs about a microsecond per op, where
    ``traceback.extract_stack`` costs ~20 us (it formats every frame).
    """

    def __init__(self) -> None:
        self._ours, self._stdlib = _internal_roots()
        self._internal: dict[CodeType, bool] = {}
        self._walk: dict[CodeType, int] = {}
        """By code object: user's, internal, the runner's or a stand-in's (the walk's one lookup per frame)."""
        # Frames above the runner are the command line (typer, click): never the user's line. Reaching it
        # means the op was called by dtypecheck itself (factory mode calling a library model directly).
        self._runner = str(Path(__file__).resolve().parent / "runner.py")

    def is_internal(self, code: CodeType) -> bool:
        verdict = self._internal.get(code)
        if verdict is None:
            name = code.co_filename
            # Installed libraries can live under the stdlib folder (/usr/local/lib/python3.x/site-packages):
            # a model library's line is more useful to the user than their training loop's.
            in_stdlib = name.startswith(self._stdlib) and "-packages" not in name
            verdict = name.startswith(("<frozen", *self._ours)) or in_stdlib
            self._internal[code] = verdict
        return verdict

    def _kind(self, code: CodeType) -> int:
        if not self.is_internal(code):
            kind = _USER
        elif code in _STAND_INS:
            kind = _STAND_IN
        else:
            kind = _RUNNER if code.co_filename == self._runner else _INTERNAL
        self._walk[code] = kind
        return kind

    def user_frame(self, depth: int = 1) -> FrameKey | None:
        frame: FrameType | None = sys._getframe(depth + 1)
        walk = self._walk
        while frame is not None:
            code = frame.f_code
            kind = walk.get(code)
            if kind is None:
                kind = self._kind(code)
            if kind == _INTERNAL:
                frame = frame.f_back
                continue
            if kind == _USER:
                return code, frame.f_lineno
            if kind == _RUNNER:
                return None
            held: FrameKey | None = frame.f_locals.get(_STAND_INS[code])
            return held
        return None


def location_of(key: FrameKey | None) -> Location | None:
    if key is None:
        return None
    code, line = key
    text = linecache.getline(code.co_filename, line).strip()
    return Location(file=code.co_filename, line=line, function=code.co_name, code=text)
