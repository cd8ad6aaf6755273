"""``dtypecheck estimate-memory``."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Annotated, cast

import typer

from dtypecheck.cli._app import (
    ConfigOption,
    FormatOption,
    OutputOption,
    QuietOption,
    TracebackOption,
    app,
    emit,
    pick,
    project_config,
    user_code_guard,
)
from dtypecheck.errors import ExitCode, UsageError
from dtypecheck.render import OutputFormat

if TYPE_CHECKING:
    from dtypecheck.memory.states import Optimizer


class ModeChoice(str, Enum):
    inference = "inference"
    training = "training"


class OptimizerChoice(str, Enum):
    adamw = "adamw"
    adam = "adam"
    sgd = "sgd"
    lion = "lion"
    adafactor = "adafactor"
    adam8bit = "adam8bit"


class PrecisionChoice(str, Enum):
    pure = "pure"
    amp = "amp"
    master = "master"


class StrategyChoice(str, Enum):
    none = "none"
    ddp = "ddp"
    zero1 = "zero1"
    zero2 = "zero2"
    zero3 = "zero3"
    fsdp = "fsdp"


class ImplChoice(str, Enum):
    foreach = "foreach"
    for_loop = "for-loop"
    fused = "fused"


@app.command("estimate-memory")
def estimate_memory(
    model: Annotated[
        str,
        typer.Argument(
            help="file.py:factory (returns a module or (module, example_inputs)), a checkpoint file or folder, "
            "or a Hugging Face config.json (or a folder with one)."
        ),
    ],
    dtype: Annotated[
        list[str] | None,
        typer.Option(
            "--dtype", "-d", help="Repeatable, comma lists [default: float32,bfloat16,float16,float8_e4m3fn,int8,int4]"
        ),
    ] = None,
    mode: Annotated[
        list[ModeChoice] | None, typer.Option("--mode", "-m", help="Repeatable [default: inference and training]")
    ] = None,
    optimizer: Annotated[
        OptimizerChoice | None, typer.Option(help="Optimizer whose states are counted [default: adamw].")
    ] = None,
    precision: Annotated[
        list[PrecisionChoice] | None,
        typer.Option(
            help="Training precision, repeatable: pure (weights in dtype), amp (fp32 weights, autocast), master "
            "(weights in dtype + fp32 master) [default: pure for 32-bit, amp below]"
        ),
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(min=1, help="Per-device batch [default: the factory's inputs, or 1 for a config]")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option(min=1, help="Tokens per sequence of a config's inputs [default: 512]")
    ] = None,
    context: Annotated[int | None, typer.Option(min=1, help="Decoder inference: tokens held in the KV cache.")] = None,
    checkpointing: Annotated[bool, typer.Option(help="Activation checkpointing of every block.")] = False,
    world_size: Annotated[
        int | None, typer.Option(min=1, help="Devices sharing the model (with --strategy) [default: 1].")
    ] = None,
    strategy: Annotated[
        StrategyChoice | None, typer.Option(help="How the model states are spread over devices [default: none].")
    ] = None,
    keep_unquantized: Annotated[
        bool,
        typer.Option(help="Keep embeddings and norms at their own dtype when quantizing (as most quantizers do)."),
    ] = False,
    group_size: Annotated[int, typer.Option(help="int4 quantization group size (a scale and zero each).")] = 128,
    optimizer_impl: Annotated[
        ImplChoice, typer.Option(help="torch optimizer implementation (foreach is torch's default on GPUs).")
    ] = ImplChoice.foreach,
    measure: Annotated[
        bool,
        typer.Option(help="Also run one real step (CUDA if present, else CPU) of the first training row and compare."),
    ] = False,
    fmt: FormatOption = OutputFormat.table,
    output: OutputOption = None,
    quiet: QuietOption = False,
    traceback: TracebackOption = False,
    config: ConfigOption = None,
) -> int:
    """What a model needs in memory for inference and training, per dtype, optimizer and sharding.

    Model states are computed exactly; activations are traced on fake tensors (nothing is allocated).

    Exit codes: 0 ok, 2 usage error (e.g. int4 training), 3 unreadable input or a factory that raised."""
    import dataclasses

    from dtypecheck.dtypes import parse_dtype_list
    from dtypecheck.memory import EstimateOptions, estimate_memory, open_subject
    from dtypecheck.render.progress import progress_bar

    if fmt not in (OutputFormat.table, OutputFormat.json):
        raise UsageError(f"estimate-memory writes a table or json, not {fmt.value} (a memory estimate has no findings)")
    settings = project_config(config)
    command = "estimate-memory"
    # The config's value was validated against the same names as OptimizerChoice.
    chosen_optimizer = cast(
        "Optimizer", pick(optimizer.value if optimizer else None, settings, command, "optimizer", "adamw")
    )
    batch_size = pick(batch_size, settings, command, "batch-size", None)
    seq_len = pick(seq_len, settings, command, "seq-len", None)
    options = EstimateOptions(
        dtypes=tuple(parse_dtype_list(dtype or settings.get(command, "dtypes"))),
        modes=tuple(m.value for m in mode or []),
        optimizer=chosen_optimizer,
        precisions=tuple(p.value for p in precision or []),
        strategy=pick(strategy.value if strategy else None, settings, command, "strategy", "none"),
        world_size=pick(world_size, settings, command, "world-size", 1),
        context=context,
        checkpointing=checkpointing,
        keep_unquantized=keep_unquantized,
        group_size=group_size,
        optimizer_impl=optimizer_impl.value,
    )
    with user_code_guard(model), progress_bar("estimating memory", quiet=quiet, unit="passes") as progress:
        progress(0, 1, "reading the model")
        subject = open_subject(model, batch_size=batch_size, seq_len=seq_len)
        report = estimate_memory(subject, options, progress)
        if measure:
            from dtypecheck.memory.measure import measure_row

            rows = [r for r in report.estimates if r.mode == "training"] or list(report.estimates)
            progress(0, 1, "measuring one real step")
            measured = measure_row(subject, rows[0], options.optimizer_impl)
            report = dataclasses.replace(report, measured=measured)
    emit(report, fmt, output, quiet=quiet)
    return ExitCode.OK
