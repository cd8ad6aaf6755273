"""``dtypecheck nan-trace``: parse (``resolve_nantrace_options``), then run (``execute_nantrace``)."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dtypecheck.cli._app import (
    SPEAKER,
    ConfigOption,
    FailOn,
    FailOnOption,
    FormatOption,
    HelpThatFits,
    OutputOption,
    QuietOption,
    TracebackOption,
    app,
    default_is,
    emit,
    level_exit_code,
    pick,
    project_config,
    refuse_overwriting_inputs,
    user_code_guard,
)
from dtypecheck.errors import UsageError, UserCodeError
from dtypecheck.nantrace.options import AUTOCAST_DTYPES, RunSettings, TraceOptions
from dtypecheck.render import OutputFormat, render

if TYPE_CHECKING:
    from dtypecheck.launcher import RankInfo
    from dtypecheck.nantrace.report import NanTraceReport

COMMAND = "nan-trace"
_RUN = RunSettings()


@app.command(COMMAND, cls=HelpThatFits)
def nan_trace(
    target: Annotated[
        str,
        typer.Argument(
            help="A script (train.py), run as __main__; or file.py:factory returning (model, inputs[, loss_fn])."
        ),
    ],
    script_args: Annotated[
        list[str] | None, typer.Argument(help="Arguments for the script, after '--'.", show_default=False)
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option("--steps", min=1, help="Factory mode: forward+backward+SGD steps." + default_is(str(_RUN.steps))),
    ] = None,
    autocast: Annotated[
        str | None,
        typer.Option(
            "--autocast",
            help="Run under torch.autocast in this dtype: float16 or bfloat16." + default_is("no autocast"),
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            help="Device for autocast, new tensors and the factory's model."
            + default_is("cpu (autocast and a factory's model); a script's own tensors stay where it puts them"),
        ),
    ] = None,
    history: Annotated[
        int | None,
        typer.Option("--history", min=0, help="Ops shown before each event." + default_is(str(TraceOptions.history))),
    ] = None,
    warn_frac: Annotated[
        float | None,
        typer.Option(
            "--warn-frac",
            min=0.0,
            max=1.0,
            help="Warn when an op's absmax reaches this share of its dtype's max."
            + default_is(str(TraceOptions.warn_frac)),
        ),
    ] = None,
    keep_going: Annotated[
        bool,
        typer.Option(
            "--keep-going",
            help="Collect every non-finite producer instead of stopping at the first." + default_is("off: stop"),
        ),
    ] = False,
    max_skipped_steps: Annotated[
        int | None,
        typer.Option(
            "--max-skipped-steps",
            min=1,
            help="Fail when GradScaler skips this many steps in a row (its scale collapsing)."
            + default_is(str(TraceOptions.max_skipped_steps)),
        ),
    ] = None,
    nproc: Annotated[
        int | None,
        typer.Option(
            "--nproc",
            min=1,
            help="Run it as this many ranks through torch.distributed.run (DDP/FSDP scripts); one merged report."
            + default_is("1: a plain process"),
        ),
    ] = None,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Near-plain speed: check loss, gradients and update each step; trace only the step that failed."
            + default_is("off: trace every op"),
        ),
    ] = False,
    no_optimizer_snapshot: Annotated[
        bool,
        typer.Option(
            "--no-optimizer-snapshot",
            help="With --watch: do not copy the parameters and optimizer state before each update (saves about "
            "model + optimizer state of memory; a NaN born inside the update then falls back to tracing the next "
            "steps)." + default_is("off: snapshot"),
        ),
    ] = False,
    fail_on: FailOnOption = None,
    config: ConfigOption = None,
    fmt: FormatOption = OutputFormat.table,
    output: OutputOption = None,
    quiet: QuietOption = False,
    traceback: TracebackOption = False,
) -> int:
    """Name the first op, module and line that produced NaN/Inf in a training step.

    Runs a script or factory with every op checked: why it happened and what came close before; also the
    default-dtype changes, the first float64 promotion, and an explained dtype-mismatch error.

    Exit codes: 0 clean, 1 NaN/Inf found (or warnings with --fail-on warn), 2 usage, 3 script not runnable or raised
    (a dtype mismatch is explained and the report still written first).
    """
    given = NanTraceFlags(
        steps, autocast, device, history, warn_frac, keep_going, max_skipped_steps, fail_on, config, watch,
        not no_optimizer_snapshot,
    )  # fmt: skip
    options = resolve_nantrace_options(target, script_args, given, nproc=nproc, fmt=fmt, output=output, quiet=quiet)
    return execute_nantrace(options)


@dataclass(frozen=True)
class NanTraceFlags:
    """The command line's tracing flags as given (None: not given, so the project config or the default applies)."""

    steps: int | None = None
    autocast: str | None = None
    device: str | None = None
    history: int | None = None
    warn_frac: float | None = None
    keep_going: bool = False
    max_skipped_steps: int | None = None
    fail_on: FailOn | None = None
    config: Path | None = None
    watch: bool = False
    optimizer_snapshot: bool = True


