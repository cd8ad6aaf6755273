"""Roles (issue 21.2): bookkeeping is reported, not judged against the targets; optimizer moments are judged in
the dtype the optimizer keeps them in. On training checkpoints shaped as torch, Lightning, the HF Trainer and
DeepSpeed write them."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dtypecheck.dtypes import lookup
from dtypecheck.render.json import document
from dtypecheck.scan.document import read_scan_document
from dtypecheck.scan.report import ScanReport, TensorScan
from dtypecheck.scan.roles import ROLE_RULES, assign_roles
from dtypecheck.scan.run import scan_checkpoint
from tests.scan import _training_ckpts as ckpts

README = Path(__file__).resolve().parents[2] / "docs" / "commands" / "scan-model.md"
"""scan-model's page of the docs site (it was the README's scan-model section)."""
FP16 = [lookup("fp16")]


def _fp16_counts(values: torch.Tensor) -> tuple[int, int, int]:
    """(overflow, underflow, subnormal) of a float32 tensor cast to float16, by numpy (RNE, independent)."""
    x = values.detach().to(torch.float32).numpy().reshape(-1)
    with np.errstate(over="ignore"):
        y = x.astype(np.float16)
    finite = np.isfinite(x)
    tiny = float(np.finfo(np.float16).tiny)
    overflow = int(np.count_nonzero(finite & np.isinf(y)))
    underflow = int(np.count_nonzero(finite & (x != 0) & (y == 0)))
    subnormal = int(np.count_nonzero(finite & (y != 0) & (np.abs(y.astype(np.float32)) < tiny)))
    return overflow, underflow, subnormal


def _by_name(report: ScanReport) -> dict[str, TensorScan]:
    return {t.name: t for t in report.tensors}


def _flatten(prefix: str, value: Any) -> dict[str, torch.Tensor]:
    """Every tensor of a torch.load'ed object under its key path, as the loaders name them."""
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    found: dict[str, torch.Tensor] = {}
    for key, item in items:
        found.update(_flatten(f"{prefix}.{key}" if prefix else str(key), item))
    return found


def _check_against_numpy(report: ScanReport, tensors: dict[str, torch.Tensor]) -> None:
    """Every float tensor's float16 counts equal numpy's; judged ones carry the level the counts give."""
    rows = _by_name(report)
    checked = 0
    for name, values in tensors.items():
        if not values.is_floating_point():
            continue
        cast = rows[name].casts["float16"]
        expected = _fp16_counts(values)
        assert (cast.overflow, cast.underflow, cast.subnormal) == expected, name
        if rows[name].not_judged is None:
            # a warn harms (docs/contract.md "Levels"): more than 0.1% flushed or 1% subnormal
            harms = expected[1] > 0.001 * values.numel() or expected[2] > 0.01 * values.numel()
            assert cast.level == ("fail" if expected[0] else "warn" if harms else "ok"), name
        else:
            assert cast.level == "ok", name
        checked += 1
    assert checked == sum(1 for v in tensors.values() if v.is_floating_point())


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_plain_torch_save_step_counters_are_not_judged_and_the_checkpoint_passes_fp16(
    tmp_path: Path, optimizer: str, cli: Callable[..., Any]
) -> None:
    path = ckpts.plain(tmp_path, optimizer)
    report = scan_checkpoint(str(path), FP16)
    saved = torch.load(path, weights_only=True)
    _check_against_numpy(report, _flatten("", saved))
    rows = _by_name(report)
    steps = [f"optimizer.state.{i}.step" for i in saved["optimizer"]["state"]]
    for name in steps:
        assert rows[name].role == "bookkeeping"
        assert rows[name].casts["float16"].overflow == 1  # reported: 1e6 overflows float16 ...
        assert rows[name].level == "ok"  # ... and not judged
        assert rows[name].passed == ("overflow:float16",)
    assert rows["model.1.num_batches_tracked"].role == "bookkeeping"
    assert {rows[f"optimizer.state.{i}.exp_avg_sq"].role for i in saved["optimizer"]["state"]} == {"optimizer"}
    [step_rule] = [n for n in report.summary.not_judged if n.rule == "optimizer step counter"]
    assert step_rule.tensors == tuple(steps)
    assert report.summary.fail == 0

    result = cli("scan-model", str(path), "--target", "fp16", "--format", "json")
    assert result.exit_code == 0, result.stderr  # an Adam checkpoint of a healthy model passes the fp16 gate
    assert result.json()["summary"]["level"] == "warn"  # moments that flush are still reported as warn


