"""``dtypecheck scan-model``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dtypecheck.cli._app import (
    SCANNED_INPUTS,
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
    output_folder_exists,
    pick,
    project_config,
    refuse_overwriting_inputs,
    user_code_guard,
    write_document,
)
from dtypecheck.errors import ExitCode, ParameterError, UsageError
from dtypecheck.loaders.formats import describe_formats
from dtypecheck.render import OutputFormat

if TYPE_CHECKING:
    from dtypecheck.config import Config
    from dtypecheck.launcher import RankInfo
    from dtypecheck.scan.gate import CheckpointPlan
    from dtypecheck.scan.report import ScanReport
    from dtypecheck.scan.select import Selection

DEFAULT_TOP = 20
SCANNED_INPUTS["scan-model"] = "checkpoints"  # a configuration shipped with one of them is never read


@app.command("scan-model", cls=HelpThatFits)
def scan_model(
    checkpoints: Annotated[
        list[str],
        typer.Argument(
            metavar="CKPT",
            help=f"A checkpoint file or folder, detected by content: {describe_formats()}; or "
            "path/to/file.py:factory returning an nn.Module, (model, inputs) or (model, inputs, loss_fn); or a "
            "Hugging Face Hub id org/name[@revision] (local cache first; extra 'hf'). Several (as pre-commit passes "
            "them) are scanned one after another (table, github) or into one document (json, sarif).",
        ),
    ],
    target: Annotated[
        list[str] | None,
        typer.Option(
            "--target",
            "-t",
            help="Target dtype to judge casts to; repeatable, comma lists (any float incl. float8/float4, or an "
            "integer dtype)." + default_is("float16, bfloat16, or as configured"),
        ),
    ] = None,
    include: Annotated[
        list[str] | None,
        typer.Option(
            "--include",
            metavar="GLOB",
            help="Scan only tensors whose key path matches GLOB (repeatable; fnmatch as the config's ignore rules: "
            "'*' crosses dots, case matters). Tensors left out are not read." + default_is("every tensor"),
        ),
    ] = None,
    exclude: Annotated[
        list[str] | None,
        typer.Option(
            "--exclude",
            metavar="GLOB",
            help="Leave out tensors whose key path matches GLOB (repeatable)." + default_is("none"),
        ),
    ] = None,
    weights_only: Annotated[
        bool,
        typer.Option(
            "--weights-only",
            help="Scan only the model's parameters and buffers: no optimizer, scheduler, RNG or trainer state."
            + default_is("off: every tensor"),
        ),
    ] = False,
    show_all: Annotated[
        bool | None,
        typer.Option("--all", help="Show every tensor in the table, not only the worst." + default_is("off: --top")),
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(
            "--baseline",
            dir_okay=False,
            help="A baseline file (written by --update-baseline; an earlier scan-model --format json report also "
            "works for one checkpoint): the exit code follows only what is new or worse."
            + default_is("the configured baseline, else none"),
        ),
    ] = None,
    update_baseline: Annotated[
        bool,
        typer.Option(
            "--update-baseline",
            help="Write this scan's reports into the baseline file (--baseline or the configured one) instead of "
            "comparing: only the entries of the checkpoints scanned change. Exits 0 unless a scan cannot run or "
            "finds a security finding (a code-running global, a differential, code in an archive): no baseline "
            "accepts those." + default_is("off: compare"),
        ),
    ] = False,
    no_baseline: Annotated[
        bool,
        typer.Option(
            "--no-baseline",
            help="Ignore the configured baseline: gate on everything found." + default_is("off"),
        ),
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
            "(needs the 'plot' extra: matplotlib)." + default_is("no plot"),
            callback=output_folder_exists,
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", min=1, help="Threads scanning chunks." + default_is("the CPU count, at most 8")),
    ] = None,
    precision: Annotated[
        bool,
        typer.Option(
            "--precision",
            help="Also measure the precision each cast loses (SQNR in dB, max relative error), and for float8/float4 "
            "targets per-channel and MX block-scaled verdicts; reads every tensor a second time." + default_is("off"),
        ),
    ] = False,
    keep_float32_sqnr: Annotated[
        float | None,
        typer.Option(
            "--keep-float32-sqnr",
            min=0.0,
            metavar="DB",
            help="With --precision: a cast whose SQNR is below DB loses too much; tensors that no requested 16-bit "
            "or narrower target holds are listed to keep in float32." + default_is("20, or as configured"),
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
    try:
        options = resolve_scan_options(
            checkpoints,
            target=target,
            selection=(tuple(include or ()), tuple(exclude or ()), weights_only),
            show_all=show_all,
            baseline=baseline,
            update_baseline=update_baseline,
            no_baseline=no_baseline,
            top=top,
            plot=plot,
            workers=workers,
            precision=precision,
            keep_float32_sqnr=keep_float32_sqnr,
            fail_on=fail_on,
            config=config,
            fmt=fmt,
            output=output,
            quiet=quiet,
        )
        return execute_scan(options)
    except ParameterError as exc:
        raise exc.with_flags(FLAGS) from None


FLAGS = {"targets": "--target", "baseline": "--baseline", "update_baseline": "--update-baseline"}
"""The command-line flag of each ``scan_checkpoint`` parameter a core error may name."""


@dataclasses.dataclass(frozen=True)
class ScanOptions:
    """What ``dtypecheck scan-model`` was asked, with conflicts already rejected."""

    plans: tuple[CheckpointPlan, ...]
    """Each checkpoint with its own targets, policy, thresholds and baseline (command line, else its config)."""
    limits: tuple[int | None, ...]
    """How many tensors each one's table shows (None: every tensor)."""
    update_baseline: bool
    """Write the reports into the baseline files instead of comparing (exit 0 unless a scan cannot run)."""
    workers: int | None
    """Threads scanning chunks (None: the CPU count, at most 8)."""
    precision: bool
    """Also measure the precision each cast loses (a second pass)."""
    plot: Path | None
    """Where to draw the log2-magnitude plot (PNG), if anywhere."""
    fmt: OutputFormat
    output: Path | None
    quiet: bool
    ignored: tuple[Path, ...] = ()
    """Configuration files that came with the checkpoints and were not read (a note says so)."""


