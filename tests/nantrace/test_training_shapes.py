"""Common training shapes end to end (issue 18.5): gradient accumulation, ``clip_grad_norm_``, activation
checkpointing, ``torch.compile``, a diverging LR schedule, and a Hugging Face GPT-2 built from a config (no
download) under fp16 autocast + GradScaler, clean and with a planted overflow. (A custom ``autograd.Function``
backward is ``test_scripts.test_custom_function_whose_grad_is_nan_points_at_its_backward``.)"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tests.nantrace._scripts import NanTrace, line_of

ACCUMULATION = """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
MICRO = 4
for step in range(1, 4):
    optimizer.zero_grad()
    for micro in range(1, MICRO + 1):
        x = torch.randn(2, 4)
        if (step, micro) == (2, 3):
            x = x * torch.log(torch.tensor(-1.0))  # planted
        loss = model(x).pow(2).mean() / MICRO
        loss.backward()
    optimizer.step()
"""


def test_a_nan_in_micro_batch_3_of_step_2_is_step_2(nantrace: NanTrace) -> None:
    first, doc, text = nantrace.failing("accumulate.py", ACCUMULATION)
    assert (first["kind"], first["op"], first["step"]) == ("nan", "aten.log.default", 2)
    assert first["location"]["line"] == line_of(text, "planted")
    assert first["consequence"] == "loss"
    assert doc["steps"] == 1  # the one optimizer step completed before tracing stopped the run


CLIP = """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 3)
y = model(x)
loss = torch.sqrt(y - y.detach()).sum()  # sqrt
loss.backward()
norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
optimizer.step()
"""


def test_clip_grad_norm_turning_an_inf_norm_into_nan_parameters_is_named_at_the_backward_producer(
    nantrace: NanTrace,
) -> None:
    first, _, text = nantrace.failing("clip.py", CLIP)
    # sqrt(0) is finite; its gradient grad / (2 * sqrt(0)) is born infinite in backward. clip_grad_norm_ then
    # multiplies every gradient by 1 / (inf + 1e-6) = 0: inf * 0 is NaN, and the optimizer writes it.
    assert (first["kind"], first["phase"], first["grad_fn"]) == ("inf", "backward", "SqrtBackward0")
    assert first["location"]["line"] == line_of(text, "sqrt")
    assert first["consequence"] == "parameter"


CHECKPOINTED = """
import torch
from torch.utils.checkpoint import checkpoint


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.log(self.fc(x) - 50.0)  # block


torch.manual_seed(0)
block, head = Block(), torch.nn.Linear(4, 1)
x = torch.randn(3, 4)
loss = head(checkpoint(block, x, use_reentrant=False)).mean()
loss.backward()
"""


def test_a_nan_in_a_checkpointed_block_is_its_forward_line_not_the_recompute(nantrace: NanTrace) -> None:
    first, _, text = nantrace.failing("checkpointed.py", CHECKPOINTED, "--keep-going")
    assert (first["kind"], first["op"], first["phase"], first["step"]) == ("nan", "aten.log.default", "forward", 1)
    assert first["location"]["line"] == line_of(text, "block")
    assert first["consequence"] == "loss"


COMPILED = """
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.exp(self.fc(x).abs() + 100.0)  # overflow


torch.manual_seed(0)
model = torch.compile(Net())
model(torch.randn(2, 4)).sum().backward()
"""


def test_a_compiled_model_is_traced_eagerly_and_named_inside_its_forward(nantrace: NanTrace) -> None:
    first, doc, text = nantrace.failing("compiled.py", COMPILED)
    assert (first["kind"], first["op"], first["module"]) == ("inf", "aten.exp.default", "")
    assert first["location"]["line"] == line_of(text, "overflow")
    assert first["cause"] == "range_overflow"  # exp(100 + |x|) is past float32's max, finite in float64
    assert doc["notes"][0].startswith("torch.compile was called 1 time(s) and ran eagerly under tracing")


DIVERGING = """
import torch

