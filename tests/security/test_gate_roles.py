"""Issue 27, class 4: roles never hide numbers (``tests/security/gate/roles``).

Every input runs through the real command line in this process; counts are checked against numpy on the tensors
as ``torch.load`` reads them back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dtypecheck.scan.roles import DEEPSPEED, FACTORED, RNG, STEP
from tests.conftest import CliResult
from tests.security.corpus import Hostile
from tests.security.gate import roles


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Hostile]:
    return {h.name: h for h in roles.build(tmp_path_factory.mktemp("roles"))}


_SCANS: dict[tuple[str, ...], CliResult] = {}
"""Each command line's result, run once for all the tests of this module (the inputs never change)."""


def _scan(cli: Callable[..., CliResult], args: tuple[str, ...]) -> CliResult:
    if args not in _SCANS:
        _SCANS[args] = cli(*args)
    return _SCANS[args]


def _rows(cli: Callable[..., CliResult], hostile: Hostile, *extra: str) -> dict[str, Any]:
    result = _scan(cli, (*hostile.args, "--format", "json", "--quiet", *extra))
    assert result.exit_code in hostile.expect, result.stderr
    return {t["name"]: t for t in result.json()["tensors"]}


def _fp16_overflow(values: torch.Tensor) -> int:
    x = values.detach().to(torch.float64).numpy()
    with np.errstate(over="ignore"):
        return int(np.count_nonzero(np.isfinite(x) & np.isinf(x.astype(np.float16))))


def test_every_input_exits_as_the_contract_says(cli: Callable[..., CliResult], corpus: dict[str, Hostile]) -> None:
    assert len(corpus) == 19
    assert sum(h.benign for h in corpus.values()) == 6
    wrong = {}
    for hostile in corpus.values():
        result = _scan(cli, (*hostile.args, "--format", "json", "--quiet"))
        if result.exit_code not in hostile.expect:
            wrong[hostile.name] = result.exit_code
    assert wrong == {}


def test_a_bookkeeping_name_does_not_hide_a_weight(cli: Callable[..., CliResult], corpus: dict[str, Hostile]) -> None:
    hidden = [h for h in corpus.values() if h.name.endswith(("-named-weight", "-named-float", "-named-square"))]
    hidden += [corpus["module-list-named-state"], corpus["adafactor-named-unpaired"]]
    assert len(hidden) == 11
    for hostile in hidden:
        rows = _rows(cli, hostile)
        saved = _flatten(torch.load(hostile.args[1], weights_only=True))
        big = [name for name, value in saved.items() if value.shape == (64, 64) and float(value.max()) == roles.BIG]
        assert len(big) == 1, hostile.name
        row = rows[big[0]]
        assert row["not_judged"] is None, hostile.name
        assert row["casts"]["float16"]["overflow"] == _fp16_overflow(saved[big[0]]) == 64 * 64
        assert row["level"] == "fail", hostile.name


def test_lightning_swa_average_is_judged_as_weights(cli: Callable[..., CliResult], corpus: dict[str, Hostile]) -> None:
    rows = _rows(cli, corpus["lightning-swa"])
    average = {n: r for n, r in rows.items() if ".average_model_state." in n}
    assert {n.rsplit(".average_model_state.", 1)[1] for n in average} >= {"net.0.weight", "net.2.bias"}
    assert {r["role"] for n, r in average.items() if not n.endswith("num_batches_tracked")} == {"model"}
    saved = _flatten(torch.load(corpus["lightning-swa"].args[1], weights_only=False))
    steps = [n for n in saved if n.startswith("optimizer_states.0.state.") and n.endswith(".step")]
    assert steps
    assert {rows[n]["role"] for n in steps} == {"bookkeeping"}
    doctored = _rows(cli, corpus["lightning-swa-average-overflows"])
    [weight] = [n for n in doctored if n.endswith(".average_model_state.net.0.weight")]
    assert (doctored[weight]["casts"]["float16"]["overflow"], doctored[weight]["level"]) == (16 * 8, "fail")