def resolve_scan_options(
    checkpoints: list[str],
    *,
    target: list[str] | None,
    selection: tuple[tuple[str, ...], tuple[str, ...], bool],
    show_all: bool | None,
    baseline: Path | None,
    update_baseline: bool,
    no_baseline: bool,
    top: int,
    plot: Path | None,
    workers: int | None,
    precision: bool,
    keep_float32_sqnr: float | None,
    fail_on: FailOn | None,
    config: Path | None,
    fmt: OutputFormat,
    output: Path | None,
    quiet: bool,
) -> ScanOptions:
    """Read each checkpoint's configuration, parse the targets and reject conflicting flags with a UsageError
    naming them; scans nothing."""
    if no_baseline and (baseline is not None or update_baseline):
        raise UsageError("--no-baseline leaves the baseline out; it cannot go with --baseline or --update-baseline")
    several = len(checkpoints) > 1
    if several and (fmt.several_inputs == "refuse" or (output is not None and fmt.several_inputs != "merge")):
        refused = fmt.several_inputs == "refuse" and output is None
        held = f"{fmt.value.upper()} document" if refused else f"--output with --format {fmt.value}"
        raise UsageError(f"one checkpoint per {held} (json and sarif take several); scan them one at a time")
    if several and plot is not None:
        raise UsageError("one checkpoint per --plot; scan them one at a time")
    refuse_overwriting_inputs(checkpoints, {"--output": output, "--plot": plot})
    from dtypecheck.scan.select import Selection

    chosen = Selection(*selection)
    settings = project_config(config, checkpoints)
    planned = [
        _plan(c, settings, target, chosen, baseline, no_baseline, keep_float32_sqnr, fail_on, show_all)
        for c in checkpoints
    ]
    plans = tuple(plan for plan, _ in planned)
    limits = tuple(None if everything else top for _, everything in planned)
    for plan in plans:
        if plan.baseline is None and update_baseline:
            raise UsageError(
                f"--update-baseline: no baseline file for {plan.checkpoint}; give --baseline FILE or set "
                "baseline in [tool.dtypecheck.scan-model]"
            )
        if update_baseline:
            refuse_overwriting_inputs(checkpoints, {"--update-baseline's baseline": plan.baseline})
    if plot is not None:
        from dtypecheck.render.scan_plot import require_matplotlib

        require_matplotlib()
        if plot.suffix.lower() != ".png":
            raise UsageError(f"--plot {plot}: the plot is written as PNG; name the file *.png")
    return ScanOptions(plans, limits, update_baseline, workers, precision, plot, fmt, output, quiet, settings.ignored)


