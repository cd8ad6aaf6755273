"""Calling into the user's own code (a script, a factory): failures become ``UserCodeError`` with their frames only.

Shared by every command that runs user code (scan-model's live models, nan-trace, estimate-memory), so the
traceback a user sees is trimmed the same way everywhere.
"""

from __future__ import annotations

import re
import runpy
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from dtypecheck.errors import UserCodeError

_PYTHON_TARGET = re.compile(r"^(?P<file>.+\.py)(?::(?P<factory>[A-Za-z_][A-Za-z0-9_]*))?$")
_MACHINERY = (str(Path(__file__).resolve().parent), str(Path(runpy.__file__).resolve()), "<frozen importlib")


def python_target(target: str) -> tuple[Path, str | None] | None:
    """``file.py`` or ``file.py:factory`` -> ``(file, factory or None)``; a checkpoint path -> ``None``."""
    found = _PYTHON_TARGET.match(target)
    return (Path(found["file"]), found["factory"]) if found else None


def user_traceback(exc: BaseException, user_file: Path, *, without: tuple[str, ...] = ()) -> str:
    """The traceback of ``exc`` from the first frame in ``user_file`` on, without dtypecheck's, runpy's or
    importlib's frames (nor those under the ``without`` folders)."""
    frames = traceback.extract_tb(exc.__traceback__)
    user = str(user_file.resolve())
    start = next((i for i, f in enumerate(frames) if str(Path(f.filename).resolve()) == user), 0)
    kept = [f for f in frames[start:] if not f.filename.startswith((*_MACHINERY, *without))]
    lines = ["Traceback (most recent call last):\n", *traceback.StackSummary.from_list(kept).format()]
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def raise_user_error(exc: BaseException, what: str, user_file: Path) -> NoReturn:
    """Report that ``what`` (the file, ``factory()``) raised ``exc``, with the user's frames only."""
    summary = f"{what} raised {type(exc).__name__}: {exc}".rstrip(": ")
    raise UserCodeError(summary, user_traceback(exc, user_file)) from exc


def call_user(func: Callable[[], Any], what: str, user_file: Path) -> Any:
    """``func()``, where an exception of the user's code becomes a ``UserCodeError`` (``sys.exit`` and Ctrl-C
    pass through: the CLI boundary handles them)."""
    try:
        return func()
    except Exception as exc:  # noqa: BLE001  (anything the user's code raises is theirs to see)
        raise_user_error(exc, what, user_file)
