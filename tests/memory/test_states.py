"""Model states: the formulas against the tensors a real torch optimizer step allocates, and hand-derived
quantization, sharding and tying figures."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dtypecheck.dtypes import lookup
from dtypecheck.memory import states
from dtypecheck.memory.estimate import EstimateOptions, estimate_row, plan_rows
from dtypecheck.memory.inventory import inventory_of_module
from dtypecheck.memory.measure import make_optimizer
from dtypecheck.memory.subject import Subject
from dtypecheck.memory_words import Mode, Optimizer, OptimizerImpl, Precision, Strategy


class Mixed(nn.Module):
    """Every parameter shape the formulas distinguish: 4-D conv, 2-D linear, 1-D bias and norm, embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.conv = nn.Conv2d(3, 8, 3)
        self.norm = nn.LayerNorm(16)
        self.linear = nn.Linear(16 * 1, 300)
        self.bn = nn.BatchNorm1d(300)

    def forward(self, ids: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embed(ids)).mean(1)
        total: torch.Tensor = self.bn(self.linear(x)).sum() + self.conv(image).sum()
        return total


def _stepped(optimizer_name: str, dtype: torch.dtype | None) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Mixed().to(dtype)
    optimizer = make_optimizer(optimizer_name, list(model.parameters()), OptimizerImpl.for_loop)
    loss = model(torch.randint(0, 50, (4, 5)), torch.randn(4, 3, 8, 8, dtype=dtype))
    loss.backward()
    optimizer.step()
    return model, optimizer


def _state_nbytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(
        value.untyped_storage().nbytes()
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    )


@pytest.mark.parametrize("optimizer_name", ["adamw", "adam", "sgd", "adafactor"])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_optimizer_states_equal_what_a_real_step_allocates(optimizer_name, dtype_name):
    spec = lookup(dtype_name)
    model, optimizer = _stepped(optimizer_name, spec.torch_dtype())
    inventory = inventory_of_module(model)
    assert states.optimizer_state_bytes(inventory, Optimizer(optimizer_name), spec, Precision.pure) == _state_nbytes(
        optimizer
    )
    grads = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    assert states.gradient_bytes(inventory, spec, Precision.pure) == grads


def test_fp32_adamw_is_16_bytes_per_trainable_parameter():
    model, optimizer = _stepped("adamw", torch.float32)
    inventory = inventory_of_module(model)
    n = sum(p.numel() for p in model.parameters())
    moments = sum(s["exp_avg"].nbytes + s["exp_avg_sq"].nbytes for s in optimizer.state.values())
    assert moments == 8 * n
    spec = lookup("float32")
    plan = states.plan_weights(inventory, spec, Precision.pure, keep_unquantized=False, group_size=128)
    step_tensors = 4 * len(list(model.parameters()))  # one float32 scalar `step` per tensor
    assert plan.weight_bytes + states.gradient_bytes(inventory, spec, Precision.pure) == 8 * n
    assert states.optimizer_state_bytes(inventory, Optimizer.adamw, spec, Precision.pure) == 8 * n + step_tensors


def test_amp_and_master_keep_float32_copies():
    model = Mixed()
    inventory = inventory_of_module(model)
    n = sum(p.numel() for p in model.parameters())
    bf16 = lookup("bfloat16")
    assert (
        states.plan_weights(inventory, bf16, Precision.amp, keep_unquantized=False, group_size=128).weight_bytes
        == 4 * n
    )
    assert states.gradient_bytes(inventory, bf16, Precision.amp) == 4 * n
    assert (
        states.plan_weights(inventory, bf16, Precision.master, keep_unquantized=False, group_size=128).weight_bytes
        == 2 * n
    )
    assert states.gradient_bytes(inventory, bf16, Precision.master) == 2 * n
    assert states.master_weight_bytes(inventory, Precision.master) == 4 * n
    # Optimizer states live beside the float32 master copy.
    assert states.optimizer_state_bytes(inventory, Optimizer.sgd, bf16, Precision.master) == 4 * n