@dataclass(frozen=True)
class NanTraceOptions:
    """What ``dtypecheck nan-trace`` was asked, with conflicts already rejected and defaults filled in."""

    path: Path
    """The script, or the file defining the factory."""
    factory: str | None
    """The factory's name (``file.py:factory``); None for a script."""
    script_args: tuple[str, ...]
    run: RunSettings
    threshold: FailOn
    fmt: OutputFormat
    output: Path | None
    """Where to write the report (absolute: the script may change directory); stdout if None."""
    quiet: bool
    nproc: int | None = None
    """Launch this many ranks (``launch_arguments`` is what each runs); None to trace in this process."""
    launch_arguments: tuple[str, ...] = ()
    rank: RankInfo | None = None
    """This process is one rank of a distributed run."""


def resolve_nantrace_options(
    target: str,
    script_args: list[str] | None,
    given: NanTraceFlags,
    *,
    nproc: int | None,
    fmt: OutputFormat,
    output: Path | None,
    quiet: bool,
) -> NanTraceOptions:
    """Fill in the project config and the defaults, and reject what cannot run with a UsageError naming the flag.

    Runs no user code (``--nproc`` checks that the script is a readable Python file, once, rather than per rank)."""
    from dtypecheck.launcher import rank_info
    from dtypecheck.nantrace.launch import launch_arguments
    from dtypecheck.nantrace.runner import split_target
    from dtypecheck.usercode import check_python_file

    refuse_overwriting_inputs([target], {"--output": output})
    settings = project_config(given.config)
    autocast = _autocast_name(pick(given.autocast, settings, COMMAND, "autocast", None))
    device = pick(given.device, settings, COMMAND, "device", None)
    _check_device(device, "--device" if given.device is not None else settings.where(COMMAND, "device"))
    trace = TraceOptions(
        keep_going=pick(True if given.keep_going else None, settings, COMMAND, "keep-going", TraceOptions.keep_going),
        history=pick(given.history, settings, COMMAND, "history", TraceOptions.history),
        warn_frac=pick(given.warn_frac, settings, COMMAND, "warn-frac", TraceOptions.warn_frac),
        max_skipped_steps=pick(
            given.max_skipped_steps, settings, COMMAND, "max-skipped-steps", TraceOptions.max_skipped_steps
        ),
    )
    steps = pick(given.steps, settings, COMMAND, "steps", _RUN.steps)
    watch = pick(True if given.watch else None, settings, COMMAND, "watch", _RUN.watch)
    if watch and trace.keep_going:
        raise UsageError("--watch and --keep-going cannot be combined: watch mode replays the first failing step only")
    if not given.optimizer_snapshot and not watch:
        raise UsageError("--no-optimizer-snapshot applies to --watch (a full trace copies nothing)")
    threshold = FailOn(pick(given.fail_on, settings, COMMAND, "fail-on", FailOn.fail))
    path, factory = split_target(target)
    arguments = tuple(script_args or ())
    resolved = NanTraceOptions(
        path=path,
        factory=factory,
        script_args=arguments,
        run=RunSettings(trace, autocast, device, steps, watch=watch, optimizer_snapshot=given.optimizer_snapshot),
        threshold=threshold,
        fmt=fmt,
        output=output.absolute() if output is not None else None,
        quiet=quiet,
    )
    info = rank_info()
    if nproc is not None and info is None:
        if factory is not None:
            raise UsageError("--nproc runs a script (train.py) as several ranks, not file.py:factory")
        check_python_file(path)
        flags = {
            "--autocast": given.autocast,
            "--device": given.device,
            "--history": given.history,
            "--warn-frac": given.warn_frac,
            "--max-skipped-steps": given.max_skipped_steps,
            "--fail-on": given.fail_on.value if given.fail_on is not None else None,
            "--config": given.config,
            "--format": fmt.value,
            "--output": resolved.output,
        }
        switches = {
            "--keep-going": given.keep_going,
            "--quiet": quiet,
            "--watch": watch,
            "--no-optimizer-snapshot": not given.optimizer_snapshot,
        }
        relaunch = launch_arguments(path, list(arguments), flags, switches)
        return dataclasses.replace(resolved, nproc=nproc, launch_arguments=tuple(relaunch))
    if info is not None:
        if factory is not None:
            raise UsageError("a distributed run (torchrun) traces a script, not file.py:factory")
        run = dataclasses.replace(resolved.run, options=dataclasses.replace(trace, rank=info.rank))
        return dataclasses.replace(resolved, run=run, rank=info)
    if factory is not None and arguments:
        raise UsageError("script arguments after '--' apply to scripts, not to file.py:factory")
    if factory is None and given.steps is not None:
        raise UsageError("--steps applies to file.py:factory; a script runs its own loop")
    return resolved