def test_lightning_trainer_state_is_not_judged(tmp_path: Path, cli: Callable[..., Any]) -> None:
    path = ckpts.lightning(tmp_path)
    report = scan_checkpoint(str(path), FP16)
    saved = torch.load(path, weights_only=False)
    tensors = _flatten("", saved)
    _check_against_numpy(report, tensors)
    roles = {t.name: t.role for t in report.tensors}
    assert {n for n, r in roles.items() if r == "model"} == {n for n in tensors if n.startswith("state_dict.")} - {
        "state_dict.net.1.num_batches_tracked"
    }
    callbacks = [n for n in tensors if n.startswith("callbacks.")]
    assert len(callbacks) == 4
    assert all(roles[n] == "bookkeeping" for n in callbacks)
    current = next(n for n in callbacks if n.endswith("current_score"))
    assert _by_name(report)[current].casts["float16"].overflow == 1
    assert {n.rule for n in report.summary.not_judged} == {"optimizer step counter", "batch counter", "trainer state"}
    assert cli("scan-model", str(path), "-t", "fp16", "--quiet").exit_code == 0


def test_hf_trainer_folder_rng_state_is_not_judged(tmp_path: Path, cli: Callable[..., Any]) -> None:
    folder = ckpts.hf_trainer(tmp_path)
    report = scan_checkpoint(str(folder), FP16)
    rows = _by_name(report)
    assert rows["rng_state.cpu"].role == "bookkeeping"
    assert rows["rng_state.cpu"].not_judged == "random number generator state is bytes, not values"
    optimizer = torch.load(folder / "optimizer.pt", weights_only=True)
    _check_against_numpy(report, _flatten("optimizer", optimizer))
    assert all(rows[f"optimizer.state.{i}.step"].role == "bookkeeping" for i in optimizer["state"])
    assert cli("scan-model", str(folder), "-t", "fp16", "--quiet").exit_code == 0


def test_deepspeed_fp32_optimizer_partitions_are_judged_in_float32(tmp_path: Path, cli: Callable[..., Any]) -> None:
    folder = ckpts.deepspeed(tmp_path)
    report = scan_checkpoint(str(folder), FP16)
    optim = torch.load(folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=False)
    tensors = _flatten("zero_pp_rank_0_mp_rank_00_optim_states", optim)
    _check_against_numpy(report, tensors)
    rows = _by_name(report)
    partition = "zero_pp_rank_0_mp_rank_00_optim_states.optimizer_state_dict.single_partition_of_fp32_groups.0"
    assert rows[partition].role == "optimizer"
    assert rows[partition].casts["float16"].overflow == _fp16_counts(tensors[partition])[0] > 0
    assert rows[partition].level == "ok"
    moments = [n for n in tensors if n.endswith(("exp_avg", "exp_avg_sq"))]
    assert [rows[n].not_judged is not None for n in moments] == [True, True]
    assert all(t.role == "model" for t in report.tensors if ".module." in t.name and "num_batches" not in t.name)
    assert report.findings == () or all(f.level == "ok" for f in report.findings)  # no minority-dtype for fp32 state
    assert cli("scan-model", str(folder), "-t", "fp16", "--quiet").exit_code == 0


def test_a_nan_in_bookkeeping_still_fails(tmp_path: Path) -> None:
    path = tmp_path / "nan_step.pt"
    torch.save({"optimizer": {"state": {0: {"step": torch.tensor(float("nan"))}}, "param_groups": []}}, path)
    [row] = scan_checkpoint(str(path), FP16).tensors
    assert row.role == "bookkeeping"
    assert row.level == "fail"


@dataclass(frozen=True)
class _Layout:
    name: str
    dtype: str = "float32"
    shape: tuple[int, ...] = ()


_SQUARE = (64, 64)
_ADAM = [_Layout("optimizer.state.12.exp_avg", shape=(4,)), _Layout("optimizer.param_groups.0.lr")]