def test_diffusion_scheduler_buffers_are_the_models(cli: Callable[..., CliResult], corpus: dict[str, Hostile]) -> None:
    hostile = corpus["diffusion-scheduler-buffers"]
    rows = _rows(cli, hostile)
    saved = torch.load(hostile.args[1], weights_only=True)
    for name in ("scheduler.betas", "scheduler.alphas_cumprod", "scheduler.snr"):
        assert (rows[name]["role"], rows[name]["not_judged"]) == ("model", None)
    # float8_e4m3fn's max is 448 and its step there 32: RNE keeps up to 464 (the tie goes to even 448)
    snr = saved["scheduler.snr"].numpy()
    assert rows["scheduler.snr"]["casts"]["float8_e4m3fn"]["overflow"] == int(np.count_nonzero(snr > 464)) > 0
    assert rows["scheduler.snr"]["level"] == "fail"


def test_hf_trainer_rng_bytes_are_not_judged_against_int8(
    cli: Callable[..., CliResult], corpus: dict[str, Hostile]
) -> None:
    hostile = corpus["hf-rng-state-int8"]
    rows = _rows(cli, hostile)
    saved = torch.load(Path(hostile.args[1]) / "rng_state_1.pth", weights_only=False)
    cpu = rows["rng_state_1.cpu"]
    assert (cpu["role"], cpu["not_judged"], cpu["level"]) == ("bookkeeping", RNG.not_judged, "ok")
    assert cpu["casts"]["int8"]["overflow"] == int(np.count_nonzero(saved["cpu"].numpy() > 127)) > 0
    assert [n for n in rows if n.startswith("rng_state_1.")] == ["rng_state_1.cpu"]  # numpy's state is no tensor


@pytest.mark.parametrize(
    ("name", "factored"),
    [
        ("transformers-adafactor", ("exp_avg_sq_row", "exp_avg_sq_col", "RMS")),
        ("torch-adafactor", ("row_var", "col_var")),
    ],
)
def test_adafactor_factored_moments_are_optimizer_state(
    cli: Callable[..., CliResult], corpus: dict[str, Hostile], name: str, factored: tuple[str, ...]
) -> None:
    hostile = corpus[name]
    rows = _rows(cli, hostile)
    saved = torch.load(hostile.args[1], weights_only=True)["optimizer"]["state"]
    expected = {f"optimizer.state.{i}.{key}" for i, state in saved.items() for key in factored if key in state}
    assert len(expected) == len(saved) * len(factored)  # every parameter's state is factored
    assert {n: (rows[n]["role"], rows[n]["not_judged"]) for n in expected} == dict.fromkeys(
        expected, ("optimizer", FACTORED.not_judged)
    )
    weights_only = _rows(cli, hostile, "--weights-only")
    assert sorted(weights_only) == ["model.0.weight", "model.1.weight"]


def test_deepspeed_zero3_optimizer_state_is_known(cli: Callable[..., CliResult], corpus: dict[str, Hostile]) -> None:
    hostile = corpus["deepspeed-zero3"]
    rows = _rows(cli, hostile)
    prefix = "zero_pp_rank_0_mp_rank_00_optim_states.optimizer_state_dict."
    saved = torch.load(Path(hostile.args[1]) / "zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=True)
    flat = saved["optimizer_state_dict"]["fp32_flat_groups"][0]
    group = rows[prefix + "fp32_flat_groups.0"]
    assert (group["role"], group["not_judged"], group["level"]) == ("optimizer", DEEPSPEED.not_judged, "ok")
    assert group["casts"]["float16"]["overflow"] == _fp16_overflow(flat) > 0
    for key in ("exp_avg", "exp_avg_sq"):
        assert rows[prefix + f"optimizer_state_dict.state.0.{key}"]["not_judged"] == DEEPSPEED.not_judged
    assert rows[prefix + "optimizer_state_dict.state.0.step"]["not_judged"] == STEP.not_judged
    kept = _rows(cli, hostile, "--weights-only")
    assert kept
    assert all(name.startswith("mp_rank_00_model_states.module.") for name in kept)


def test_amp_checkpoint_passes_with_its_counters_reported(
    cli: Callable[..., CliResult], corpus: dict[str, Hostile]
) -> None:
    rows = _rows(cli, corpus["adam-grad-scaler"])
    steps = [r for n, r in rows.items() if n.endswith(".step")]
    assert len(steps) == 6  # two Linear layers' weight and bias, BatchNorm's weight and bias
    assert {(r["role"], r["casts"]["float16"]["overflow"], r["level"]) for r in steps} == {("bookkeeping", 1, "ok")}
    assert (rows["epoch"]["role"], rows["model.1.num_batches_tracked"]["role"]) == ("bookkeeping", "bookkeeping")


def _flatten(value: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    found: dict[str, torch.Tensor] = {}
    for key, item in items:
        found.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return found
