"""``dtypecheck scan-model``."""

from __future__ import annotations

import dataclasses
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
from dtypecheck.errors import ExitCode, UsageError
from dtypecheck.loaders.formats import describe_formats
from dtypecheck.render import OutputFormat

if TYPE_CHECKING:
    from dtypecheck.config import Config

DEFAULT_TOP = 20


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
            help="An earlier scan-model --format json report: the exit code follows only what is new or worse.",
        ),
    ] = None,
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
    from dtypecheck.scan.baseline import compare, load_baseline
    from dtypecheck.scan.keep_float32 import DEFAULT_MIN_SQNR_DB
    from dtypecheck.scan.scan import scan_checkpoint
    from dtypecheck.scan.targets import check_targets

    settings = project_config(config)
    names = target or pick(None, settings, "scan-model", "targets", [])
    targets = check_targets(parse_dtype_list(names)) if names else None
    everything = pick(show_all, settings, "scan-model", "all", False)
    min_sqnr = float(pick(keep_float32_sqnr, settings, "scan-model", "keep-float32-sqnr-db", DEFAULT_MIN_SQNR_DB))
    threshold = FailOn(pick(fail_on, settings, "scan-model", "fail-on", FailOn.fail))
    baseline_path = baseline or _configured_path(settings, "baseline")
    if len(checkpoints) > 1:
        if fmt in (OutputFormat.json, OutputFormat.sarif) or output is not None or plot is not None:
            raise UsageError("one checkpoint per JSON/SARIF document, --output or --plot; scan them one at a time")
        if baseline_path is not None:
            raise UsageError("--baseline compares one checkpoint with its own earlier report; give one checkpoint")
    earlier = load_baseline(baseline_path) if baseline_path is not None else None
    if plot is not None:
        from dtypecheck.render.scan_plot import require_matplotlib

        require_matplotlib()
        if plot.suffix.lower() != ".png":
            raise UsageError(f"--plot {plot}: the plot is written as PNG; name the file *.png")
    code = ExitCode.OK
    for checkpoint in checkpoints:
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
        report = dataclasses.replace(report, display_limit=None if everything else top)
        if earlier is not None and baseline_path is not None:
            comparison = compare(report, earlier, str(baseline_path))
            report = dataclasses.replace(report, baseline=comparison)
        if plot is not None:
            from dtypecheck.render.scan_plot import write_plot

            write_plot(report, plot)
        emit(report, fmt, output, quiet=quiet)
        if plot is not None and not quiet:
            typer.echo(f"wrote {plot}", err=True)
        code = max(code, level_exit_code(report.gate_level, threshold))
    return int(code)


def _configured_path(settings: Config, key: str) -> Path | None:
    """A path from the config file is relative to the folder of that file, as ruff and mypy read theirs."""
    value = settings.get("scan-model", key)
    if value is None:
        return None
    path = Path(str(value))
    return path if path.is_absolute() or settings.path is None else settings.path.parent / path
