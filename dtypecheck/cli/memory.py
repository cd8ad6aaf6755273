"""``dtypecheck estimate-memory``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dtypecheck.cli._app import (
    ConfigOption,
    HelpThatFits,
    OutputOption,
    QuietOption,
    ReportFormatOption,
    TracebackOption,
    app,
    default_is,
    emit,
    output_folder_exists,
    pick,
    project_config,
    refuse_overwriting_inputs,
    settle_start_up_heap,
    user_code_guard,
)
from dtypecheck.errors import ExitCode, ParameterError, UsageError
from dtypecheck.memory_words import DeviceKind, LossName, Mode, Optimizer, OptimizerImpl, Precision, Strategy
from dtypecheck.output import REPORT_FORMATS, format_names
from dtypecheck.render import OutputFormat

if TYPE_CHECKING:
    from dtypecheck.config import Config
    from dtypecheck.memory.estimate import EstimateOptions


@app.command("estimate-memory", cls=HelpThatFits)
def estimate_memory(
    model: Annotated[
        str,
        typer.Argument(
            help="file.py:factory (returns a module, (module, example_inputs) or (module, example_inputs, "
            "loss_fn)), a checkpoint file or folder, or a Hugging Face config.json (or a folder with one)."
        ),
    ],
    dtype: Annotated[
        list[str] | None,
        typer.Option(
            "--dtype",
            "-d",
            help="Repeatable, comma lists." + default_is("float32, bfloat16, float16, float8_e4m3fn, int8, int4"),
        ),
    ] = None,
    mode: Annotated[
        list[Mode] | None, typer.Option("--mode", "-m", help="Repeatable." + default_is("inference and training"))
    ] = None,
    optimizer: Annotated[
        Optimizer | None, typer.Option(help="Optimizer whose states are counted." + default_is(Optimizer.adamw.value))
    ] = None,
    precision: Annotated[
        list[Precision] | None,
        typer.Option(
            help="Training precision, repeatable: pure (weights in dtype), amp (fp32 weights, autocast), master "
            "(weights in dtype + fp32 master)." + default_is("pure for 32-bit, amp below")
        ),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Per-device batch." + default_is("the factory's inputs, or 1 for a config"),
        ),
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option(min=1, help="Tokens per sequence of a config's inputs." + default_is("512"))
    ] = None,
    context: Annotated[
        int | None,
        typer.Option(min=1, help="Decoder inference: tokens held in the KV cache." + default_is("no KV cache")),
    ] = None,
    checkpointing: Annotated[bool, typer.Option(help="Activation checkpointing of every block.")] = False,
    grad_accum: Annotated[
        int | None,
        typer.Option(
            min=1, help="Gradient accumulation: micro-batches (of --batch-size) per optimizer step." + default_is("1")
        ),
    ] = None,
    world_size: Annotated[
        int | None, typer.Option(min=1, help="Devices sharing the model (with --strategy)." + default_is("1"))
    ] = None,
    strategy: Annotated[
        Strategy | None, typer.Option(help="How the model states are spread over devices." + default_is("none"))
    ] = None,
    keep_unquantized: Annotated[
        bool,
        typer.Option(
            help="Keep embeddings and norms at their own dtype when quantizing (as most quantizers do)."
            + default_is("off"),  # typer's own "no-keep-unquantized" is cut short in an 80-column table
            show_default=False,
        ),
    ] = False,
    group_size: Annotated[int, typer.Option(help="int4 quantization group size (a scale and zero each).")] = 128,
    optimizer_impl: Annotated[
        OptimizerImpl | None,
        typer.Option(
            help="torch optimizer implementation."
            + default_is("torch's own for --device: foreach on CUDA, for-loop on the CPU")
        ),
    ] = None,
    loss: Annotated[
        LossName | None,
        typer.Option(
            help="The training step's loss, taken of the output (logits)."
            + default_is(
                "the factory's loss_fn, else the model's own loss output, else cross-entropy over the last "
                "dimension for integer inputs and float logits, else MSE against a target of the output's shape"
            )
        ),
    ] = None,
    device: Annotated[
        DeviceKind | None,
        typer.Option(help="Where the step runs." + default_is("cuda if available or --fit names a GPU, else cpu")),
    ] = None,
    fit: Annotated[
        str | None,
        typer.Option(
            help="Device memory to fit: a size (80GiB, 24GB) or a device name (h100-80gb, a100-40gb, l4, rtx4090; "
            "see README). Adds fits / largest batch (and sequence) per row." + default_is("no fit")
        ),
    ] = None,
    reserve: Annotated[
        str | None,
        typer.Option(
            help="With --fit: memory held back for the runtime and the caching allocator, a size, a percentage of "
            "the device, or both (2GiB+5%)." + default_is("1GiB+5%")
        ),
    ] = None,
    fit_timeout: Annotated[
        float,
        typer.Option(help="With --fit: seconds the search may take before it reports the best bounds so far (>=)."),
    ] = 60.0,
    fit_workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="With --fit: processes that share each check's traces (forked; the answers are the same with any "
            "number)." + default_is("one per core, at most 4"),
        ),
    ] = None,
    measure: Annotated[
        bool,
        typer.Option(
            help="Also run one real step (CUDA if present, else CPU) of every float row (pure or amp) and compare."
        ),
    ] = False,
    by_module: Annotated[
        bool,
        typer.Option(
            help="Break each row down by module: parameters, weight/grad/optimizer bytes, the activation bytes it "
            "holds at the step's peak, and the peak's op, module and phase (traces the model whole)."
            + default_is("off: totals only"),
            show_default=False,
        ),
    ] = False,
    depth: Annotated[int, typer.Option(min=1, help="With --by-module: depth of the dotted module paths.")] = 2,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Draw memory over the step (the first training row, else the first) to FILE.png or FILE.html "
            "(self-contained); with --fit, the device's usable line." + default_is("no picture"),
            dir_okay=False,
            callback=output_folder_exists,
        ),
    ] = None,
    fmt: ReportFormatOption = OutputFormat.table,
    output: OutputOption = None,
    quiet: QuietOption = False,
    traceback: TracebackOption = False,
    config: ConfigOption = None,
) -> int:
    """What a model needs in memory for inference and training, per dtype, optimizer and sharding.

    Model states are computed exactly; activations are traced on fake tensors (nothing is allocated).

    Exit codes: 0 ok, 2 usage error (e.g. int4 training), 3 unreadable input or a factory that raised."""
    settings = project_config(config)
    command = resolve_memory_options(
        model,
        settings,
        dtype=dtype,
        mode=mode,
        optimizer=optimizer,
        precision=precision,
        batch_size=batch_size,
        seq_len=seq_len,
        context=context,
        checkpointing=checkpointing,
        grad_accum=grad_accum,
        world_size=world_size,
        strategy=strategy,
        keep_unquantized=keep_unquantized,
        group_size=group_size,
        optimizer_impl=optimizer_impl,
        loss=loss,
        device=device,
        fit=fit,
        reserve=reserve,
        fit_timeout=fit_timeout,
        fit_workers=fit_workers,
        measure=measure,
        fmt=fmt,
        output=output,
        quiet=quiet,
        by_module=depth if by_module else None,
        plot=plot,
    )
    return execute_memory(command)


@dataclass(frozen=True)
class MemoryCommand:
    """What ``dtypecheck estimate-memory`` was asked, the command line and the project config merged."""

    model: str
    options: EstimateOptions
    batch_size: int | None
    seq_len: int | None
    loss: LossName | None
    fit: str | None
    """A device name or a size; None: no fit."""
    reserve: str | None
    fit_timeout: float
    measure: bool
    fmt: OutputFormat
    output: Path | None
    quiet: bool
    plot: Path | None = None
    """``--plot FILE``: .png or .html."""
    fit_workers: int | None = None
    """Processes sharing the fit's traces; None: one per core."""
    configured: dict[str, str] = field(default_factory=dict)
    """The core's parameters whose value came from the project config, each with where it was set: an error about
    one names that key (``pyproject.toml: [tool.dtypecheck.estimate-memory] fit``), not a flag nobody gave."""


