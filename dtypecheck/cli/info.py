"""``dtypecheck info``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dtypecheck.cli._app import (
    ConfigOption,
    FormatOption,
    HelpThatFits,
    OutputOption,
    QuietOption,
    TracebackOption,
    app,
    default_is,
    emit,
)
from dtypecheck.errors import ExitCode, UsageError
from dtypecheck.output import REPORT_FORMATS, format_names
from dtypecheck.render import OutputFormat

if TYPE_CHECKING:
    from dtypecheck.dtypes import DtypeSpec


@app.command(cls=HelpThatFits)
def info(
    dtypes: Annotated[
        list[str] | None,
        typer.Argument(help="Dtype names or aliases (fp16, bf16, e4m3, int4, ...); all float dtypes if none."),
    ] = None,
    all_dtypes: Annotated[
        bool,
        typer.Option(
            "--all", help="Every dtype this torch build has, integers included." + default_is("off: float dtypes")
        ),
    ] = False,
    list_names: Annotated[
        bool,
        typer.Option(
            "--list",
            help="Only the dtype names this torch build has, their kind, bits and aliases." + default_is("off"),
        ),
    ] = False,
    promote: Annotated[
        bool,
        typer.Option(
            "--promote",
            help="Show torch's type promotion of the given dtypes and the rule behind it." + default_is("off"),
        ),
    ] = False,
    config: ConfigOption = None,
    fmt: FormatOption = OutputFormat.table,
    output: OutputOption = None,
    quiet: QuietOption = False,
    traceback: TracebackOption = False,
) -> int:
    """Everything about a dtype's numbers, measured on every device.

    True limits from the bit layout, what torch.finfo says (and where it is wrong), what each available device
    measures, guidance for log/Adam/exp, and with --promote torch's type promotion explained. --list shows every
    dtype name and alias instead.

    Exit codes: 0 ok, 2 unknown dtype or conflicting options.
    """
    options = resolve_info_options(
        dtypes, all_dtypes=all_dtypes, list_names=list_names, promote=promote, fmt=fmt, output=output, quiet=quiet
    )
    return execute_info(options)


@dataclass(frozen=True)
class InfoOptions:
    """What ``dtypecheck info`` was asked, with conflicts already rejected."""

    specs: tuple[DtypeSpec, ...]
    """The dtypes to describe; empty means every float dtype (or, with ``list_names``, unused)."""
    list_names: bool
    """Only list the dtype names this torch build has."""
    promote: bool
    """Explain torch's type promotion of ``specs`` (at least two)."""
    fmt: OutputFormat
    """The output format."""
    output: Path | None
    """Where to write the report; stdout if None."""
    quiet: bool
    """Silence progress and notes on stderr."""


def resolve_info_options(
    dtypes: list[str] | None,
    *,
    all_dtypes: bool,
    list_names: bool,
    promote: bool,
    fmt: OutputFormat,
    output: Path | None,
    quiet: bool,
) -> InfoOptions:
    """Parse dtype names and reject conflicting flags with a UsageError naming them; runs nothing."""
    from dtypecheck.dtypes import REGISTRY, parse_dtype_list

    if list_names:
        clashes = (("dtype names", bool(dtypes)), ("--all", all_dtypes), ("--promote", promote))
        given = [flag for flag, on in clashes if on]
        if given:
            raise UsageError(f"--list shows every dtype name; it does not combine with {given[0]}")
        if fmt.findings_only:
            names = format_names(REPORT_FORMATS)
            raise UsageError(f"--list writes {names}, not {fmt.value} (a list of names has no findings)")
        return InfoOptions((), True, False, fmt, output, quiet)
    if all_dtypes and dtypes:
        raise UsageError("--all and explicit dtype names conflict; give one or the other")
    specs = [s for s in REGISTRY if s.available] if all_dtypes else parse_dtype_list(dtypes)
    if promote and len(specs) < 2:
        raise UsageError("--promote needs at least two dtypes, e.g. 'dtypecheck info --promote fp16 bf16 int8'")
    return InfoOptions(tuple(specs), False, promote, fmt, output, quiet)


def execute_info(options: InfoOptions) -> int:
    """Build the report the options ask for, render it through ``emit`` and return the exit code."""
    if options.list_names:
        from dtypecheck.info import list_dtypes

        emit(list_dtypes(), options.fmt, options.output, quiet=options.quiet)
        return ExitCode.OK
    from dtypecheck.info import describe_dtypes

    report = describe_dtypes(list(options.specs) or None, with_promotion=options.promote)
    emit(report, options.fmt, options.output, quiet=options.quiet)
    return ExitCode.OK
