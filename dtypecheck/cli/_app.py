"""The Typer app and the options every command shares, defined once."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import typer
import typer.core

from dtypecheck import __version__
from dtypecheck.errors import ExitCode, UsageError, UserCodeError
from dtypecheck.output import EVERY_FORMAT, REPORT_FORMATS, format_help, format_metavar, parse_format
from dtypecheck.render import OutputFormat, render, write_atomically

if TYPE_CHECKING:
    from dtypecheck.config import Config
    from dtypecheck.render import Report

T = TypeVar("T")


class HelpThatFits(typer.core.TyperCommand):
    """A command whose ``--help`` is never cut short: rich's table where it fits the terminal, else click's plain
    layout, which wraps every line and never truncates.

    Typer's rich table gives each option's name, negative name, type and help a column of its own; at 80 columns
    their widths add up to more than the line, and rich then cuts every column with an ellipsis
    (``--keep-float32-sq…``, ``DTYPECHECK_TRACEB…``). The docstring's paragraphs are joined into single lines,
    since rich keeps a docstring's hard line breaks (``... what each available device`` / ``measures, ...``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.help:
            paragraphs = inspect.cleandoc(self.help).split("\n\n")
            self.help = "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        if self.rich_markup_mode is None or _ELLIPSIS not in _rich_help(self, ctx):
            super().format_help(ctx, formatter)
            return
        # Plain click: the help texts' "\\[default: ...]" escapes are rich markup, shown literally here.
        helped = [p for p in self.params if isinstance(p, typer.core.TyperOption | typer.core.TyperArgument)]
        texts = [param.help for param in helped]
        markup_mode, self.rich_markup_mode = self.rich_markup_mode, None
        try:
            for param, text in zip(helped, texts, strict=True):
                param.help = None if text is None else text.replace("\\[", "[")
            super().format_help(ctx, formatter)
        finally:
            self.rich_markup_mode = markup_mode
            for param, text in zip(helped, texts, strict=True):
                param.help = text


_ELLIPSIS = "\N{HORIZONTAL ELLIPSIS}"
"""What rich puts where it cut a cell short."""


def _rich_help(command: typer.core.TyperCommand, ctx: Any) -> str:
    """The rich help ``command`` would print now, at the terminal's width, as text (nothing is printed)."""
    from typer import rich_utils

    markup_mode = command.rich_markup_mode
    if markup_mode is None:
        return ""
    consoles: list[Any] = []
    make_console = rich_utils._get_rich_console

    def capturing(stderr: bool = False) -> Any:
        console = make_console(stderr)
        console.begin_capture()
        consoles.append(console)
        return console

    rich_utils._get_rich_console = capturing
    try:
        rich_utils.rich_format_help(obj=command, ctx=ctx, markup_mode=markup_mode)
    finally:
        rich_utils._get_rich_console = make_console
    return "".join(console.end_capture() for console in consoles)


app = typer.Typer(
    name="dtypecheck",
    help="Will this model, checkpoint or training step survive in dtype X on device Y?",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class FailOn(str, Enum):
    fail = "fail"
    warn = "warn"


def _configured_default(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """A shared option left at its default takes ``[tool.dtypecheck]``'s value for this command, if it sets one.

    Click reports where a value came from; anything given on the command line wins. Options given on the command
    line are processed before those left at their default, so a ``--config FILE`` is already in ``ctx.params``.
    """
    name = param.name or ""
    source = ctx.get_parameter_source(name)
    if source is None or source.name != "DEFAULT":
        return value
    key, convert = _CONFIGURED_OPTIONS[name]
    explicit = ctx.params.get("config")
    scanned = _inputs(ctx)
    cache_key = f"dtypecheck.config:{explicit}:{scanned}"  # read once for both shared options
    if cache_key not in ctx.meta:
        ctx.meta[cache_key] = project_config(explicit, scanned)
    configured = ctx.meta[cache_key].get(ctx.info_name or "", key)
    # A callback's result reaches the command as it is, unconverted: give it the option's own type.
    return value if configured is None else convert(configured)


SCANNED_INPUTS: dict[str, str] = {}
"""Commands that scan checkpoints (``scan-model``), by the parameter holding them: a configuration shipped with
one of them (inside a checkpoint folder) is never read, even when the working folder's search meets it."""


def _inputs(ctx: typer.Context) -> tuple[str, ...]:
    # Arguments given on the command line are processed before the options left at their default, so it is here.
    value = ctx.params.get(SCANNED_INPUTS.get(ctx.info_name or "", ""))
    if isinstance(value, str):
        return (value,)
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list | tuple) else ()


_CONFIGURED_OPTIONS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "fmt": ("format", OutputFormat),
    "quiet": ("quiet", bool),
}
"""The parameter name each shared option has in every command, its config key and its type."""