CONFIGURED = {
    "optimizer": "optimizer",
    "strategy": "strategy",
    "world_size": "world-size",
    "grad_accum": "grad-accum",
    "device": "device",
    "batch_size": "batch-size",
    "seq_len": "seq-len",
    "loss": "loss",
    "fit": "fit",
    "reserve": "reserve",
    "fit_workers": "fit-workers",
    "dtypes": "dtypes",
}
"""The core's parameters that ``[tool.dtypecheck.estimate-memory]`` can set, and their keys there."""

PLOT_SUFFIXES = (".png", ".html")


def resolve_memory_options(
    model: str,
    settings: Config,
    *,
    dtype: list[str] | None,
    mode: list[Mode] | None,
    optimizer: Optimizer | None,
    precision: list[Precision] | None,
    batch_size: int | None,
    seq_len: int | None,
    context: int | None,
    checkpointing: bool,
    grad_accum: int | None,
    world_size: int | None,
    strategy: Strategy | None,
    keep_unquantized: bool,
    group_size: int,
    optimizer_impl: OptimizerImpl | None,
    loss: LossName | None,
    device: DeviceKind | None,
    fit: str | None,
    reserve: str | None,
    fit_timeout: float,
    measure: bool,
    fmt: OutputFormat,
    output: Path | None,
    quiet: bool,
    by_module: int | None = None,
    plot: Path | None = None,
    fit_workers: int | None = None,
) -> MemoryCommand:
    """Merge the command line over the project config (``[tool.dtypecheck.estimate-memory]``); runs nothing."""
    from dtypecheck.dtypes import parse_dtype_list
    from dtypecheck.memory.estimate import EstimateOptions

    if plot is not None and plot.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot {plot}: the file must end in .png or .html")
    refuse_overwriting_inputs([model], {"--output": output, "--plot": plot})
    if fmt.findings_only:
        names = format_names(REPORT_FORMATS)
        raise UsageError(f"estimate-memory writes {names}, not {fmt.value} (a memory estimate has no findings)")
    section = "estimate-memory"
    given = {
        "optimizer": optimizer, "strategy": strategy, "world_size": world_size, "grad_accum": grad_accum,
        "device": device, "batch_size": batch_size, "seq_len": seq_len, "loss": loss, "fit": fit, "reserve": reserve,
        "fit_workers": fit_workers, "dtypes": dtype,
    }  # fmt: skip
    configured = {
        name: where
        for name, key in CONFIGURED.items()
        if given[name] is None and (where := settings.where(section, key)) is not None
    }
    configured_device = pick(device, settings, section, "device", None)
    with flags_named(configured):
        options = EstimateOptions(
            dtypes=tuple(parse_dtype_list(dtype or settings.get(section, "dtypes"))),
            modes=tuple(mode or ()),
            optimizer=pick(optimizer, settings, section, "optimizer", Optimizer.adamw),
            precisions=tuple(precision or ()),
            strategy=pick(strategy, settings, section, "strategy", Strategy.none),
            world_size=pick(world_size, settings, section, "world-size", 1),
            context=context,
            checkpointing=checkpointing,
            grad_accum=pick(grad_accum, settings, section, "grad-accum", 1),
            keep_unquantized=keep_unquantized,
            group_size=group_size,
            optimizer_impl=optimizer_impl,
            device=configured_device,
            by_module=by_module,
            step_timeline=plot is not None,
        )
    configured_loss = pick(loss, settings, section, "loss", None)
    return MemoryCommand(
        model=model,
        options=options,
        batch_size=pick(batch_size, settings, section, "batch-size", None),
        seq_len=pick(seq_len, settings, section, "seq-len", None),
        loss=LossName(configured_loss) if configured_loss is not None else None,
        fit=pick(fit, settings, section, "fit", None),
        reserve=pick(reserve, settings, section, "reserve", None),
        fit_timeout=fit_timeout,
        measure=measure,
        fmt=fmt,
        output=output,
        quiet=quiet,
        plot=plot,
        fit_workers=pick(fit_workers, settings, section, "fit-workers", None),
        configured=configured,
    )