def _autocast_name(autocast: str | None) -> str | None:
    from dtypecheck.dtypes import lookup

    if autocast is None:
        return None
    name = lookup(autocast).name
    if name not in AUTOCAST_DTYPES:
        raise UsageError(f"--autocast takes float16 or bfloat16, not {autocast!r}")
    return name


def _check_device(device: str | None, named: str | None) -> None:
    """``named``: where the device was given (the flag, or the configuration's key), as the message says it."""
    if device is None:
        return
    import torch

    try:
        chosen = torch.device(device)
    except RuntimeError as exc:
        raise UsageError(f"{named} {device!r}: {exc}") from None
    backend = getattr(torch, chosen.type, None) if chosen.type != "cpu" else None
    available = getattr(backend, "is_available", None)
    if chosen.type not in ("cpu", "meta") and (available is None or not available()):
        raise UsageError(f"{named} {device!r}: this machine (torch {torch.__version__}) has no {chosen.type} device")


def execute_nantrace(options: NanTraceOptions) -> int:
    """Trace what the options ask (launch the ranks, be one rank, a factory or a script), emit, return the code."""
    from dtypecheck.nantrace.runner import run_factory, run_script
    from dtypecheck.render.progress import progress_bar

    if options.nproc is not None:
        from dtypecheck.nantrace.launch import launch

        return launch(options.nproc, list(options.launch_arguments))
    if options.rank is not None:
        from dtypecheck.nantrace.launch import run_rank

        SPEAKER[:] = [f"rank {options.rank.rank}"]  # each rank runs the script: its error line names it
        run_rank(
            options.rank,
            options.path,
            list(options.script_args),
            options.run,
            to_text=lambda merged: render(merged, options.fmt, color=False, width=120),
            for_people=options.fmt.for_people,
            output=options.output,
            exit_code=lambda merged: _exit_code(merged, options.threshold),
            guard=lambda captured: user_code_guard(str(options.path), enabled=captured, script=True),
        )
    if options.factory is not None:
        target = f"{options.path}:{options.factory}"
        with user_code_guard(target), progress_bar(COMMAND, quiet=options.quiet, unit="steps") as progress:
            report = run_factory(options.path, options.factory, options.run.steps, options.run, progress=progress)
    else:
        # stdout must hold only the document: the script's own output (prints, os.write, subprocesses) goes to
        # stderr. With a table the script's output stays where the user expects it.
        captured = not options.fmt.for_people
        with user_code_guard(str(options.path), enabled=captured, script=True):
            report = run_script(
                options.path, list(options.script_args), options.run, stdout=sys.stderr if captured else None
            )
    emit(report, options.fmt, options.output, quiet=options.quiet)
    if report.dtype_error is not None:
        _exit_with_dtype_error(report, options.fmt, options.output)
    return int(level_exit_code(report.level, options.threshold))


def _exit_code(merged: NanTraceReport, threshold: FailOn) -> int:
    """A distributed run's code: a rank missing or dead of a dtype mismatch is an input error."""
    from dtypecheck.errors import ExitCode

    if merged.dtype_error is not None or any(r.status == "missing" for r in merged.ranks):
        return int(ExitCode.INPUT_ERROR)
    return int(level_exit_code(merged.level, threshold))


def _exit_with_dtype_error(report: NanTraceReport, fmt: OutputFormat, output: Path | None) -> None:
    """The document is out (status "error", the explanation in it); now exit 3 with the script's own traceback
    and one error line that carries the fix. The full explanation goes to stderr only when no document shows it
    (a table written to a file)."""
    from dtypecheck.nantrace.explain import explanation_text

    error = report.dtype_error
    assert error is not None
    hidden = fmt.for_people and output is not None
    formatted = error.traceback + ("\n" + explanation_text(error) if hidden else "")
    source = Path(report.source).name if report.source else "the traced code"
    message = error.exception.splitlines()[0] if error.exception else "dtype mismatch"
    fix = f"; fix: {error.fix}" if error.fix else ""
    raise UserCodeError(f"{source} died of a dtype mismatch: {message}{fix}", formatted)
