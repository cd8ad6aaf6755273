"""``dtypecheck nan-trace SCRIPT``: small buggy scripts, each checked for the exact op, phase, module and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.nantrace._scripts import FP16_MAX, FP32_MAX, NanTrace, line_of

BACKWARD_ONLY = """
import torch

class Root(torch.nn.Module):
    def forward(self, h):
        return torch.sqrt(h - h.detach())  # sqrt

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.act = Root()

    def forward(self, x):
        return self.act(self.fc(x))

net = Net()
loss = net(torch.randn(2, 4)).sum()
loss.backward()
"""


def test_backward_only_infinity_is_blamed_on_the_backward_op_at_its_forward_line(nantrace: NanTrace) -> None:
    script, text = nantrace.write("backward_only.py", BACKWARD_ONLY)
    code, doc, _ = nantrace.json(str(script))
    assert code == 1
    assert doc["status"] == "nonfinite"
    first = doc["first"]
    # sqrt(0) is a finite forward value; its gradient grad / (2 * sqrt(0)) is born infinite in backward.
    assert (first["kind"], first["op"], first["phase"]) == ("inf", "aten.div.Tensor", "backward")
    assert first["grad_fn"] == "SqrtBackward0"
    assert first["module"] == "act"
    assert first["location"]["file"] == str(script)
    assert first["location"]["line"] == line_of(text, "sqrt")
    assert first["location"]["code"] == "return torch.sqrt(h - h.detach())  # sqrt"
    assert first["cause"] == "invalid_math"  # x / 0 is infinite in float64 too
    assert first["counts"] == {"nan": 0, "posinf": 8, "neginf": 0, "zeros": 0, "subnormal": 0}
    assert first["limit"] == FP32_MAX


CUSTOM_GRAD = """
import torch

class BadGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")  # bad grad

w = torch.ones(3, requires_grad=True)
BadGrad.apply(w).sum().backward()
"""


def test_custom_function_whose_grad_is_nan_points_at_its_backward(nantrace: NanTrace) -> None:
    first, _, text = nantrace.failing("custom_grad.py", CUSTOM_GRAD)
    assert (first["kind"], first["op"], first["phase"]) == ("nan", "aten.mul.Tensor", "backward")
    assert first["grad_fn"] == "BadGradBackward"
    assert first["module"] is None
    assert first["location"]["line"] == line_of(text, "bad grad")
    assert first["location"]["function"] == "backward"
    assert first["cause"] == "input"  # the NaN is the user's own constant
    assert first["counts"]["nan"] == 3


AUTOCAST_LINEAR = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x):
        h = self.fc(x)  # overflow
        return self.out(torch.relu(h))

net = Net()
with torch.no_grad():
    net.fc.weight.fill_(100.0)
    net.fc.bias.zero_()
loss = net(torch.full((4, 8), 1000.0)).float().mean()
loss.backward()
"""


def test_fp16_autocast_overflow_in_a_linear(nantrace: NanTrace) -> None:
    script, text = nantrace.write("amp_linear.py", AUTOCAST_LINEAR)
    code, doc, _ = nantrace.json(str(script), "--autocast", "fp16")
    assert code == 1
    assert doc["autocast"] == "float16"
    first = doc["first"]
    # 8 inputs of 1000 times weights of 100: 800000, beyond float16's 65504 but finite in float64.
    assert (first["kind"], first["op"], first["phase"]) == ("inf", "aten.addmm.default", "forward")
    assert first["module"] == "fc"
    assert first["grad_fn"] == "AddmmBackward0"
    assert first["dtype"] == "float16"
    assert first["limit"] == FP16_MAX
    assert first["location"]["line"] == line_of(text, "overflow")
    assert first["cause"] == "range_overflow"
    assert first["counts"] == {"nan": 0, "posinf": 32, "neginf": 0, "zeros": 0, "subnormal": 0}
    # The same script without autocast runs clean in float32.
    code, doc, _ = nantrace.json(str(script))
    assert (code, doc["status"]) == (0, "clean")


MASK = """
import torch

scores = torch.randn(2, 4, 4, requires_grad=True)
mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
bias = torch.full((4, 4), float("-inf")).triu(1)
causal = scores.masked_fill(mask, float("-inf")).softmax(-1)
additive = (scores + bias).softmax(-1)
finfo_min = scores.masked_fill(mask, torch.finfo(torch.float32).min).softmax(-1)
(causal.sum() + additive.sum() + finfo_min.sum()).backward()
"""