def execute_memory(command: MemoryCommand) -> int:
    """Estimate (with the fit and the measurement asked for), render through ``emit``, return the exit code."""
    import torch  # noqa: F401  (the estimate's one heavy import, made before the heap is settled)

    from dtypecheck.memory import estimate_memory
    from dtypecheck.render.progress import progress_bar

    settle_start_up_heap()
    with (
        flags_named(command.configured),
        user_code_guard(command.model),
        progress_bar("estimating memory", quiet=command.quiet, unit="passes") as progress,
    ):
        report = estimate_memory(
            command.model,
            command.options,
            progress,
            batch_size=command.batch_size,
            seq_len=command.seq_len,
            loss=command.loss,
            fit=command.fit,
            reserve=command.reserve,
            fit_timeout=command.fit_timeout,
            fit_workers=command.fit_workers,
            measure=command.measure,
        )
    if command.plot is not None:
        from dtypecheck.render.memory_plot import write_step_plot

        write_step_plot(report, command.plot)
    emit(report, command.fmt, command.output, quiet=command.quiet)
    return ExitCode.OK


@contextlib.contextmanager
def flags_named(configured: dict[str, str] | None = None) -> Iterator[None]:
    """The core names its parameters (``world_size``); the command line says which flag (``--world-size``), or,
    for a value the project config set (``configured``), where it was set."""
    try:
        yield
    except ParameterError as exc:
        raise exc.with_flags({**FLAGS, **(configured or {})}) from None


FLAGS = {"dtypes": "--dtype", "modes": "--mode", "precisions": "--precision"}
"""Parameters whose flag is not their own name in kebab case."""