def default_is(meaning: str) -> str:
    """The note that ends an option's help where typer shows no default (``None`` or a ``False`` flag): what the
    option does when not given. Escaped, since a bare ``[default: 1]`` is a rich style tag that rich swallows,
    leaving ``... per step .`` behind."""
    return f" \\[default: {meaning}]"


def _format_among(formats: tuple[OutputFormat, ...]) -> Callable[[Any], OutputFormat]:
    """``--format``'s parser for a command that writes ``formats``: only those are accepted and listed."""

    def parse(value: Any) -> OutputFormat:
        try:
            return parse_format(value, formats)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None

    return parse


def _configured_format_among(formats: tuple[OutputFormat, ...]) -> Callable[[typer.Context, Any, Any], Any]:
    """``_configured_default`` for ``--format``, which also holds the config's value to the command's formats."""

    def configured(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        chosen = _configured_default(ctx, param, value)
        try:
            return parse_format(chosen, formats)
        except ValueError as exc:  # the command line's value was parsed already: this one is the config's
            raise typer.BadParameter(
                f"{exc}; it is the format in [tool.dtypecheck]: give --format, or set format in this command's "
                f"own section ([tool.dtypecheck.{ctx.info_name}])"
            ) from None

    return configured


FormatOption = Annotated[
    OutputFormat,
    typer.Option(
        "--format",
        "-f",
        help=format_help(EVERY_FORMAT),
        metavar=format_metavar(EVERY_FORMAT),
        parser=_format_among(EVERY_FORMAT),
        callback=_configured_format_among(EVERY_FORMAT),
    ),
]
"""``--format`` of a command whose report has findings (scan-model, nan-trace): every format."""
ReportFormatOption = Annotated[
    OutputFormat,
    typer.Option(
        "--format",
        "-f",
        help=format_help(REPORT_FORMATS),
        metavar=format_metavar(REPORT_FORMATS),
        parser=_format_among(REPORT_FORMATS),
        callback=_configured_format_among(REPORT_FORMATS),
    ),
]
"""``--format`` of a command whose report has no findings (info, estimate-memory): no SARIF, no annotations."""


def output_folder_exists(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """The callback of an option that names a file to write (``--output``, ``--plot``): its folder must exist.
    Checked before any work starts: an hour-long trace should not end in "cannot write"."""
    if value is not None and not value.parent.is_dir():
        name = param.opts[0] if param.opts else "--output"
        raise typer.BadParameter(f"the folder {value.parent} does not exist", param_hint=f"'{name}'")
    return value


OutputOption = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        help="Write the document to FILE (atomically) instead of stdout." + default_is("stdout"),
        dir_okay=False,
        callback=output_folder_exists,
    ),
]
QuietOption = Annotated[
    bool,
    typer.Option(
        "--quiet/--no-quiet",
        "-q",
        help="No progress bar or notes on stderr (--no-quiet overrides quiet = true in the config).",
        callback=_configured_default,
    ),
]
TracebackOption = Annotated[
    bool,
    typer.Option(
        "--traceback",
        help="Show the full Python traceback on errors (or DTYPECHECK_TRACEBACK=1)."
        + default_is("off: one error line"),
    ),
]
FailOnOption = Annotated[
    FailOn | None,
    typer.Option(
        "--fail-on",
        help="Lowest level that makes the exit code 1 (findings): fail or warn." + default_is("fail, or as configured"),
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="Read the tool.dtypecheck settings from FILE."
        + default_is(
            "the nearest pyproject.toml with that table above the working folder (scan-model never reads one "
            "shipped with a checkpoint)"
        ),
        dir_okay=False,
    ),
]