def test_minus_inf_and_finfo_min_masks_stay_silent(nantrace: NanTrace) -> None:
    script, _ = nantrace.write("mask.py", MASK)
    code, doc, _ = nantrace.json(str(script))
    assert code == 0
    assert doc["status"] == "clean"
    assert doc["first"] is None
    assert doc["warnings"] == []
    assert doc["steps"] == 1


DATA_NAN = """
import torch

model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
batch = torch.randn(5, 3)
batch[2, 1] = float("nan")  # data
loss = model(batch).mean()
loss.backward()
"""


def test_nan_written_into_the_batch_is_reported_at_the_line_that_wrote_it(nantrace: NanTrace) -> None:
    first, _, text = nantrace.failing("data_nan.py", DATA_NAN)
    # The Python constant becomes a tensor (lift_fresh) on the line that writes it into the batch.
    assert (first["kind"], first["op"], first["phase"]) == ("nan", "aten.lift_fresh.default", "other")
    assert first["module"] is None
    assert first["grad_fn"] is None
    assert first["location"]["line"] == line_of(text, "data")
    assert first["cause"] == "input"
    assert first["counts"]["nan"] == 1


def test_nan_in_a_literal_batch_is_reported_where_the_batch_is_made(nantrace: NanTrace, tmp_path: Path) -> None:
    script, text = nantrace.write(
        "literal.py",
        """
        import torch
        model = torch.nn.Linear(2, 1)
        batch = torch.tensor([[1.0, 2.0], [float("nan"), 1.0]])  # literal
        model(batch).sum().backward()
        """,
    )
    code, doc, _ = nantrace.json(str(script))
    assert code == 1
    first = doc["first"]
    assert (first["kind"], first["op"], first["location"]["line"]) == ("nan", "aten.lift_fresh.default", 3)
    assert line_of(text, "literal") == 3
    assert first["cause"] == "input"


INPLACE = """
import torch

class Scale(torch.nn.Module):
    def forward(self, x):
        h = x.abs() * 1e10 + 1.0
        h.mul_(1e30)  # in-place
        return h - h  # inf - inf

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.scale = Scale()

    def forward(self, x):
        return self.scale(self.fc(x))

net = Net()
with torch.no_grad():  # every fc output is 3, so every h is 3e10 + 1 and every h * 1e30 overflows
    net.fc.weight.fill_(1.0)
    net.fc.bias.zero_()
out = net(torch.ones(2, 3)).sum()
print("finished")
"""


def test_in_place_overflow_is_checked_before_and_after_the_op(nantrace: NanTrace) -> None:
    first, doc, text = nantrace.failing("inplace.py", INPLACE)
    # h is at least 1e10 before mul_; 1e40 exceeds float32's 3.4e38 (float64 keeps it).
    assert (first["kind"], first["op"], first["phase"]) == ("inf", "aten.mul_.Tensor", "forward")
    assert first["module"] == "scale"
    assert first["location"]["line"] == line_of(text, "in-place")
    assert first["cause"] == "range_overflow"
    assert first["counts"] == {"nan": 0, "posinf": 6, "neginf": 0, "zeros": 0, "subnormal": 0}
    assert doc["events"] == [first]
    assert doc["stopped_early"] is True


LOOP = """
import torch

model = torch.nn.Linear(3, 1)
for step in range(200):
    x = torch.randn(4, 3)
    if step == 0:
        x = x.log()  # log of negatives
    model(x).sum().backward()
    if step == 3:
        model(x.log()).sum().backward()  # later
print("finished")
"""


def test_the_run_stops_at_the_first_read_back_after_the_event(nantrace: NanTrace) -> None:
    script, text = nantrace.write("loop.py", LOOP)
    code, doc, stderr = nantrace.json(str(script))
    assert code == 1
    assert (doc["first"]["op"], doc["first"]["location"]["line"]) == (
        "aten.log.default",
        line_of(text, "log of negatives"),
    )
    assert doc["first"]["cause"] == "invalid_math"
    # Checks are read back at the latest when forward turns to backward: the run ends inside step 1.
    assert doc["steps"] == 0
    assert "finished" not in stderr


def test_keep_going_collects_every_producer(nantrace: NanTrace) -> None:
    script, text = nantrace.write("inplace.py", INPLACE)
    code, doc, stderr = nantrace.json(str(script), "--keep-going")
    assert code == 1
    ops = [(e["kind"], e["op"], e["location"]["line"]) for e in doc["events"]]
    assert ops == [
        ("inf", "aten.mul_.Tensor", line_of(text, "in-place")),
        ("nan", "aten.sub.Tensor", line_of(text, "inf - inf")),  # a new NaN from two infinities
    ]
    assert doc["events"][1]["cause"] == "invalid_math"
    assert doc["first"] == doc["events"][0]
    assert doc["stopped_early"] is False
    assert "finished" in stderr  # the script ran to its end; its prints went to stderr


