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
    from dtypecheck.memory.estimate import DeviceKind
    from dtypecheck.memory.states import Optimizer
    from dtypecheck.memory.step import LossName


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


class LossChoice(str, Enum):
    cross_entropy = "cross-entropy"
    mse = "mse"
    sum = "sum"


class DeviceChoice(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class ImplChoice(str, Enum):
    foreach = "foreach"
    for_loop = "for-loop"
    fused = "fused"


@app.command("estimate-memory")
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
        ImplChoice | None,
        typer.Option(
            help="torch optimizer implementation [default: torch's own for --device: foreach on CUDA, "
            "for-loop on the CPU]."
        ),
    ] = None,
    loss: Annotated[
        LossChoice | None,
        typer.Option(
            help="The training step's loss, taken of the output (logits) [default: the factory's loss_fn, else the "
            "model's own loss output, else the sum of its outputs]."
        ),
    ] = None,
    device: Annotated[
        DeviceChoice | None,
        typer.Option(help="Where the step runs [default: cuda if available or --fit names a GPU, else cpu]."),
    ] = None,
    fit: Annotated[
        str | None,
        typer.Option(
            help="Device memory to fit: a size (80GiB, 24GB) or a device name (h100-80gb, a100-40gb, l4, rtx4090; "
            "see README). Adds fits / largest batch (and sequence) per row."
        ),
    ] = None,
    reserve: Annotated[
        str | None,
        typer.Option(
            help="With --fit: memory held back for the runtime and the caching allocator, a size, a percentage of "
            "the device, or both (2GiB+5%) [default: 1GiB+5%]."
        ),
    ] = None,
    measure: Annotated[
        bool,
        typer.Option(
            help="Also run one real step (CUDA if present, else CPU) of every float row (pure or amp) and compare."
        ),
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
    from dtypecheck.memory.devices import default_device, parse_fit
    from dtypecheck.render.progress import progress_bar

    if fmt.findings_only:
        raise UsageError(f"estimate-memory writes a table or json, not {fmt.value} (a memory estimate has no findings)")
    settings = project_config(config)
    command = "estimate-memory"
    # The config's value was validated against the same names as OptimizerChoice.
    chosen_optimizer = cast(
        "Optimizer", pick(optimizer.value if optimizer else None, settings, command, "optimizer", "adamw")
    )
    batch_size = pick(batch_size, settings, command, "batch-size", None)
    seq_len = pick(seq_len, settings, command, "seq-len", None)
    chosen_loss: LossName | None = pick(loss.value if loss else None, settings, command, "loss", None)
    fit_target = pick(fit, settings, command, "fit", None)
    device_budget = parse_fit(fit_target, pick(reserve, settings, command, "reserve", None)) if fit_target else None
    chosen_device = device.value if device else pick(None, settings, command, "device", None)
    if chosen_device is None:
        chosen_device = "cuda" if device_budget is not None and device_budget.accelerator else default_device()
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
        optimizer_impl=optimizer_impl.value if optimizer_impl else None,
        device=cast("DeviceKind", chosen_device),
    )
    with user_code_guard(model), progress_bar("estimating memory", quiet=quiet, unit="passes") as progress:
        progress(0, 1, "reading the model")
        subject = open_subject(model, batch_size=batch_size, seq_len=seq_len, loss=chosen_loss)
        report = estimate_memory(subject, options, progress)
        if device_budget is not None:
            from dtypecheck.memory.fit import fit_report

            report = fit_report(subject, options, report, device_budget, progress)
        if measure:
            from dtypecheck.memory.measure import measure_rows

            progress(0, 1, "measuring real steps")
            measurements, unmeasured = measure_rows(subject, report.estimates)
            trained = [m for m in measurements if m.mode == "training"] or list(measurements)
            skipped = (*report.skipped, *unmeasured)
            report = dataclasses.replace(report, measured=trained[0], measurements=measurements, skipped=skipped)
    emit(report, fmt, output, quiet=quiet)
    return ExitCode.OK