def execute_scan(options: ScanOptions) -> int:
    """Open the baselines, scan each checkpoint, render its report through ``emit``, return the exit code."""
    from dtypecheck.launcher import rank_info
    from dtypecheck.render.progress import progress_bar
    from dtypecheck.scan.gate import Gate, shown
    from dtypecheck.scan.ranks import Ranks
    from dtypecheck.scan.run import scan_checkpoint

    info = rank_info()  # a run under torchrun: the parts are split across the ranks, rank 0 reports
    if info is not None and info.rank != 0:
        return _scan_shares(options, info)
    if not options.quiet:
        for path in options.ignored:
            typer.echo(
                f"note: not reading {shown(path)}: it came with a checkpoint, and nothing shipped with a checkpoint "
                "governs its scan (configuration comes from the working folder's project or --config)",
                err=True,
            )
    gate = Gate(options.plans, update=options.update_baseline, missing_hint="write it with --update-baseline")
    code = ExitCode.OK
    # one document: a SARIF log (one run, one artifact per checkpoint), a dtypecheck.scan-set/1 JSON document
    merged = options.fmt.several_inputs == "merge" and len(options.plans) > 1
    # updating a baseline says one line on stderr; the report only when asked for (--output, a machine format)
    shows_report = not options.update_baseline or options.output is not None or not options.fmt.for_people
    reports: list[ScanReport] = []
    for number, (plan, limit) in enumerate(zip(options.plans, options.limits, strict=True)):
        with user_code_guard(plan.checkpoint), progress_bar("scanning", quiet=options.quiet, unit="bytes") as bar:
            report = scan_checkpoint(
                plan.checkpoint,
                plan.targets,
                progress=bar,
                workers=options.workers,
                policy=plan.policy,
                precision=options.precision,
                keep_float32_sqnr_db=plan.keep_float32_sqnr_db,
                selection=plan.selection,
                ranks=None if info is None else Ranks.connect(info, number),
            )
        result = gate.judge(plan, report)
        if result.missing_entry and not options.quiet:
            typer.echo(
                f"note: {plan.where} has no entry for {plan.key}: everything it finds counts as new "
                "(add it with --update-baseline)",
                err=True,
            )
        if options.plot is not None:
            from dtypecheck.render.scan_plot import write_plot

            write_plot(result.report, options.plot)
        if merged:
            reports.append(result.report)
        elif shows_report:
            emit(result.report, options.fmt, options.output, quiet=options.quiet, limit=limit)
        if options.plot is not None and not options.quiet:
            typer.echo(f"wrote {options.plot}", err=True)
        code = max(code, ExitCode.FINDINGS if result.findings else ExitCode.OK)
    if merged and shows_report:
        from dtypecheck.render import render_scans

        write_document(render_scans(reports, options.fmt), options.output, quiet=options.quiet)
    for written in gate.write():
        if not options.quiet:
            names = ", ".join(written.updated)
            typer.echo(
                f"wrote baseline {shown(written.path)}: {len(written.updated)} checkpoint(s) updated ({names}), "
                f"{written.kept} kept",
                err=True,
            )
    return int(code)


def _scan_shares(options: ScanOptions, info: RankInfo) -> int:
    """A rank other than 0: scan its share of each checkpoint for rank 0, which writes the report and the exit
    code (an error stops this rank's part of the scan and reaches rank 0, which reports it); exit 0."""
    from dtypecheck.scan.ranks import Ranks
    from dtypecheck.scan.run import scan_share

    for number, plan in enumerate(options.plans):
        ranks = Ranks.connect(info, number)
        with user_code_guard(plan.checkpoint):
            stopped = scan_share(
                plan.checkpoint,
                ranks,
                plan.targets,
                workers=options.workers,
                precision=options.precision,
                selection=plan.selection,
            )
        if stopped is not None:
            break
    return int(ExitCode.OK)


def _plan(
    checkpoint: str,
    settings: Config,
    target: list[str] | None,
    selection: Selection,
    baseline: Path | None,
    off: bool,
    keep_float32_sqnr: float | None,
    fail_on: FailOn | None,
    show_all: bool | None,
) -> tuple[CheckpointPlan, bool]:
    """One checkpoint's plan, and whether its table shows every tensor: the command line wins, else the run's
    configuration (``--config``, else the working folder's project; never one shipped with a checkpoint)."""
    from dtypecheck.dtypes import parse_dtype_list
    from dtypecheck.findings import as_level
    from dtypecheck.scan.gate import CheckpointPlan, configured_path, entry_key, shown
    from dtypecheck.scan.keep_float32 import DEFAULT_MIN_SQNR_DB
    from dtypecheck.targets import check_targets

    names = target or pick(None, settings, "scan-model", "targets", [])
    targets = tuple(check_targets(parse_dtype_list(list(names)))) if names else None
    configured = None if off or baseline is not None else configured_path(settings, "baseline")
    path = baseline or configured
    where = f"--baseline {path}"
    if configured is not None and settings.path is not None:
        where = f"baseline {shown(configured)} (from {shown(settings.path)})"
    plan = CheckpointPlan(
        checkpoint,
        targets,
        policy=settings.scan_policy,
        keep_float32_sqnr_db=float(
            pick(keep_float32_sqnr, settings, "scan-model", "keep-float32-sqnr-db", DEFAULT_MIN_SQNR_DB)
        ),
        selection=selection,
        fail_on=as_level(FailOn(pick(fail_on, settings, "scan-model", "fail-on", FailOn.fail)).value),
        baseline=path,
        where=where,
        key=entry_key(checkpoint, settings),
    )
    return plan, bool(pick(show_all, settings, "scan-model", "all", False))