def test_lion_and_adam8bit_by_hand():
    model = nn.Linear(256, 128)  # weight 32768 elements (8-bit states), bias 128 (32-bit states)
    inventory = inventory_of_module(model)
    fp32 = lookup("float32")
    assert states.optimizer_state_bytes(inventory, Optimizer.lion, fp32, Precision.pure) == 4 * (32768 + 128)
    weight = 2 * 32768 + 2 * (32768 // 256) * 4  # two uint8 states and a float32 absmax per 256-element block
    bias = 2 * 128 * 4
    assert states.optimizer_state_bytes(inventory, Optimizer.adam8bit, fp32, Precision.pure) == weight + bias


def test_quantization_overheads_by_hand():
    model = nn.Sequential(nn.Embedding(1000, 64), nn.LayerNorm(64), nn.Linear(64, 96))
    inventory = inventory_of_module(model)
    embedding, norm, weight, bias = 1000 * 64, 2 * 64, 96 * 64, 96

    def plan(dtype: str, keep: bool = False, group: int = 32) -> states.WeightPlan:
        return states.plan_weights(inventory, lookup(dtype), Precision.pure, keep_unquantized=keep, group_size=group)

    # int8: one byte per element and a float32 scale per output row; vectors stay float32.
    int8 = plan("int8")
    assert int8.quantization_overhead == 1000 * 4 + 96 * 4
    assert int8.weight_bytes == embedding + 1000 * 4 + weight + 96 * 4 + 4 * (norm + bias)
    # int4: half a byte per element, a 16-bit scale and a 16-bit zero per group of 32 along each row.
    int4 = plan("int4")
    groups = 1000 * math.ceil(64 / 32) + 96 * math.ceil(64 / 32)
    assert int4.quantization_overhead == 4 * groups
    assert int4.weight_bytes == (embedding + weight) // 2 + 4 * groups + 4 * (norm + bias)
    assert plan("int4", group=16).quantization_overhead == 2 * int4.quantization_overhead
    # float8: one float32 scale per tensor.
    fp8 = plan("float8_e4m3fn")
    assert fp8.quantization_overhead == 2 * 4
    assert fp8.weight_bytes == embedding + weight + 8 + 4 * (norm + bias)
    # Keeping embeddings (and norms) at their own dtype.
    kept = plan("int8", keep=True)
    assert kept.weight_bytes == 4 * embedding + weight + 96 * 4 + 4 * (norm + bias)


def test_tied_parameters_count_once_and_buffers_keep_their_dtype():
    model = nn.Sequential(nn.Embedding(100, 8), nn.BatchNorm1d(8), nn.Linear(8, 100, bias=False))
    model[2].weight = model[0].weight
    inventory = inventory_of_module(model)
    assert inventory.parameter_count == 100 * 8 + 2 * 8
    # running_mean and running_var (float32) and num_batches_tracked (int64)
    assert inventory.buffer_bytes == 2 * 8 * 4 + 8
    subject = Subject("m", "factory", "Sequential", inventory, 0, None, None, None, None)
    rows, _ = plan_rows(EstimateOptions(dtypes=(lookup("bfloat16"),), modes=(Mode.inference,)))
    row = estimate_row(subject, rows[0], EstimateOptions(), None)
    assert row.bytes.buffers == 2 * 8 * 4 + 8
    assert row.bytes.parameters == 2 * (100 * 8 + 2 * 8)


@pytest.mark.parametrize(
    ("strategy", "parts"),
    [("ddp", (1, 1, 1)), ("zero1", (4, 1, 1)), ("zero2", (4, 4, 1)), ("zero3", (4, 4, 4)), ("fsdp", (4, 4, 4))],
)
def test_sharding_divides_the_states(strategy, parts):
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    inventory = inventory_of_module(model)
    n = 2 * (64 * 64 + 64)
    subject = Subject("m", "factory", "Sequential", inventory, 0, None, None, None, None)
    options = EstimateOptions(
        dtypes=(lookup("float32"),), modes=(Mode.training,), strategy=Strategy(strategy), world_size=4
    )
    rows, _ = plan_rows(options)
    row = estimate_row(subject, rows[0], options, None)
    opt_parts, grad_parts, param_parts = parts
    assert row.bytes.parameters == math.ceil(4 * n / param_parts)
    assert row.bytes.optimizer_states == math.ceil((8 * n + 4 * 4) / opt_parts)
    ddp_buckets = 4 * n if strategy == "ddp" else 0
    assert row.bytes.gradients == math.ceil(4 * n / grad_parts) + ddp_buckets
    # ZeRO-3/FSDP gather one Linear (the unit) and prefetch the next, with its gradients.
    unit = 64 * 64 + 64
    assert row.bytes.gathered_parameters == (unit * (2 * 4 + 4) if param_parts > 1 else 0)
    assert row.sharding.world_size == 4


def test_an_rnn_pickled_whole_counts_its_flat_weights_once(cli, tmp_path):
    path = tmp_path / "lstm.pt"
    torch.save(nn.LSTM(8, 16, num_layers=2), path)
    doc = cli("estimate-memory", str(path), "-d", "fp32", "-m", "inference", "-f", "json").json()
    # Per layer 4*16 gates: weight_ih (64 x in), weight_hh (64 x 16), two biases of 64.
    assert doc["model"]["parameters"] == (64 * 8 + 64 * 16 + 128) + (64 * 16 + 64 * 16 + 128)
    assert doc["estimates"][0]["bytes"]["parameters"] == 4 * doc["model"]["parameters"]