@pytest.mark.parametrize(
    ("layouts", "role", "judged"),
    [
        ([_Layout("optimizer.state.12.step"), *_ADAM], "bookkeeping", False),
        (
            [_Layout("optimizer_states.0.state.3.step"), _Layout("optimizer_states.0.state.3.exp_avg_sq")],
            "bookkeeping",
            False,
        ),
        ([_Layout("optimizer.state.12.step", shape=_SQUARE), *_ADAM], "optimizer", True),  # no step counter is 64x64
        ([_Layout("encoder.layer.0.step")], "model", True),  # a module named step is a weight
        # a ModuleList named state is no optimizer state dict: weight is no optimizer's key
        ([_Layout("state.0.step"), _Layout("state.0.weight", shape=_SQUARE)], "model", True),
        ([_Layout("bn.num_batches_tracked", "int64"), _Layout("bn.running_mean", shape=(4,))], "bookkeeping", False),
        ([_Layout("bn.num_batches_tracked", shape=_SQUARE), _Layout("bn.running_mean", shape=(4,))], "model", True),
        ([_Layout("bn.num_batches_tracked", "int64")], "model", True),  # no BatchNorm beside it
        ([_Layout("rng_state.cpu", "uint8", (5056,))], "bookkeeping", False),
        ([_Layout("rng_state_3.cpu", "uint8", (5056,))], "bookkeeping", False),
        ([_Layout("cpu", "uint8", (5056,)), _Layout("numpy.1", "uint32", (624,))], "bookkeeping", False),
        ([_Layout("rng_state.cpu", shape=_SQUARE)], "model", True),
        ([_Layout("scaler.scale")], "bookkeeping", False),
        ([_Layout("scaler.scale", shape=_SQUARE)], "model", True),
        ([_Layout("lr_schedulers.0.base_lrs.0")], "bookkeeping", False),
        ([_Layout("schedulers.weight", shape=_SQUARE)], "model", True),
        ([_Layout("unet.scheduler.alphas_cumprod", shape=(1000,))], "model", True),
        ([_Layout("callbacks.EarlyStopping{'monitor': 'val.loss'}.best_score")], "bookkeeping", False),
        ([_Layout("callbacks.SWA{}.average_model_state.0.weight", shape=_SQUARE)], "model", True),
        ([_Layout("epoch")], "bookkeeping", False),
        ([_Layout("epoch", shape=_SQUARE)], "model", True),
        ([_Layout("optimizer.state.0.exp_avg_sq", shape=(4,))], "optimizer", True),
        ([_Layout("optimizer.state.0.momentum_buffer", shape=(4,))], "optimizer", True),
        (
            [
                _Layout("x.optimizer_state_dict.base_optimizer_state.state.0.exp_avg", shape=(96,)),
                _Layout("x.optimizer_state_dict.single_partition_of_fp32_groups.0", shape=(96,)),
            ],
            "optimizer",
            False,
        ),
        ([_Layout("fp32_flat_groups.0", shape=_SQUARE)], "model", True),  # DeepSpeed's partitions are flat
        (
            [
                _Layout("state.0.exp_avg_sq_row", shape=(4,)),
                _Layout("state.0.exp_avg_sq_col", shape=(6,)),
                _Layout("state.0.exp_avg", shape=(4, 6)),
            ],
            "optimizer",
            False,
        ),
        (  # a row and a column of no one parameter's shape
            [_Layout("state.0.exp_avg_sq_row", shape=_SQUARE), _Layout("state.0.exp_avg_sq_col", shape=(6,))],
            "optimizer",
            True,
        ),
        ([_Layout("decoder.layers.0.self_attn.q_proj.weight", shape=_SQUARE)], "model", True),
    ],
)
def test_roles_follow_the_structure_and_the_tensors_own_shape_and_dtype(
    layouts: list[_Layout], role: str, judged: bool
) -> None:
    rule = assign_roles(layouts).get(layouts[0].name)
    assert (rule.role if rule else "model") == role
    assert (rule is None or rule.not_judged is None) == judged


def test_every_role_rule_is_in_the_readme() -> None:
    text = README.read_text(encoding="utf-8")
    for rule in ROLE_RULES:
        assert f"**{rule.name}**" in text, rule.name


def test_roles_survive_a_baseline_round_trip(tmp_path: Path) -> None:
    report = scan_checkpoint(str(ckpts.plain(tmp_path)), FP16)
    again = read_scan_document(json.loads(json.dumps(document(report))), "test")
    assert [(t.role, t.not_judged, t.passed) for t in again.tensors] == [
        (t.role, t.not_judged, t.passed) for t in report.tensors
    ]
    assert again.summary.not_judged == report.summary.not_judged