def project_config(explicit: Path | None, scanned: tuple[str, ...] | list[str] = ()) -> Config:
    """The validated project configuration (``EMPTY`` when there is none); bad keys are usage errors.

    ``--config FILE`` wins; else the nearest one above the working folder that did not come with one of the
    ``scanned`` checkpoints (``Config.ignored`` lists those).
    """
    from dtypecheck.config import load_config

    return load_config(explicit, scanned=tuple(scanned))


def refuse_overwriting_inputs(inputs: tuple[str, ...] | list[str], written: dict[str, Path | None]) -> None:
    """A file the command writes (``written``: ``{"--output": path}``) that is one of its own inputs would be
    replaced by the report: ``scan-model model.safetensors -o model.safetensors`` lost the checkpoint, ``-o
    train.py`` the user's script. A usage error naming both; nothing is read or run before it."""
    from dtypecheck.usercode import python_target

    for flag, out in written.items():
        if out is None or not out.is_file():
            continue
        for target in inputs:
            code = python_target(target)
            source = code[0] if code is not None else Path(target)
            try:
                same = source.is_file() and source.samefile(out)
            except OSError:
                same = False
            if same:
                raise UsageError(
                    f"{flag} {out} is the input {source}: writing there would replace it; name another file"
                )


def pick(value: T | None, config: Config, command: str, key: str, default: T) -> T:
    """A command-line value wins; else the config's (the command's section, then the top level); else default."""
    if value is not None:
        return value
    configured = config.get(command, key)
    return default if configured is None else cast(T, configured)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"dtypecheck {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", help="Print the version and exit.", callback=_version_callback, is_eager=True),
    ] = False,
) -> None:
    """Will this model, checkpoint or training step survive in dtype X on device Y?

    Exit codes: 0 ok, 1 findings at or above --fail-on, 2 usage error, 3 input error.
    """


SPEAKER: list[str] = []
"""Who this process's ``error:`` line speaks for, where it is not the whole run: ``rank N`` for a rank of a
distributed nan-trace run, each of which runs its own script (scan-model's rank 0 speaks for its run)."""

ORIGIN_PID = os.getpid()
"""The process dtypecheck runs in. A child the user's code forks (a DataLoader worker, its own ``os.fork``) runs on up
the same stack; it must end as its own code says, never writing a document or an ``error:`` line."""
_real_os_exit = os._exit


def settle_start_up_heap() -> None:
    """Leave every object alive now (after a command's heavy imports: importing torch makes about half a million)
    out of the garbage collections still to come. A command's process ends with the command, and scanning those
    objects again at each full collection cost estimate-memory on a 70B config a sixth of its time. The command
    line only: the library never touches the collector."""
    import gc

    gc.freeze()


def end_if_forked_child(code: int = 0) -> None:
    """In a child forked by the user's code: flush and end it here with ``code``; in dtypecheck's process: return.

    Called where a document is emitted and where errors are reported (and by the ``os._exit`` guard), so that
    a child never speaks for the run, whichever command ran the user's code."""
    if os.getpid() == ORIGIN_PID:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    _real_os_exit(code)


USER_CODE: list[str] = []
"""Targets whose user code ran in this process (the console entry then exits the normal, slower way)."""


@contextlib.contextmanager
def user_code_guard(target: str, *, enabled: bool = True, script: bool = False) -> Iterator[None]:
    """Around a core call that may run the user's code (a factory, a script): stdout is the report's alone.

    Whatever the user's code writes to stdout, through ``print`` or straight to file descriptor 1 (``os.write``,
    a subprocess), goes to stderr instead; and a ``sys.exit`` or ``os._exit`` inside it becomes an input error
    (exit 3) rather than ending dtypecheck with no report and an exit code outside the contract.
    """
    from dtypecheck.usercode import python_target

    # A script runs user code whatever its name; otherwise only file.py[:factory] targets do, not checkpoints.
    if script or python_target(target) is not None:
        USER_CODE.append(target)
    with _standard_streams_kept():
        if not enabled:
            yield
            return
        with _stdout_to_stderr(target):
            yield


