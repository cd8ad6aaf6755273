"""Calling into the user's own code (a script, a factory): failures become ``UserCodeError`` with their frames only.

Shared by every command that runs user code (scan-model's live models, nan-trace, estimate-memory), so the
traceback a user sees is trimmed the same way everywhere.
"""

from __future__ import annotations

import contextlib
import re
import runpy
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from dtypecheck.errors import InputError, UsageError, UserCodeError

if TYPE_CHECKING:
    import torch

_PYTHON_TARGET = re.compile(r"^(?P<file>.+\.py)(?::(?P<factory>[A-Za-z_][A-Za-z0-9_]*))?$")
_MACHINERY = (str(Path(__file__).resolve().parent), str(Path(runpy.__file__).resolve()), "<frozen importlib")


def python_target(target: str) -> tuple[Path, str | None] | None:
    """``file.py`` or ``file.py:factory`` -> ``(file, factory or None)``; a checkpoint path -> ``None``."""
    found = _PYTHON_TARGET.match(target)
    return (Path(found["file"]), found["factory"]) if found else None


def _user_frames(exc: BaseException, user_file: Path, without: tuple[str, ...] = ()) -> list[traceback.FrameSummary]:
    frames = traceback.extract_tb(exc.__traceback__)
    user = str(user_file.resolve())
    start = next((i for i, f in enumerate(frames) if str(Path(f.filename).resolve()) == user), 0)
    return [f for f in frames[start:] if not f.filename.startswith((*_MACHINERY, *without))]


def user_traceback(exc: BaseException, user_file: Path, *, without: tuple[str, ...] = ()) -> str:
    """The traceback of ``exc`` from the first frame in ``user_file`` on, without dtypecheck's, runpy's or
    importlib's frames (nor those under the ``without`` folders)."""
    kept = _user_frames(exc, user_file, without)
    lines = ["Traceback (most recent call last):\n", *traceback.StackSummary.from_list(kept).format()]
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def _library_folders() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    return tuple(str(Path(p).resolve()) for p in found)


def user_line(exc: BaseException, user_file: Path) -> str | None:
    """Where the user's own code raised ``exc`` or called the library that did: ``line N in function`` of the
    innermost frame outside the standard library and installed packages (``file:N in function`` when that frame is
    in another file than ``user_file``, relative to the working folder when inside it), or ``None`` when no frame
    is the user's."""
    libraries = _library_folders()
    user = user_file.resolve()
    for frame in reversed(_user_frames(exc, user_file)):
        path = Path(frame.filename).resolve()
        if frame.filename.startswith("<") or str(path).startswith(libraries):
            continue
        if path == user:  # the message names that file already
            return f"line {frame.lineno} in {frame.name}"
        with contextlib.suppress(ValueError):
            path = path.relative_to(Path.cwd().resolve())
        return f"{path}:{frame.lineno} in {frame.name}"
    return None


def raise_user_error(exc: BaseException, what: str, user_file: Path) -> NoReturn:
    """Report that ``what`` (the file, ``factory()``) raised ``exc``: one line that says where, and the user's frames
    only for ``--traceback``."""
    summary = f"{what} raised {type(exc).__name__}: {exc}".rstrip(": ")
    raise UserCodeError(summary, user_traceback(exc, user_file), user_line(exc, user_file)) from exc


def call_user(func: Callable[[], Any], what: str, user_file: Path) -> Any:
    """``func()``, where an exception of the user's code becomes a ``UserCodeError`` (``sys.exit`` and Ctrl-C
    pass through: the CLI boundary handles them)."""
    try:
        return func()
    except Exception as exc:  # noqa: BLE001  (anything the user's code raises is theirs to see)
        raise_user_error(exc, what, user_file)


# --- file.py:factory: the one loader every command uses ------------------------------------------------------

FACTORY_FORMS = "an nn.Module, (model, inputs) or (model, inputs, loss_fn)"


@dataclass(frozen=True)
class Factory:
    """What a user's ``file.py:factory`` built, in the one form every command accepts."""

    model: torch.nn.Module
    inputs: Any = None
    """Example inputs: a tensor, a tuple/list of positional arguments, or a dict of keyword arguments; ``None``
    when the factory returned the model alone."""
    loss_fn: Callable[..., Any] | None = None
    """``loss_fn(output, inputs) -> scalar tensor`` (one-argument ``loss_fn(output)`` is accepted too)."""
    file: Path = Path()
    name: str = ""

    @property
    def target(self) -> str:
        return f"{self.file}:{self.name}"


def check_python_file(path: Path) -> None:
    """Exit-3 errors, naming the file, for a path that is not a readable Python source file."""
    if not path.exists():
        raise InputError(f"no such file: {path}")
    if not path.is_file():
        raise InputError(f"not a file: {path}")
    try:
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
    except UnicodeDecodeError:
        raise InputError(f"not a Python file (not UTF-8 text): {path}") from None
    except SyntaxError as exc:
        raise InputError(f"not a Python file: {path}: {exc.msg} (line {exc.lineno})") from None
    except ValueError as exc:  # source with NUL bytes
        raise InputError(f"not a Python file: {path}: {exc}") from None


@contextlib.contextmanager
def importable_folder(path: Path) -> Iterator[None]:
    """The file's folder first on ``sys.path`` while it runs, as ``python file.py`` would have it."""
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


def run_user_file(path: Path) -> dict[str, Any]:
    """Run ``path`` as a module (not as ``__main__``, so its ``if __name__ == "__main__"`` block does not run)."""
    check_python_file(path)

    def run() -> dict[str, Any]:
        with importable_folder(path):
            return runpy.run_path(str(path), run_name="__dtypecheck__")

    namespace: dict[str, Any] = call_user(run, f"{path}: the file", path)
    return namespace


def load_factory(target: str) -> Factory:
    """Run ``file.py``, call ``factory()``, and normalise what it returned (``FACTORY_FORMS``)."""
    from torch import nn

    parsed = python_target(target)
    if parsed is None:
        raise UsageError(f"{target}: expected file.py:factory")
    path, name = parsed
    if name is None:
        raise UsageError(f"{target}: name the factory that builds the model, as {path}:NAME")
    namespace = run_user_file(path)
    factory = namespace.get(name)
    if factory is None:
        raise InputError(f"{path} defines no {name!r}")
    if not callable(factory):
        raise InputError(f"{path}:{name} is not callable (it is a {type(factory).__name__})")
    made = call_user(factory, f"{path}: {name}()", path)
    parts = tuple(made) if isinstance(made, tuple | list) and 2 <= len(made) <= 3 else (made,)
    model, inputs, loss_fn = (*parts, None, None)[:3]
    if not isinstance(model, nn.Module) or (loss_fn is not None and not callable(loss_fn)):
        got = type(made).__name__ if len(parts) == 1 else "(" + ", ".join(type(p).__name__ for p in parts) + ")"
        raise InputError(f"{path}:{name}() must return {FACTORY_FORMS}; got {got}")
    return Factory(model, inputs, loss_fn, path, name)
