"""``dtypecheck.estimate_memory``: the Python API does in one call what the CLI does, and its errors name
parameters where the CLI names flags; each word list is one enum that the CLI, the config and the core read."""

from __future__ import annotations

import json

import pytest

import dtypecheck
from dtypecheck.config import validate
from dtypecheck.dtypes import lookup
from dtypecheck.errors import ParameterError, UsageError
from dtypecheck.memory import EstimateOptions, estimate_memory, open_subject
from dtypecheck.memory_words import LossName, Mode, Optimizer, Strategy
from dtypecheck.render import OutputFormat, render

FP32 = EstimateOptions(dtypes=(lookup("float32"),))


def test_one_call_fits_as_the_cli_does(cli, wide):
    assert dtypecheck.estimate_memory is estimate_memory
    report = estimate_memory(wide, FP32, fit="1MiB", reserve="0")
    inference = report.estimates[0]
    assert inference.fit is not None
    # Linear(256, 256) in float32: 262,144 B of weights and 2 KiB per row alive at once: 384 rows in 1 MiB.
    assert inference.fit.max_batch_size == (2**20 - 262_144) // 2_048 == 384
    doc = cli("estimate-memory", wide, "-d", "fp32", "--fit", "1MiB", "--reserve", "0", "-f", "json")
    assert json.loads(render(report, OutputFormat.json, color=False, width=120)) == doc.json()


def test_one_call_measures_and_heads_with_the_training_step(wide):
    report = estimate_memory(wide, FP32, measure=True)
    assert [m.mode for m in report.measurements] == [Mode.inference, Mode.training]
    assert report.measured == report.measurements[1]
    assert report.measured.estimate_bytes == report.estimates[1].bytes.total


def test_an_opened_subject_is_estimated_as_it_is(wide):
    subject = open_subject(wide, batch_size=8)
    assert estimate_memory(subject, FP32).estimates[0].batch_size == 8
    with pytest.raises(ParameterError, match=r"^batch_size, seq_len and loss are given to open_subject"):
        estimate_memory(subject, FP32, batch_size=2)


@pytest.mark.parametrize(
    ("call", "python", "flags"),
    [
        (
            {"options": EstimateOptions(world_size=2)},
            "world_size needs a strategy (ddp, zero1, zero2, zero3 or fsdp)",
            "--world-size needs a --strategy (ddp, zero1, zero2, zero3 or fsdp)",
        ),
        ({"fit": "nvme"}, "fit 'nvme': not a size", "--fit 'nvme': not a size"),
        ({"fit": "1GiB", "reserve": "2GiB"}, "reserve '2GiB' leaves nothing", "--reserve '2GiB' leaves nothing"),
        ({"seq_len": 8}, "seq_len applies to a config's inputs", "--seq-len applies to a config's inputs"),
    ],
)
def test_errors_name_parameters_in_python_and_flags_on_the_command_line(cli, wide, call, python, flags):
    with pytest.raises(ParameterError) as raised:
        estimate_memory(wide, **call)
    assert str(raised.value).startswith(python)
    assert raised.value.with_flags().message().startswith(flags)
    args = {
        "options": ("--world-size", "2"),
        "fit": ("--fit", str(call.get("fit"))),
        "reserve": ("--reserve", str(call.get("reserve"))),
        "seq_len": ("--seq-len", "8"),
    }
    result = cli("estimate-memory", wide, *[a for key in call for a in args[key]])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {flags}")
    assert "Traceback" not in result.stderr


def test_options_take_plain_strings_and_name_a_bad_one():
    options = EstimateOptions(optimizer="sgd", strategy="zero3", modes=("training",))  # type: ignore[arg-type]
    assert (options.optimizer, options.strategy, options.modes) == (Optimizer.sgd, Strategy.zero3, (Mode.training,))
    with pytest.raises(ParameterError, match=r"^optimizer 'sgdx': expected one of adamw, adam, sgd, lion, "):
        EstimateOptions(optimizer="sgdx")  # type: ignore[arg-type]


@pytest.mark.parametrize(("key", "enum"), [("optimizer", Optimizer), ("strategy", Strategy), ("loss", LossName)])
def test_config_validation_reads_the_same_word_list(key, enum):
    for name in enum.names():
        validate({"estimate-memory": {key: name}}, "pyproject.toml")
    with pytest.raises(UsageError) as raised:
        validate({"estimate-memory": {key: "nope"}}, "pyproject.toml")
    assert ", ".join(repr(n) for n in enum.names()) in raised.value.message()


@pytest.mark.parametrize(("flag", "enum"), [("--optimizer", Optimizer), ("--strategy", Strategy), ("--loss", LossName)])
def test_cli_choices_are_the_same_word_list(cli, wide, flag, enum):
    import typer.main

    from dtypecheck.cli import app

    command = typer.main.get_command(app).commands["estimate-memory"]  # type: ignore[attr-defined]
    (option,) = [p for p in command.params if flag in p.opts]
    assert option.type_descriptor.annotation is enum  # the core enum itself, not a copy of its names
    bad = cli("estimate-memory", wide, flag, "nope")
    assert bad.exit_code == 2