OPTIMIZER = """
import torch

model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh(), torch.nn.Linear(2, 1))
optimizer = torch.optim.SGD(model[2].parameters(), lr=float("nan"))
model(torch.randn(4, 3)).sum().backward()
optimizer.step()  # step
"""


def test_nan_born_in_the_optimizer_step(nantrace: NanTrace) -> None:
    first, doc, text = nantrace.failing("optimizer.py", OPTIMIZER)
    assert (first["kind"], first["op"], first["phase"]) == ("nan", "aten.add_.Tensor", "other")
    assert first["location"]["line"] == line_of(text, "step")
    assert first["module"] == "2"  # the module whose parameter the step wrote
    assert first["cause"] == "input"
    assert first["step"] == 1
    assert doc["steps"] == 1


WARNINGS = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x).half()
        two_hundreds = h * 0 + 200.0
        near = two_hundreds * two_hundreds  # near
        tiny = torch.exp(h * 0 - 30.0)  # tiny
        return near.float().mean() + tiny.float().mean()

net = Net()
for _ in range(2):
    net(torch.randn(2, 4)).backward()
"""


def test_near_overflow_and_underflow_warnings(nantrace: NanTrace, cli: Any) -> None:
    script, text = nantrace.write("warnings.py", WARNINGS)
    code, doc, _ = nantrace.json(str(script))
    assert code == 0  # warnings alone pass...
    assert doc["status"] == "clean"
    kinds = [(w["kind"], w["op"], w["phase"], w["module"], w["location"]["line"]) for w in doc["warnings"]]
    # ...each reported once although both steps reach them (first per module).
    assert kinds == [
        ("near_overflow", "aten.mul.Tensor", "forward", "", line_of(text, "near")),
        ("underflow", "aten.exp.default", "forward", "", line_of(text, "tiny")),
    ]
    near, tiny = doc["warnings"]
    assert near["absmax"] == 40000.0
    assert near["absmax"] / near["limit"] == pytest.approx(40000 / FP16_MAX)
    # exp(-30) = 9.4e-14 is below float16's smallest subnormal 2**-24: all 8 values flush to zero.
    assert tiny["counts"]["zeros"] == 8
    assert doc["steps"] == 2
    assert cli("nan-trace", str(script), "--fail-on", "warn", "--format", "json").exit_code == 1
    code, doc, _ = nantrace.json(str(script), "--warn-frac", "0.7")
    assert [w["kind"] for w in doc["warnings"]] == ["underflow"]  # 40000 / 65504 = 0.61 < 0.7


def test_history_keeps_the_last_k_ops_with_their_ratio(nantrace: NanTrace) -> None:
    script, text = nantrace.write("inplace.py", INPLACE)
    _, doc, _ = nantrace.json(str(script), "--history", "3")
    history = doc["first"]["history"]
    assert len(history) == 3
    # The ops just before mul_: the Linear, then abs, mul and add on the line before.
    assert [h["op"] for h in history] == ["aten.abs.default", "aten.mul.Tensor", "aten.add.Tensor"]
    last = history[-1]
    assert last["module"] == "scale"
    assert last["ratio"] == pytest.approx(last["absmax"] / FP32_MAX)
    assert last["location"]["line"] == line_of(text, "in-place") - 1
    loop, _ = nantrace.write("loop.py", LOOP)
    _, doc, _ = nantrace.json(str(loop), "--keep-going")
    assert [len(e["history"]) for e in doc["events"]][-1] == 20
    _, doc, _ = nantrace.json(str(script), "--history", "0")
    assert doc["first"]["history"] == []


PASS_ON = """
import torch

w = torch.ones(3, requires_grad=True)
x = -torch.ones(3)
y = torch.log(x)  # producer
z = torch.tanh(y * w) + 1.0
loss = (z * w).sum()
loss.backward()
print("grad", w.grad)
"""


def test_ops_that_pass_a_nan_on_or_reread_it_in_backward_are_not_blamed(nantrace: NanTrace) -> None:
    script, text = nantrace.write("pass_on.py", PASS_ON)
    code, doc, stderr = nantrace.json(str(script), "--keep-going", "--device", "cpu")
    assert code == 1
    assert doc["device"] == "cpu"
    # mul, tanh, add, sum and every backward op (which re-read the saved NaN y) only pass the NaN on.
    assert [(e["op"], e["location"]["line"]) for e in doc["events"]] == [
        ("aten.log.default", line_of(text, "producer"))
    ]
    assert doc["steps"] == 1
    assert "grad tensor([nan, nan, nan])" in stderr
