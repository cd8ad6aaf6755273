"""The ground floor of every output: the formats (one enum with every per-format decision), the JSON form of a
result, and the atomic file writer. Cores (``scan.gate``, ``scan.baseline``) and ``render`` both build on it;
it imports nothing of dtypecheck but the version.

The output formats every command writes, and every per-format decision, in one enum.

The Typer choices (``cli._app.FormatOption``), the config's ``format`` key (``config.COMMON_KEYS``) and the help text
read ``OutputFormat``; the renderer registry (``render.render``) and every command that treats formats differently
ask one of the properties below. Each property decides with ``match`` and ``assert_never``, so a new member makes
mypy name every decision it lacks.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import tempfile
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, Literal, NoReturn

from dtypecheck import __version__

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - exercised on Python 3.10 only

    class StrEnum(str, Enum):
        """``enum.StrEnum`` of Python 3.11: members are their values, also in ``str()`` and f-strings."""

        def __str__(self) -> str:
            return str(self.value)


def assert_never(value: NoReturn) -> NoReturn:
    """``typing.assert_never`` (Python 3.11): mypy fails where a ``match`` over an enum misses a member."""
    raise AssertionError(f"unhandled value: {value!r}")


class OutputFormat(StrEnum):
    """What ``--format`` (and ``format`` in ``[tool.dtypecheck]``) accepts."""

    table = "table"
    json = "json"
    sarif = "sarif"
    github = "github"
    html = "html"

    @property
    def summary(self) -> str:
        """What the format is, in the words of ``--help`` and the README."""
        match self:
            case OutputFormat.table:
                return "rich"
            case OutputFormat.json:
                return "one document"
            case OutputFormat.sarif:
                return "SARIF 2.1.0"
            case OutputFormat.github:
                return "annotations"
            case OutputFormat.html:
                return "one self-contained page"
            case _:
                assert_never(self)

    @property
    def for_people(self) -> bool:
        """A table for a terminal: coloured and as wide as it when stdout is one; everything else is read by a
        program, so stdout holds only it (a traced script's own prints go to stderr)."""
        match self:
            case OutputFormat.table:
                return True
            case OutputFormat.json | OutputFormat.sarif | OutputFormat.github | OutputFormat.html:
                return False
            case _:
                assert_never(self)

    @property
    def several_inputs(self) -> Literal["follow", "merge", "refuse"]:
        """How one output holds several inputs (scan-model's checkpoints): ``follow``, one after another (tables,
        annotations); ``merge``, one document with an entry per input (a SARIF log: one run, one artifact each);
        ``refuse``, a document describes one input (no format now; JSON merges them into a
        ``dtypecheck.scan-set/1`` document)."""
        match self:
            case OutputFormat.table | OutputFormat.github:
                return "follow"
            case OutputFormat.sarif | OutputFormat.json:
                return "merge"
            case OutputFormat.html:
                return "refuse"
            case _:
                assert_never(self)

    @property
    def findings_only(self) -> bool:
        """Whether the format holds nothing but findings (SARIF results, annotations): a report without findings,
        such as a memory estimate, cannot be written in it."""
        match self:
            case OutputFormat.sarif | OutputFormat.github:
                return True
            case OutputFormat.table | OutputFormat.json | OutputFormat.html:
                return False
            case _:
                assert_never(self)


EVERY_FORMAT: tuple[OutputFormat, ...] = tuple(OutputFormat)
"""What a command with findings (scan-model, nan-trace) writes."""
REPORT_FORMATS: tuple[OutputFormat, ...] = tuple(fmt for fmt in OutputFormat if not fmt.findings_only)
"""What a command whose report has no findings (info, estimate-memory) writes: no SARIF log or annotations."""


def format_help(formats: tuple[OutputFormat, ...] = EVERY_FORMAT) -> str:
    """``--format``'s help: each of ``formats`` with its summary, in the enum's order."""
    names = [f"{fmt.value} ({fmt.summary})" for fmt in formats]
    return ", ".join(names[:-1]) + " or " + names[-1] + "."


# --- the JSON form of a result ----------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """Convert a result tree of frozen dataclasses, tuples and mappings into JSON-ready values."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, Enum):
        return jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value) if f.repr}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def document(report: Any) -> dict[str, Any]:
    body = jsonable(report)
    if not isinstance(body, dict):
        raise TypeError("a report must be a dataclass")
    return {"schema": report.SCHEMA, "dtypecheck_version": __version__, **body}


# --- writing a document -------------------------------------------------------------------------------------


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomically(path: Path, text: str | bytes) -> None:
    """Write via a temporary file in the same folder and rename, so no reader sees a partial file (``text``: a
    document, or the bytes of a picture). A failure (a missing folder, no permission, a full disk) is an
    ``OSError`` that names ``path``, not the temporary file.

    A symlink is followed (the file it points to is replaced, the link stays). A device, a pipe or anything else
    that is not a regular file (``/dev/stdout``, ``/dev/null``, a FIFO), and any path under ``/dev`` or ``/proc``,
    is written through instead of being replaced by a regular file. Characters that cannot be encoded (a lone
    surrogate in a tensor name) are written as backslash escapes.
    """
    data = text if isinstance(text, bytes) else text.encode("utf-8", errors="backslashreplace")
    if _is_stream(path):
        with path.open("wb") as handle:
            handle.write(data)
        return
    path = path.resolve() if path.is_symlink() else path
    directory = path.parent if str(path.parent) else Path()
    try:
        _replace_with(path, directory, data)
    except OSError as exc:
        if exc.filename == str(path):
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def _replace_with(path: Path, directory: Path, data: bytes) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            # mkstemp makes the file private (0600); give it the mode a plain open() would, or keep the old one.
            os.fchmod(handle.fileno(), _mode_for(path))
            os.fsync(handle.fileno())
        Path(tmp_name).replace(path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _is_stream(path: Path) -> bool:
    """Whether ``path`` names a device, pipe or socket (through any symlinks) rather than a regular file."""
    import stat

    absolute = Path.cwd() / path  # as given, not resolved: /dev/stdout itself is a symlink
    if absolute.parts[1:2] in (("dev",), ("proc",)):
        return True
    try:
        mode = path.stat().st_mode
    except OSError:
        return False  # does not exist (or a dangling link): created as a regular file
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def format_names(formats: tuple[OutputFormat, ...]) -> str:
    """``table, json or html``: ``formats`` in words, for messages."""
    names = [fmt.value for fmt in formats]
    return ", ".join(names[:-1]) + " or " + names[-1]


def format_metavar(formats: tuple[OutputFormat, ...]) -> str:
    """``--format``'s choices as ``--help`` shows them: ``<table|json|html>``."""
    return "<" + "|".join(fmt.value for fmt in formats) + ">"


def parse_format(value: object, formats: tuple[OutputFormat, ...]) -> OutputFormat:
    """``value`` (a name from the command line or the config) as one of ``formats``; else a ``ValueError``
    naming the choices, and for a findings-only format, why this command cannot write it."""
    if isinstance(value, OutputFormat) and value in formats:
        return value
    for fmt in formats:
        if str(value) == fmt.value:
            return fmt
    choices = ", ".join(repr(fmt.value) for fmt in formats)
    known = next((fmt for fmt in OutputFormat if fmt.value == str(value)), None)
    why = f" (this command's report has no findings to write as {known.value})" if known else ""
    raise ValueError(f"{str(value)!r} is not one of {choices}{why}")
