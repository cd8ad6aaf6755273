"""The error hierarchy, the exit codes, and the one place that turns an error into a message."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What every command returns (README lists them; docs/contract.md defines them)."""

    OK = 0
    """Ran, and nothing at or above the ``--fail-on`` level was found."""
    FINDINGS = 1
    """Ran, and found something at or above ``--fail-on``."""
    USAGE = 2
    """Bad arguments or options (Click's convention)."""
    INPUT_ERROR = 3
    """The input could not be read or run."""


class DtypecheckError(Exception):
    """Base of every error dtypecheck reports as one line instead of a traceback."""

    exit_code: ExitCode = ExitCode.INPUT_ERROR

    def message(self) -> str:
        return str(self)


class UsageError(DtypecheckError):
    """The command line asked for something impossible (exit 2)."""

    exit_code = ExitCode.USAGE


class ParameterError(UsageError):
    """A usage error about parameters of a core function. The template names them in braces (``"{world_size}
    needs a {strategy}"``): the Python API's message shows the parameter names, the CLI's its flags."""

    def __init__(self, template: str) -> None:
        self.template = template
        super().__init__(self.naming({}))

    def naming(self, flags: dict[str, str]) -> str:
        """The message with each parameter spelled as ``flags`` says (itself when not in ``flags``)."""
        import string

        fields = {field for _, field, _, _ in string.Formatter().parse(self.template) if field}
        return self.template.format(**{name: flags.get(name, name) for name in fields})

    def with_flags(self, flags: dict[str, str] | None = None) -> UsageError:
        """The same error for the command line: a parameter becomes the flag ``flags`` names, else its own name
        as a flag (``world_size`` -> ``--world-size``)."""
        import string

        chosen = flags or {}
        fields = {field for _, field, _, _ in string.Formatter().parse(self.template) if field}
        return UsageError(self.naming({n: chosen.get(n, "--" + n.replace("_", "-")) for n in fields}))


class UnknownDtypeError(UsageError):
    def __init__(self, name: str, suggestions: tuple[str, ...] = (), reason: str = "") -> None:
        self.name = name
        self.suggestions = suggestions
        self.reason = reason
        super().__init__(name)

    def message(self) -> str:
        text = f"unknown dtype {self.name!r}"
        if self.reason:
            return f"{text}: {self.reason}"
        if self.suggestions:
            return text + "; did you mean " + " or ".join(repr(s) for s in self.suggestions) + "?"
        return text + "; run 'dtypecheck info --list' for the names"


class InputError(DtypecheckError):
    """The input could not be read: missing, unreadable, truncated or malformed (exit 3)."""

    exit_code = ExitCode.INPUT_ERROR


class NotACheckpointError(InputError):
    """A file that can be read but holds no checkpoint format dtypecheck reads (a zip without ``data.pkl``, such
    as a ``torch.package`` archive). Alone it is exit 3; in a scanned folder, that file's ``unreadable-file``
    finding (``warn``), the folder's other files scanned as usual."""


class UserCodeError(InputError):
    """The user's own script or factory raised; ``formatted`` holds its traceback, its frames only; ``where`` is the
    user's line that raised (``line 12 in collate``), said in the message."""

    def __init__(self, summary: str, formatted: str = "", where: str | None = None) -> None:
        super().__init__(summary)
        self.formatted = formatted
        self.where = where

    def message(self, *, traceback_shown: bool = False) -> str:
        if self.where is None:
            return str(self)
        hint = "" if traceback_shown else "; --traceback shows the traceback"
        return f"{self} (at {self.where}{hint})"


def describe(exc: BaseException) -> tuple[ExitCode, str] | None:
    """Map an exception to (exit code, one-line message), or ``None`` for a bug that should show its traceback.

    This is the only place errors become messages; the CLI boundary calls it.
    """
    if isinstance(exc, DtypecheckError):
        return exc.exit_code, exc.message()
    if isinstance(exc, FileNotFoundError):
        return ExitCode.INPUT_ERROR, f"no such file or directory: {exc.filename}"
    if isinstance(exc, IsADirectoryError):
        return ExitCode.INPUT_ERROR, f"is a directory, expected a file: {exc.filename}"
    if isinstance(exc, PermissionError):
        return ExitCode.INPUT_ERROR, f"permission denied: {exc.filename}"
    if isinstance(exc, MemoryError):
        return ExitCode.INPUT_ERROR, "out of memory while reading the input"
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return ExitCode.INPUT_ERROR, f"cannot read input{where} ({exc.strerror or exc})"
    return None
