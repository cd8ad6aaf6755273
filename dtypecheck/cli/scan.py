"""``dtypecheck scan-model``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dtypecheck.cli._app import (
    CONFIG_NEAR,
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
from dtypecheck.cli.scan_baseline import Baselines, configured_path, entry_key, shown
from dtypecheck.errors import ExitCode, UsageError
from dtypecheck.loaders.formats import describe_formats
from dtypecheck.render import OutputFormat

if TYPE_CHECKING:
    from dtypecheck.config import Config

DEFAULT_TOP = 20
CONFIG_NEAR["scan-model"] = "checkpoints"  # [tool.dtypecheck] is found from the first checkpoint's folder upwards


@app.command("scan-model")
def scan_model(
    checkpoints: Annotated[
        list[str],
        typer.Argument(
            metavar="CKPT",
            help=f"A checkpoint file or folder, detected by content: {describe_formats()}; or "
            "path/to/file.py:factory returning an nn.Module, (model, inputs) or (model, inputs, loss_fn); or a "
            "Hugging Face Hub id org/name[@revision] (local cache first; extra 'hf'). Several (as pre-commit passes "
            "them) are scanned one after another with table or github output.",
        ),
    ],
    target: Annotated[
        list[str] | None,
        typer.Option(
            "--target",
            "-t",
            help="Target dtype to judge casts to; repeatable, comma lists (any float incl. float8/float4, or an "
            "integer dtype). Default: float16,bfloat16.",
        ),
    ] = None,
    show_all: Annotated[
        bool | None, typer.Option("--all", help="Show every tensor in the table, not only the worst.")
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(
            "--baseline",
            dir_okay=False,
            help="A baseline file (written by --update-baseline; an earlier scan-model --format json report also "
            "works for one checkpoint): the exit code follows only what is new or worse. Default: the baseline key "
            "of tool.dtypecheck.scan-model in pyproject.toml.",
        ),
    ] = None,
    update_baseline: Annotated[
        bool,
        typer.Option(
            "--update-baseline",
            help="Write this scan's reports into the baseline file (--baseline or the configured one) instead of "
            "comparing: only the entries of the checkpoints scanned change. Exits 0 unless a scan cannot run.",
        ),
    ] = False,
    no_baseline: Annotated[
        bool,
        typer.Option("--no-baseline", help="Ignore the configured baseline: gate on everything found."),
    ] = False,
    top: Annotated[
        int, typer.Option("--top", min=1, help="How many tensors the table shows, worst first (without --all).")
    ] = DEFAULT_TOP,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            dir_okay=False,
            help="Also draw the checkpoint's log2-magnitude distribution against the targets' ranges to FILE.png "
            "(needs the 'plot' extra: matplotlib).",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", min=1, help="Threads scanning chunks (default: the CPU count, at most 8)."),
    ] = None,
    precision: Annotated[
        bool,
        typer.Option(
            "--precision",
            help="Also measure the precision each cast loses (SQNR in dB, max relative error), and for float8/float4 "
            "targets per-channel and MX block-scaled verdicts; reads every tensor a second time.",
        ),
    ] = False,
    keep_float32_sqnr: Annotated[
        float | None,
        typer.Option(
            "--keep-float32-sqnr",
            min=0.0,
            metavar="DB",
            help="With --precision: a cast whose SQNR is below DB loses too much; tensors that no requested 16-bit "
            "or narrower target holds are listed to keep in float32 (default 20; config keep-float32-sqnr-db).",
        ),
    ] = None,
    fail_on: FailOnOption = None,
    config: ConfigOption = None,
    fmt: FormatOption = OutputFormat.table,
    output: OutputOption = None,
    quiet: QuietOption = False,
    traceback: TracebackOption = False,
) -> int:
    """Every tensor of a checkpoint against its own dtype's limits and the targets'.

    NaN/inf, min/max, and exact overflow / underflow / subnormal counts for each target (float8 targets also after
    per-tensor scaling), the dtype census and dtype-consistency findings; nothing in a pickle is executed.

    Exit codes: 0 ok, 1 a tensor or finding at or above --fail-on, 2 usage error, 3 unreadable checkpoint.
    """
    from dtypecheck.dtypes import parse_dtype_list
    from dtypecheck.render.progress import progress_bar
    from dtypecheck.scan.baseline import compare, nothing_before
    from dtypecheck.scan.keep_float32 import DEFAULT_MIN_SQNR_DB
    from dtypecheck.scan.run import scan_checkpoint
    from dtypecheck.scan.targets import check_targets

    if no_baseline and (baseline is not None or update_baseline):
        raise UsageError("--no-baseline leaves the baseline out; it cannot go with --baseline or --update-baseline")
    several = len(checkpoints) > 1
    if several and (fmt in (OutputFormat.json, OutputFormat.sarif) or output is not None or plot is not None):
        raise UsageError("one checkpoint per JSON/SARIF document, --output or --plot; scan them one at a time")
    jobs = [_job(checkpoint, config, target, baseline, no_baseline) for checkpoint in checkpoints]
    baselines = Baselines(update=update_baseline)
    for job in jobs:
        if job.baseline is None and update_baseline:
            raise UsageError(
                f"--update-baseline: no baseline file for {job.checkpoint}; give --baseline FILE or set "
                "baseline in [tool.dtypecheck.scan-model]"
            )
        if job.baseline is not None:
            baselines.open(job.baseline, job.where)
    if plot is not None:
        from dtypecheck.render.scan_plot import require_matplotlib

        require_matplotlib()
        if plot.suffix.lower() != ".png":
            raise UsageError(f"--plot {plot}: the plot is written as PNG; name the file *.png")
    code = ExitCode.OK
    for job in jobs:
        checkpoint, settings = job.checkpoint, job.settings
        targets = check_targets(parse_dtype_list(job.targets)) if job.targets else None
        min_sqnr = float(pick(keep_float32_sqnr, settings, "scan-model", "keep-float32-sqnr-db", DEFAULT_MIN_SQNR_DB))
        with user_code_guard(checkpoint), progress_bar("scanning", quiet=quiet, unit="bytes") as progress:
            report = scan_checkpoint(
                checkpoint,
                targets,
                progress=progress,
                workers=workers,
                policy=settings.scan_policy,
                precision=precision,
                keep_float32_sqnr_db=min_sqnr,
            )
        everything = pick(show_all, settings, "scan-model", "all", False)
        report = dataclasses.replace(report, display_limit=None if everything else top)
        if job.baseline is not None and update_baseline:
            baselines.record(job.baseline, job.key, report)
        elif job.baseline is not None:
            earlier = baselines.earlier(job.baseline, job.key, alone=not several)
            if earlier is None and not quiet:
                typer.echo(
                    f"note: {job.where} has no entry for {job.key}: everything it finds counts as new "
                    "(add it with --update-baseline)",
                    err=True,
                )
            comparison = compare(report, earlier or nothing_before(job.key), str(job.baseline))
            report = dataclasses.replace(report, baseline=comparison)
        if plot is not None:
            from dtypecheck.render.scan_plot import write_plot

            write_plot(report, plot)
        emit(report, fmt, output, quiet=quiet)
        if plot is not None and not quiet:
            typer.echo(f"wrote {plot}", err=True)
        threshold = FailOn(pick(fail_on, settings, "scan-model", "fail-on", FailOn.fail))
        if not update_baseline:
            code = max(code, level_exit_code(report.gate_level, threshold))
    baselines.write(quiet=quiet)
    return int(code)


@dataclasses.dataclass(frozen=True)
class _Job:
    """One checkpoint of the run, with what its own configuration (or the command line) says about it."""

    checkpoint: str
    """As typed."""
    settings: Config
    """Its own configuration (``--config``, else the nearest above its folder, else above the working folder)."""
    targets: list[str]
    """Dtype names from ``--target`` or the configuration; empty for the default targets."""
    baseline: Path | None
    """The baseline file it is compared with (or, with ``--update-baseline``, written into); None without one."""
    where: str
    """How errors and notes name the baseline file."""
    key: str
    """The checkpoint's entry in the baseline file."""


def _job(checkpoint: str, config: Path | None, target: list[str] | None, baseline: Path | None, off: bool) -> _Job:
    settings = project_config(config, checkpoint)
    names = target or pick(None, settings, "scan-model", "targets", [])
    configured = None if off or baseline is not None else configured_path(settings, "baseline")
    path = baseline or configured
    where = f"--baseline {path}"
    if configured is not None and settings.path is not None:
        where = f"baseline {shown(configured)} (from {shown(settings.path)})"
    return _Job(checkpoint, settings, list(names), path, where, entry_key(checkpoint, settings))