@contextlib.contextmanager
def _stdout_to_stderr(target: str) -> Iterator[None]:
    """``print`` and descriptor 1 go to stderr; ``sys.exit``/``os._exit`` become an input error."""
    sys.stdout.flush()
    saved_fd: int | None = None
    try:
        saved_fd = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        saved_fd = None  # no real stdout descriptor (embedded use): the Python-level redirect still applies
    real_exit = os._exit
    os._exit = _refuse_os_exit  # type: ignore[assignment]
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    except _OsExit as exc:
        raise UserCodeError(f"{target}: the user's code called os._exit({exc.code!r}); no report was made") from None
    except SystemExit as exc:
        end_if_forked_child(exc.code if isinstance(exc.code, int) else int(exc.code is not None))
        raise UserCodeError(f"{target}: the user's code called sys.exit({exc.code!r}); no report was made") from None
    finally:
        os._exit = real_exit
        with contextlib.suppress(OSError, ValueError):  # the user's code may have closed it
            sys.stderr.flush()
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


class _OsExit(SystemExit):
    """``os._exit`` called by the user's code: it would end dtypecheck with no report and any exit code."""


def _refuse_os_exit(code: int) -> None:
    end_if_forked_child(code)  # multiprocessing's forked children end with os._exit: theirs to call
    raise _OsExit(code)


@contextlib.contextmanager
def _standard_streams_kept() -> Iterator[None]:
    """Whatever the user's code does to the standard streams (closes or replaces ``sys.stdout``/``sys.stderr``,
    closes or redirects file descriptors 1 and 2), the document and the ``error:`` line reach the ones this
    process started with: descriptors duplicated before, put back after."""
    saved = sys.stdout, sys.stderr
    copies: dict[int, int] = {}
    for fd in (1, 2):
        with contextlib.suppress(OSError):  # no such descriptor (embedded use): nothing to keep
            copies[fd] = os.dup(fd)
    try:
        yield
    finally:
        for fd, copy in copies.items():
            with contextlib.suppress(OSError):
                os.dup2(copy, fd)
            os.close(copy)
        sys.stdout, sys.stderr = (_open_again(stream, fd) for stream, fd in zip(saved, (1, 2), strict=True))


def _open_again(stream: Any, fd: int) -> Any:
    """``stream`` if still open, else a new text stream on descriptor ``fd`` (the user's code closed it)."""
    if not getattr(stream, "closed", False):
        return stream
    import io

    encoding = getattr(stream, "encoding", None) or "utf-8"
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=encoding, line_buffering=True)


def emit(report: Report, fmt: OutputFormat, output: Path | None, *, quiet: bool, limit: int | None = None) -> None:
    """Render a finished report to stdout, or atomically to ``output``; nothing is written on failure. ``limit``:
    how many ranked rows a table shows (``render``)."""
    if output is not None:
        write_document(render(report, fmt, color=False, width=120, limit=limit), output, quiet=quiet)
        return
    color = fmt.for_people and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    width = None
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        import shutil

        # COLUMNS wins when set (also for a file or a pipe, as ls and git honour it); else the terminal's width
        width = shutil.get_terminal_size((120, 24)).columns
    write_document(render(report, fmt, color=color, width=width, limit=limit), None, quiet=quiet)


def write_document(text: str, output: Path | None, *, quiet: bool) -> None:
    """Write a rendered document atomically to ``output`` (saying so on stderr unless ``quiet``), else to stdout;
    a child process the user's code forked writes nothing: it ends here."""
    end_if_forked_child()
    if output is not None:
        write_atomically(output, text)
        if not quiet:
            print(f"wrote {output}", file=sys.stderr)
        return
    # a lone surrogate (a tensor name from a pickle) cannot be encoded: write it as a backslash escape instead
    sys.stdout.write(text.encode("utf-8", errors="backslashreplace").decode("utf-8"))
    sys.stdout.flush()


def level_exit_code(level: str, fail_on: FailOn | str | None) -> ExitCode:
    """Findings exit 1 when the report's level reaches ``--fail-on`` (``fail`` when not given)."""
    if level == "fail" or (level == "warn" and FailOn(fail_on or "fail") is FailOn.warn):
        return ExitCode.FINDINGS
    return ExitCode.OK