w = torch.nn.Parameter(torch.tensor([1.0]))
optimizer = torch.optim.SGD([w], lr=1.0)
schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 10.0**epoch)
for step in range(1, 12):
    optimizer.zero_grad()
    loss = (w * w).sum()  # loss
    loss.backward()
    optimizer.step()
    schedule.step()
"""


def _diverging_in_float32() -> tuple[int, str]:
    """(step, what) of the first infinity, replayed op by op in numpy float32: the forward ``w * w``, its gradient
    ``2 * w``, SGD's ``w - lr * grad``."""
    w = np.float32(1.0)
    with np.errstate(over="ignore"):
        for step in range(1, 12):
            lr = np.float32(10.0 ** (step - 1))
            if not np.isfinite(w * w):
                return step, "forward"
            grad = np.float32(2.0) * w
            w = w - lr * grad
            if not np.isfinite(grad) or not np.isfinite(w):
                return step, "other"
    raise AssertionError("no overflow in 11 steps")


def test_a_diverging_lr_schedule_is_caught_at_the_step_float32_overflows(nantrace: NanTrace) -> None:
    script, text = nantrace.write("diverge.py", DIVERGING)
    code, doc, _ = nantrace.json(str(script))
    assert code == 1
    step, phase = _diverging_in_float32()
    first = doc["first"]
    assert first["kind"] == "inf"
    assert (first["step"], first["phase"]) == (step, phase)
    if phase == "forward":
        assert first["location"]["line"] == line_of(text, "loss")


GPT2 = """
import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging

logging.set_verbosity_error()
torch.manual_seed(0)
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)
if sys.argv[2] == "overflow":
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.mul_(3e4)  # planted
ids = torch.randint(0, 64, (2, 12))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu")
losses = []
for step in range(4):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(input_ids=ids, labels=ids).loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    losses.append(loss.item())
with open(sys.argv[1], "w", encoding="utf-8") as handle:
    json.dump(losses, handle)
"""


def _plain(script: Path, *argv: str) -> None:
    saved = sys.argv[:]
    sys.argv = [str(script), *argv]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved


def test_gpt2_from_a_config_is_clean_under_fp16_autocast_and_gradscaler(nantrace: NanTrace, tmp_path: Path) -> None:
    script, _ = nantrace.write("gpt2.py", GPT2)
    _plain(script, str(tmp_path / "plain.json"), "clean")
    code, doc, stderr = nantrace.json(str(script), "--", str(tmp_path / "traced.json"), "clean")
    assert (code, doc["status"], doc["steps"]) == (0, "clean", 4), stderr
    assert doc["skipped_steps"] == []
    plain = json.loads((tmp_path / "plain.json").read_text(encoding="utf-8"))
    assert json.loads((tmp_path / "traced.json").read_text(encoding="utf-8")) == plain


def test_gpt2_with_a_planted_fp16_overflow_names_the_first_op_that_overflowed(
    nantrace: NanTrace, tmp_path: Path
) -> None:
    import torch

    first, doc, _ = nantrace.failing(
        "gpt2.py", GPT2, "--max-skipped-steps", "3", "--", str(tmp_path / "t.json"), "overflow"
    )
    assert (first["kind"], first["phase"], first["module"]) == ("inf", "forward", "transformer.h.1.mlp.act")
    assert first["op"] == "aten.pow.Tensor_Scalar"  # GELU's x ** 3
    assert first["consequence"] == "scale_collapse"
    assert first["location"]["file"].endswith("transformers/activations.py")
    assert doc["scale_collapse"]["steps"] == 3
    # Independently: the planted layer's output (GELU's input) stays below fp16's max, its cube does not.
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    planted: Any = model.get_submodule("transformer.h.1.mlp.c_fc")
    with torch.no_grad():
        planted.weight.mul_(3e4)
    seen: list[float] = []
    planted.register_forward_hook(lambda m, a, out: seen.append(float(out.abs().max())))
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        model(input_ids=ids)
    assert seen[0] < 65504.0 < seen[0] ** 3
