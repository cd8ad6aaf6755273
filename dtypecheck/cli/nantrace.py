"""``dtypecheck nan-trace``."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dtypecheck.cli._app import (
    ConfigOption,
    FailOn,
    FailOnOption,
    FormatOption,
    OutputOption,
    QuietOption,
    TracebackOption,
    app,
    emit,
    level_exit_code,
    pick,
    project_config,
    user_code_guard,
)
from dtypecheck.errors import ExitCode, UsageError, UserCodeError
from dtypecheck.nantrace.launch import EXIT_FILE_ENV
from dtypecheck.render import OutputFormat

if TYPE_CHECKING:
    from dtypecheck.nantrace.distributed import RankInfo
    from dtypecheck.nantrace.report import NanTraceReport
    from dtypecheck.nantrace.runner import RunSettings

AUTOCAST_DTYPES = ("float16", "bfloat16")
COMMAND = "nan-trace"


@app.command(COMMAND)
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
        int | None, typer.Option("--steps", min=1, help="Factory mode: forward+backward+SGD steps [default: 3]")
    ] = None,
    autocast: Annotated[
        str | None, typer.Option("--autocast", help="Run under torch.autocast in this dtype: float16 or bfloat16.")
    ] = None,
    device: Annotated[
        str | None, typer.Option("--device", help="Device for autocast, new tensors and the factory's model.")
    ] = None,
    history: Annotated[
        int | None, typer.Option("--history", min=0, help="Ops shown before each event [default: 20]")
    ] = None,
    warn_frac: Annotated[
        float | None,
        typer.Option(
            "--warn-frac",
            min=0.0,
            max=1.0,
            help="Warn when an op's absmax reaches this share of its dtype's max [default: 0.5]",
        ),
    ] = None,
    keep_going: Annotated[
        bool, typer.Option("--keep-going", help="Collect every non-finite producer instead of stopping at the first.")
    ] = False,
    max_skipped_steps: Annotated[
        int | None,
        typer.Option(
            "--max-skipped-steps",
            min=1,
            help="Fail when GradScaler skips this many steps in a row (its scale collapsing) [default: 16]",
        ),
    ] = None,
    nproc: Annotated[
        int | None,
        typer.Option(
            "--nproc",
            min=1,
            help="Run it as this many ranks through torch.distributed.run (DDP/FSDP scripts); one merged report.",
        ),
    ] = None,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Near-plain speed: check loss, gradients and update each step; trace only the step that failed.",
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
    from dtypecheck.dtypes import lookup
    from dtypecheck.nantrace.distributed import rank_info
    from dtypecheck.nantrace.launch import launch
    from dtypecheck.nantrace.runner import RunSettings, run_factory, run_script, split_target
    from dtypecheck.nantrace.tracer import TraceOptions
    from dtypecheck.render.progress import progress_bar
    from dtypecheck.usercode import check_python_file

    settings = project_config(config)
    autocast = pick(autocast, settings, COMMAND, "autocast", None)
    device = pick(device, settings, COMMAND, "device", None)
    autocast_name = None
    if autocast is not None:
        autocast_name = lookup(autocast).name
        if autocast_name not in AUTOCAST_DTYPES:
            raise UsageError(f"--autocast takes float16 or bfloat16, not {autocast!r}")
    if device is not None:
        import torch

        try:
            chosen = torch.device(device)
        except RuntimeError as exc:
            raise UsageError(f"--device {device!r}: {exc}") from None
        backend = getattr(torch, chosen.type, None) if chosen.type != "cpu" else None
        available = getattr(backend, "is_available", None)
        if chosen.type not in ("cpu", "meta") and (available is None or not available()):
            raise UsageError(f"--device {device}: this machine (torch {torch.__version__}) has no {chosen.type} device")
    options = TraceOptions(
        keep_going=pick(True if keep_going else None, settings, COMMAND, "keep-going", False),
        history=pick(history, settings, COMMAND, "history", 20),
        warn_frac=pick(warn_frac, settings, COMMAND, "warn-frac", 0.5),
        max_skipped_steps=pick(max_skipped_steps, settings, COMMAND, "max-skipped-steps", 16),
    )
    watch = pick(True if watch else None, settings, COMMAND, "watch", False)
    if watch and options.keep_going:
        raise UsageError("--watch and --keep-going cannot be combined: watch mode replays the first failing step only")
    run = RunSettings(options, autocast_name, device, watch=watch)
    threshold = FailOn(pick(fail_on, settings, COMMAND, "fail-on", FailOn.fail))
    path, factory = split_target(target)
    info = rank_info()
    if nproc is not None and info is None:
        if factory is not None:
            raise UsageError("--nproc runs a script (train.py) as several ranks, not file.py:factory")
        check_python_file(path)  # once, here, rather than one error per rank
        given = {
            "--autocast": autocast,
            "--device": device,
            "--history": history,
            "--warn-frac": warn_frac,
            "--max-skipped-steps": max_skipped_steps,
            "--fail-on": fail_on.value if isinstance(fail_on, FailOn) else fail_on,
            "--config": config,
            "--format": fmt.value,
            "--output": output.resolve() if output is not None else None,
        }
        arguments = [str(path.resolve())] + [f"{flag}={value}" for flag, value in given.items() if value is not None]
        arguments += [flag for flag, on in (("--keep-going", keep_going), ("--quiet", quiet), ("--watch", watch)) if on]
        return launch(nproc, [*arguments, "--", *(script_args or [])])
    if info is not None:
        if factory is not None:
            raise UsageError("a distributed run (torchrun) traces a script, not file.py:factory")
        options = dataclasses.replace(options, rank=info.rank)
        return _run_rank(
            info,
            path,
            list(script_args or []),
            RunSettings(options, autocast_name, device, watch=watch),
            fmt,
            output,
            quiet,
            threshold,
        )
    if factory is not None:
        if script_args:
            raise UsageError("script arguments after '--' apply to scripts, not to file.py:factory")
        with user_code_guard(target), progress_bar("nan-trace", quiet=quiet, unit="steps") as progress:
            if watch:
                from dtypecheck.nantrace.watch.run import run_factory_watched as run_factory
            report = run_factory(path, factory, pick(steps, settings, COMMAND, "steps", 3), run, progress=progress)
    else:
        if steps is not None:
            raise UsageError("--steps applies to file.py:factory; a script runs its own loop")
        # stdout must hold only the document: the script's own output (prints, os.write, subprocesses) goes to
        # stderr. With a table the script's output stays where the user expects it.
        script_stdout = sys.stderr if fmt is not OutputFormat.table else None
        with user_code_guard(target, enabled=fmt is not OutputFormat.table, script=True):
            if watch:
                from dtypecheck.nantrace.watch.run import run_script_watched as run_script
            report = run_script(path, list(script_args or []), run, stdout=script_stdout)
    emit(report, fmt, output, quiet=quiet)
    if report.dtype_error is not None:
        _exit_with_dtype_error(report, fmt, output)
    return int(level_exit_code(report.level, threshold))


def _run_rank(
    info: RankInfo,
    path: Path,
    script_args: list[str],
    run: RunSettings,
    fmt: OutputFormat,
    output: Path | None,
    quiet: bool,
    threshold: FailOn,
) -> int:
    """One rank of a torchrun run: trace, then merge with the other ranks; rank 0 writes the merged report."""
    from dtypecheck.nantrace.distributed import Session
    from dtypecheck.nantrace.launch import write_exit_code
    from dtypecheck.nantrace.runner import run_script
    from dtypecheck.render import render, write_atomically

    real_stdout = os.dup(1)  # the merged report may be written from the watcher, while stdout goes to stderr

    def deliver(merged: NanTraceReport) -> int:
        code = int(level_exit_code(merged.level, threshold))
        if merged.dtype_error is not None or any(r.status == "missing" for r in merged.ranks):
            code = int(ExitCode.INPUT_ERROR)
        if info.rank == 0:
            if output is not None:
                write_atomically(output, render(merged, fmt, color=False, width=120))
            else:
                os.write(real_stdout, render(merged, fmt, color=False, width=120).encode())
        launched = write_exit_code(code) if info.rank == 0 else EXIT_FILE_ENV in os.environ
        return 0 if launched else code

    def end_process(code: int) -> None:
        # The script's process group and sharded model are still alive (a peer may be gone): tearing them down
        # can hang or crash, and the report is out.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    if run.watch:
        from dtypecheck.nantrace.watch.run import run_script_watched as run_script
    session = Session(info, deliver, end_process)
    script_stdout = sys.stderr if fmt is not OutputFormat.table or info.rank != 0 else None
    try:
        with user_code_guard(str(path), enabled=script_stdout is not None, script=True):
            report = run_script(path, script_args, run, stdout=script_stdout, session=session)
    except BaseException:
        session.abandon()
        raise
    end_process(session.finish(report))
    return 0  # not reached


def _exit_with_dtype_error(report: NanTraceReport, fmt: OutputFormat, output: Path | None) -> None:
    """The document is out (status "error", the explanation in it); now exit 3 with the script's own traceback
    and one error line that carries the fix. The full explanation goes to stderr only when no document shows it
    (a table written to a file)."""
    from dtypecheck.nantrace.explain import explanation_text

    error = report.dtype_error
    assert error is not None
    hidden = fmt is OutputFormat.table and output is not None
    formatted = error.traceback + ("\n" + explanation_text(error) if hidden else "")
    source = Path(report.source).name if report.source else "the traced code"
    message = error.exception.splitlines()[0] if error.exception else "dtype mismatch"
    fix = f"; fix: {error.fix}" if error.fix else ""
    raise UserCodeError(f"{source} died of a dtype mismatch: {message}{fix}", formatted)
