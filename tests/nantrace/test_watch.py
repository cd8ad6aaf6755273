"""``nan-trace --watch``: a late non-finite step, found by the cheap checks, replayed, and reported as a full trace.

Each planted failure is run twice, fully traced and watched, and the two reports must name the same producer
(kind, op, phase, module, step, line, cause, consequence, counts); the step and line are also found independently
(the planted step, the ``# marker`` line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import dtypecheck
from tests.nantrace._scripts import NanTrace, line_of

SAME = ("kind", "op", "phase", "module", "grad_fn", "step", "cause", "consequence", "counts", "absmax", "dtype")

MODES = """
import sys
import torch


class Root(torch.nn.Module):
    def forward(self, h, bad):
        if bad:
            return torch.sqrt(h - h.detach()) + h  # sqrt
        return h


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.norm = torch.nn.BatchNorm1d(8)

    def forward(self, x, scale):
        h = self.norm(torch.nn.functional.dropout(self.fc(x), 0.1, self.training))
        return torch.exp(h * scale)  # overflow


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.act = Root()
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x, scale=1.0, bad=False):
        return self.head(self.act(self.block(x, scale), bad))


torch.manual_seed(0)
net = Net()
mode, bad = sys.argv[1], int(sys.argv[2])
optimizer = torch.optim.SGD(net.parameters(), lr=1e-2, momentum=0.9)
for step in range(1, 12):
    x = torch.randn(16, 8)
    out = net(x, scale=100.0 if (mode == "forward" and step == bad) else 1.0, bad=(mode == "backward" and step == bad))
    loss = out.pow(2).mean()
    if mode == "optimizer" and step == bad:
        loss = loss * 1e30
        optimizer.param_groups[0]["lr"] = 1e10
    if mode == "overwrite" and step == bad:
        loss = loss * float("inf")
    if mode == "loss" and step >= bad:
        loss = torch.log(loss - 100.0)  # loss
    loss.backward()
    if mode == "overwrite" and step == bad:
        x.add_(1.0)  # the batch is overwritten after the model read it
    optimizer.step()  # update
    optimizer.zero_grad()
    optimizer.param_groups[0]["lr"] = 1e-2
print("done")
"""


def _both(nantrace: NanTrace, path: Path, *argv: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same run traced fully and watched."""
    code_full, full, _ = nantrace.json(str(path), "--", *argv)
    code_watch, watched, _ = nantrace.json("--watch", str(path), "--", *argv)
    assert (code_full, code_watch) == (1, 1)
    return full, watched


@pytest.mark.parametrize(
    ("mode", "marker", "detected", "expected"),
    [
        ("forward", "overflow", "loss", ("inf", "aten.exp.default", "forward", "block", "range_overflow", "loss")),
        ("backward", "sqrt", "gradients", ("inf", "aten.div.Tensor", "backward", "act", "invalid_math", "parameter")),
        ("optimizer", "update", "optimizer_step", ("inf", "aten.add_.Tensor", "other", "block.fc", None, "parameter")),
    ],
)
def test_watch_replays_the_late_step_and_reports_what_a_full_trace_does(
    nantrace: NanTrace, mode: str, marker: str, detected: str, expected: tuple[Any, ...]
) -> None:
    path, text = nantrace.write("modes.py", MODES)
    full, watched = _both(nantrace, path, mode, "7")
    first, replayed = full["first"], watched["first"]
    assert {k: replayed[k] for k in SAME} == {k: first[k] for k in SAME}
    assert replayed["location"] == first["location"]
    kind, op, phase, module, cause, consequence = expected
    assert (first["kind"], first["op"], first["phase"], first["module"]) == (kind, op, phase, module)
    assert (first["cause"], first["consequence"]) == (cause, consequence)
    assert first["step"] == 7  # the planted step, counted from 1
    assert first["location"]["line"] == line_of(text, marker)
    # The replay's history holds the replayed calls' ops only (the full trace's also the loss and earlier steps),
    # and ends with the same ops.
    history = [(h["op"], h["module"], h["phase"]) for h in replayed["history"]]
    assert len(history) >= 2
    assert history[-2:] == [(h["op"], h["module"], h["phase"]) for h in first["history"]][-2:]
    summary = watched["watch"]
    assert (summary["detected"], summary["detected_step"], summary["replayed_step"]) == (detected, 7, 7)
    assert (summary["exact"], summary["reason"], summary["traced_from_step"]) == (True, None, None)
    assert watched["ops"] < full["ops"]  # only the replayed step was traced
    what = detected.replace("_", " ")
    assert (
        watched["notes"][-1]
        == f"watch mode: step 7's {what} went non-finite; step 7 was replayed exactly under full tracing"
    )


def test_watch_clean_run_traces_nothing_and_counts_the_snapshot(nantrace: NanTrace) -> None:
    path, _ = nantrace.write("modes.py", MODES)
    code, doc, _ = nantrace.json("--watch", str(path), "--", "clean", "0")
    assert code == 0
    assert (doc["status"], doc["first"], doc["ops"], doc["steps"]) == ("clean", None, 0, 11)
    summary = doc["watch"]
    assert (summary["steps_checked"], summary["detected"], summary["replayed_step"]) == (11, None, None)
    # By hand: the optimizer snapshot holds the parameters and SGD's momentum buffers (block.fc 8x8 and 8, norm 8
    # and 8, head 8 and 1 float32), each on whole 64-byte lines of one allocation; the batch-norm buffers
    # running_mean/var (8+8 float32) and num_batches_tracked (one int64) are copied as they change, the CPU
    # generator's state is 5056 bytes, and the gradient kept for the model's 16x1 output is 16 float32.
    parameters = sum(-(-4 * n // 64) * 64 for n in (8 * 8, 8, 8, 8, 8, 1))
    assert parameters == 256 + 5 * 64
    expected = 2 * parameters + (4 * 16 + 8) + torch.get_rng_state().nbytes + 4 * 16
    assert torch.get_rng_state().nbytes == 5056
    assert summary["snapshot_bytes"] == expected
    assert summary["optimizer_snapshot"] is True


def test_watch_says_plainly_when_a_step_cannot_be_replayed_and_traces_the_next_steps(nantrace: NanTrace) -> None:
    path, text = nantrace.write("modes.py", MODES)
    code, doc, _ = nantrace.json("--watch", str(path), "--", "loss", "5")
    assert code == 1
    summary = doc["watch"]
    assert (summary["detected"], summary["detected_step"], summary["exact"]) == ("loss", 5, False)
    assert "came out finite" in summary["reason"]
    assert summary["traced_from_step"] == 6
    # Step 6, traced fully, finds the log of a negative loss: outside every module, at the user's line.
    first = doc["first"]
    assert (first["kind"], first["op"], first["module"], first["step"]) == ("nan", "aten.log.default", None, 6)
    assert first["location"]["line"] == line_of(text, "loss")
    assert any("could not be replayed exactly" in note for note in doc["notes"])
    assert doc["notes"][-1] == "steps from 6 on were traced fully instead"


SQUARE_LOSS = """
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
optimizer = torch.optim.Adam(model.parameters())
for step in range(8):
    x = torch.randn(8, 4)
    if step == 5:
        x = x * 1e38  # huge batch
    loss = model(x).pow(2).mean()  # square loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_watch_says_when_the_loss_was_born_outside_the_model_calls(nantrace: NanTrace) -> None:
    # The model's output stays finite (|out| < 1e38) and so does the gradient into it (2 out / 8), but the square
    # loss overflows float32: a full trace names that pow; watch mode, which re-runs only the model calls, finds the
    # first non-finite value inside them (backward's mm into the last Linear's weight) and must not call it exact.
    path, text = nantrace.write("square.py", SQUARE_LOSS)
    code_full, full, _ = nantrace.json(str(path))
    code, doc, _ = nantrace.json("--watch", str(path))
    assert (code_full, code) == (1, 1)
    expected_full = ("aten.pow.Tensor_Scalar", "forward", 6)
    assert (full["first"]["op"], full["first"]["phase"], full["first"]["step"]) == expected_full
    assert full["first"]["location"]["line"] == line_of(text, "square loss")
    first, summary = doc["first"], doc["watch"]
    assert (first["op"], first["phase"], first["module"], first["step"]) == ("aten.mm.default", "backward", "2", 6)
    assert (summary["detected"], summary["replayed_step"], summary["exact"]) == ("loss", 6, False)
    assert summary["reason"].startswith("the step's loss went non-finite while every replayed model output was finite")


def test_watch_does_not_replay_a_step_whose_batch_was_overwritten(nantrace: NanTrace) -> None:
    path, _ = nantrace.write("modes.py", MODES)
    code, doc, _ = nantrace.json("--watch", str(path), "--", "overwrite", "4")
    summary = doc["watch"]
    assert (summary["detected"], summary["detected_step"]) == ("loss", 4)
    assert (summary["replayed_step"], summary["exact"]) == (None, None)
    assert summary["reason"] == "the step's inputs were overwritten in place after the model read them"
    assert summary["traced_from_step"] == 5
    # The infinite loss went into the parameters in step 4: step 5 reads them.
    assert code == 1
    assert doc["first"]["step"] == 5
    assert doc["first"]["cause"] == "input"


def test_watch_with_keep_going_is_a_usage_error_naming_both(nantrace: NanTrace) -> None:
    path, _ = nantrace.write("ok.py", "x = 1\n")
    result = nantrace.run(str(path), "--watch", "--keep-going")
    assert (result.exit_code, result.stdout) == (2, "")
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ")
    assert "--watch" in lines[0]
    assert "--keep-going" in lines[0]


FACTORY = """
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))
        self.python_calls = 0

    def forward(self, x):
        self.calls += 1
        self.python_calls += 1
        h = self.fc(x)
        if int(self.calls) == 4:
            h = h * 1e38  # late overflow
        return h * 10.0


class SideEffect(Net):
    def forward(self, x):
        self.python_calls += 1
        h = self.fc(x)
        if self.python_calls == 4:
            h = h * 1e38
        return h * 10.0


def factory():
    torch.manual_seed(0)
    return Net(), torch.randn(3, 4)


def side_effect():
    torch.manual_seed(0)
    return SideEffect(), torch.randn(3, 4)
"""


def test_watch_factory_finds_the_fourth_step(nantrace: NanTrace) -> None:
    path, text = nantrace.write("factory.py", FACTORY)
    code, doc, _ = nantrace.json("--watch", f"{path}:factory", "--steps", "6")
    assert code == 1
    first = doc["first"]
    # 1e38 * 10 overflows float32 (max 3.4e38): born at "h * 10.0", the line after the marker.
    assert (first["kind"], first["op"], first["module"], first["step"]) == ("inf", "aten.mul.Tensor", "", 4)
    assert first["location"]["line"] == line_of(text, "late overflow") + 1
    assert first["cause"] == "range_overflow"
    # The counter is a buffer: put back before the replay, which then sees call 4 again.
    assert (doc["watch"]["replayed_step"], doc["watch"]["exact"]) == (4, True)
    assert doc["steps"] == 4


def test_watch_factory_with_a_side_effect_says_the_replay_came_out_finite(nantrace: NanTrace) -> None:
    path, _ = nantrace.write("factory.py", FACTORY)
    code, doc, _ = nantrace.json("--watch", f"{path}:side_effect", "--steps", "6")
    # A Python counter is no buffer: the replay is call 5, which does not overflow, so the replay is not the step.
    summary = doc["watch"]
    assert (summary["detected"], summary["detected_step"], summary["replayed_step"]) == ("loss", 4, 4)
    assert summary["exact"] is False
    assert summary["reason"].startswith("the replayed model output was finite while the gradient")
    assert "side effect" in summary["reason"]
    # Steps 5 and 6 were traced fully instead; the infinite gradients of step 4 had gone into the weights.
    assert summary["traced_from_step"] == 5
    assert code == 1
    assert (doc["first"]["step"], doc["first"]["cause"], doc["first"]["module"]) == (5, "input", "fc")


def test_trace_api_watch_true() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with dtypecheck.trace(model, watch=True) as handle:
        for step in range(1, 6):
            x = torch.randn(8, 4)
            if step == 3:
                x[0, 0] = float("nan")  # data
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    report = handle.report
    assert report.status == "nonfinite"
    assert report.first is not None
    assert report.first.step == 3
    assert report.first.cause == "input"
    assert report.first.module == "0"
    assert report.watch is not None
    # A full trace names the line that wrote the NaN into the batch; the replay re-runs the model call only.
    assert (report.watch.detected, report.watch.replayed_step, report.watch.exact) == ("loss", 3, False)
    assert report.watch.reason is not None
    assert report.watch.reason.startswith("the model's inputs were already non-finite when it was called")
    # Without on_found the block runs to its end, as trace() does: five steps were completed.
    assert report.steps == 5
    with pytest.raises(ValueError, match="watch=True and keep_going=True"):  # noqa: SIM117
        with dtypecheck.trace(watch=True, keep_going=True):
            pass


SCALER = """
import sys
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x, boost):
        return self.head(self.fc(x) * boost)  # boost


torch.manual_seed(0)
net = Net()
optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
mode = sys.argv[1]
for step in range(1, 9):
    x = torch.randn(4, 8)
    boost = 1e5 if (mode == "collapse" and step >= 4) or (mode == "skip" and step == 4) else 1.0
    with torch.autocast("cpu", dtype=torch.float16):
        loss = net(x, boost).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
print("done")
"""


def test_watch_leaves_gradscaler_skipped_steps_as_notes(nantrace: NanTrace) -> None:
    path, _ = nantrace.write("scaler.py", SCALER)
    code, doc, _ = nantrace.json("--watch", str(path), "--", "skip")
    assert code == 0
    assert (doc["status"], doc["first"], doc["steps"]) == ("clean", None, 8)
    # fp16 overflows at step 4 (1e5 * 2**16 scaled gradients): GradScaler skips it and halves its scale.
    assert [(s["step"], s["scale_before"], s["scale_after"]) for s in doc["skipped_steps"]] == [(4, 65536.0, 32768.0)]
    assert (doc["watch"]["detected"], doc["watch"]["replayed_step"]) == (None, None)
    assert doc["notes"][-1].endswith("none non-finite; GradScaler skipped 1 (notes)")


def test_watch_replays_the_step_where_the_scale_collapses(nantrace: NanTrace) -> None:
    path, text = nantrace.write("scaler.py", SCALER)
    args = ("--max-skipped-steps", "3")
    code_full, full, _ = nantrace.json(*args, str(path), "--", "collapse")
    code, doc, _ = nantrace.json("--watch", *args, str(path), "--", "collapse")
    assert (code_full, code) == (1, 1)
    assert {k: doc["first"][k] for k in SAME} == {k: full["first"][k] for k in SAME}
    assert doc["first"]["location"] == full["first"]["location"]
    assert doc["first"]["location"]["line"] == line_of(text, "boost")
    assert (doc["first"]["step"], doc["first"]["consequence"]) == (6, "scale_collapse")
    assert doc["scale_collapse"] == full["scale_collapse"]
    assert (doc["scale_collapse"]["first_step"], doc["scale_collapse"]["last_step"]) == (4, 6)
    fields = ("step", "scale_before", "scale_after", "kind", "level")
    assert [{k: n[k] for k in fields} for n in doc["skipped_steps"]] == [
        {k: n[k] for k in fields} for n in full["skipped_steps"]
    ]
    # Skipped steps are not replayed: their producer is unknown in watch mode (a full trace names it).
    assert [n["first"] for n in doc["skipped_steps"]] == [None, None, None]
    assert doc["steps"] == full["steps"] == 6
    assert (doc["watch"]["detected"], doc["watch"]["replayed_step"]) == ("scale_collapse", 6)


def test_trace_api_watch_true_fills_the_report_when_the_block_raises() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = None
    with pytest.raises(KeyError, match="user's own"):  # noqa: PT012, SIM117  (two steps run, then it raises)
        with dtypecheck.trace(model, watch=True) as handle:
            for _ in range(2):
                model(torch.ones(3, 2)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
            raise KeyError("user's own")
    assert handle is not None
    report = handle.report
    assert (report.status, report.steps) == ("clean", 2)
    assert report.watch is not None
    assert report.watch.steps_checked == 2


def test_without_the_optimizer_snapshot_a_nan_born_in_the_update_is_said_not_replayable() -> None:
    from dtypecheck.nantrace.watch import Watcher

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    watcher = Watcher(model=model, optimizer_snapshot=False)
    with watcher:
        for step in range(1, 6):
            loss = model(torch.randn(8, 4)).pow(2).mean() * (1e30 if step == 3 else 1.0)
            loss.backward()
            optimizer.param_groups[0]["lr"] = 1e10 if step == 3 else 1e-2  # 1e10 * ~1e30 overflows the update
            optimizer.step()
            optimizer.zero_grad()
    summary = watcher.report().watch
    assert summary is not None
    assert (summary.detected, summary.detected_step, summary.replayed_step) == ("optimizer_step", 3, None)
    assert summary.reason == "the NaN was born in the optimizer step, and the optimizer snapshot is off"
    assert summary.traced_from_step == 4
    assert summary.optimizer_snapshot is False
    # Only RNG state and the output's gradient were held: 5056 + 8 float32 bytes.
    assert summary.snapshot_bytes == torch.get_rng_state().nbytes + 8 * 4


UPDATE_OVERFLOW = """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(1, 6):
    loss = model(torch.randn(8, 4)).pow(2).mean() * (1e30 if step == 3 else 1.0)
    loss.backward()
    optimizer.param_groups[0]["lr"] = 1e10 if step == 3 else 1e-2  # 1e10 * ~1e30 overflows the update
    optimizer.step()
    optimizer.zero_grad()
"""


def test_no_optimizer_snapshot_on_the_command_line(nantrace: NanTrace) -> None:
    path, _ = nantrace.write("update.py", UPDATE_OVERFLOW)
    code, doc, _ = nantrace.json("--watch", "--no-optimizer-snapshot", str(path))
    assert code == 1
    summary = doc["watch"]
    assert summary["optimizer_snapshot"] is False
    assert (summary["detected"], summary["detected_step"], summary["replayed_step"]) == ("optimizer_step", 3, None)
    assert summary["reason"] == "the NaN was born in the optimizer step, and the optimizer snapshot is off"
    # only the RNG state and the model output's gradient (8 float32 values) were held
    assert summary["snapshot_bytes"] == torch.get_rng_state().nbytes + 8 * 4
    with_copy = nantrace.json("--watch", str(path))[1]["watch"]
    assert (with_copy["optimizer_snapshot"], with_copy["replayed_step"]) == (True, 3)
    refused = nantrace.run(str(path), "--no-optimizer-snapshot")
    assert (refused.exit_code, refused.stdout) == (2, "")
    assert refused.stderr.startswith("error: --no-optimizer-snapshot applies to --watch")


EMA = """
import copy
import sys
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
ema = copy.deepcopy(model)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
bad = int(sys.argv[1])
for step in range(1, 13):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            decay = 0.9 if step != bad else float("nan")
            e.mul_(decay).add_(p, alpha=1 - decay)  # ema
print("done")
"""


def test_watch_finds_a_nan_written_into_an_ema_copy_between_steps(nantrace: NanTrace) -> None:
    """Issue 30.3: the EMA copy is outside the model calls, the loss and the update; watch used to exit 0."""
    path, text = nantrace.write("ema.py", EMA)
    full, watched = _both(nantrace, path, "7")
    first = full["first"]
    assert (first["kind"], first["op"], first["location"]["line"]) == ("nan", "aten.mul_.Tensor", line_of(text, "ema"))
    assert first["step"] == 8  # written after step 7's update: the tracer's step 8 has begun
    summary = watched["watch"]
    assert (summary["detected"], summary["detected_step"], summary["replayed_step"]) == ("held_tensors", 8, None)
    names = ["Sequential.0.weight", "Sequential.0.bias", "Sequential.2.weight", "Sequential.2.bias"]
    assert summary["held_nonfinite"] == names
    assert (summary["exact"], summary["traced_from_step"]) == (None, 8)
    assert summary["reason"].startswith(f"{', '.join(names)} went non-finite between step 7's update and step 8's")
    assert watched["status"] == "nonfinite"
    # Traced fully from step 8 on, the next EMA update names the same op and line (reading the NaN already held).
    assert (watched["first"]["op"], watched["first"]["location"]) == (first["op"], first["location"])
    assert watched["notes"][0].startswith("watch mode: a tensor the run keeps went non-finite before step 8;")


def test_watch_passes_a_clean_ema_run_and_says_what_it_did_not_watch(nantrace: NanTrace) -> None:
    path, _ = nantrace.write("ema.py", EMA)
    code, doc, _ = nantrace.json("--watch", str(path), "--", "0")
    assert (code, doc["status"], doc["ops"], doc["watch"]["detected"]) == (0, "clean", 0, None)
    assert doc["notes"][0] == (
        "watch mode: tensors kept outside every module and optimizer (a plain list or dict of tensors), and modules "
        "made before watching began other than the model, are not watched"
    )


FLAKY_REPLAY = """
import torch


class Flaky(torch.optim.Optimizer):
    calls = 0

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        Flaky.calls += 1
        if Flaky.calls == 8:  # the 7th step's update a second time: only a replay calls it
            raise OverflowError("(34, 'Numerical result out of range')")
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad, alpha=-group["lr"])


torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = Flaky(model.parameters(), lr=1e-2)
for step in range(1, 10):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    if step == 7:
        loss = loss * 1e30
        optimizer.param_groups[0]["lr"] = 1e10
    loss.backward()
    optimizer.step()  # update
    optimizer.zero_grad()
    optimizer.param_groups[0]["lr"] = 1e-2
print("done", Flaky.calls)
"""


def test_a_replay_that_raises_never_breaks_the_run(nantrace: NanTrace) -> None:
    """Issue 30.4: a replayed Adam update once raised OverflowError (exit 3, no report) where the script ran on."""
    path, _ = nantrace.write("flaky.py", FLAKY_REPLAY)
    code, doc, stderr = nantrace.json("--watch", str(path))
    assert code == 1, stderr
    summary = doc["watch"]
    assert (summary["detected"], summary["detected_step"], summary["exact"]) == ("optimizer_step", 7, False)
    assert summary["reason"] == "the replayed update raised OverflowError: (34, 'Numerical result out of range')"
    assert summary["traced_from_step"] == 8
    assert doc["status"] == "nonfinite"


ADAM_FP16 = """
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).half()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8, foreach=False)  # eps is 0 in float16
for step in range(1, 6):
    loss = model(torch.randn(16, 8).half()).float().pow(2).mean()
    loss.backward()
    optimizer.step()  # update
    optimizer.zero_grad()
print("done")
"""


def test_watch_replays_a_first_adam_update_from_the_state_it_began_with(nantrace: NanTrace) -> None:
    """Issue 30.4: the check after Adam's first update built a new snapshot layout (its state had grown), and the
    replay put back buffers never filled: a NaN "input" in ``lerp_`` (or ``mul_``, ``sqrt``, an OverflowError in
    ``beta1 ** step``, from run to run) where the full trace names the inf born in ``addcdiv_`` (eps 1e-8 is 0 in
    float16: a zero second moment divides by zero)."""
    path, text = nantrace.write("adam16.py", ADAM_FP16)
    full, watched = _both(nantrace, path)
    first, replayed = full["first"], watched["first"]
    assert (first["kind"], first["op"], first["module"], first["step"]) == ("inf", "aten.addcdiv_.default", "0", 1)
    assert (first["consequence"], first["location"]["line"]) == ("parameter", line_of(text, "update"))
    assert {k: replayed[k] for k in SAME} == {k: first[k] for k in SAME}
    assert replayed["location"] == first["location"]
    summary = watched["watch"]
    assert (summary["detected"], summary["replayed_step"], summary["exact"]) == ("optimizer_step", 1, True)


LM_MASKED = """
import sys
import torch


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.head = torch.nn.Linear(8, 10)

    def forward(self, ids, mask):
        h = self.emb(ids)
        scores = (h @ h.t()).masked_fill(mask, float("-inf"))
        attn = torch.softmax(scores, -1)  # softmax
        return self.head(attn @ h)


torch.manual_seed(0)
model = LM()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
bad = int(sys.argv[1])
for step in range(1, 10):
    ids = torch.randint(0, 10, (6,))
    targets = torch.randint(0, 10, (6,))
    mask = torch.zeros(6, 6, dtype=torch.bool)
    if step == bad:
        mask[0] = True  # every key of position 0 masked: softmax 0/0
        targets[0] = -100  # and the loss ignores position 0
    loss = torch.nn.functional.cross_entropy(model(ids, mask), targets, ignore_index=-100)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("done")
"""


def test_watch_says_a_nan_the_loss_ignored_was_written_into_a_parameter(nantrace: NanTrace) -> None:
    """Issue 30.4: a fully masked position (softmax 0/0) that the loss ignores leaves the loss finite; its NaN goes
    on through backward into the weights. The replay runs backward from the model's outputs, which watch mode
    used to take for the loss ("reached the loss" where the full trace says "written into a parameter")."""
    path, text = nantrace.write("lm.py", LM_MASKED)
    full, watched = _both(nantrace, path, "6")
    first, replayed = full["first"], watched["first"]
    assert (first["kind"], first["op"], first["step"], first["consequence"]) == (
        "nan",
        "aten._softmax.default",
        6,
        "parameter",
    )
    assert first["location"]["line"] == line_of(text, "softmax")
    assert {k: replayed[k] for k in SAME} == {k: first[k] for k in SAME}
    assert replayed["location"] == first["location"]
    assert (watched["watch"]["detected"], watched["watch"]["exact"]) == ("gradients", True)


LIBRARY_MODULE = """
import sys
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
torch.nn.init.constant_(model[0].weight, 1.0)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
bad = int(sys.argv[1])
for step in range(1, 8):
    x = (torch.rand(6, 4) + 1.0) * (1e38 if step == bad else 1.0)
    out = model(x)  # call
    loss = out.pow(2).mean()
    loss.backward()
    optimizer.step()  # update
    optimizer.zero_grad()
print("done")
"""


def test_an_overflow_inside_a_library_module_is_named_at_the_line_that_called_the_model(nantrace: NanTrace) -> None:
    """Issue 30.4: torch's own modules have no line of the user's below the model call; the replay, run from the
    optimizer's hook, was named at the line that stepped the optimizer (``# update``) where a full trace names
    the model's call (``# call``). Four inputs in [1e38, 2e38) times weights near 1 sum past float32's 3.4e38 in
    every one of the 6 x 8 outputs of ``addmm`` in module ``0``."""
    path, text = nantrace.write("library.py", LIBRARY_MODULE)
    full, watched = _both(nantrace, path, "5")
    first, replayed = full["first"], watched["first"]
    assert (first["kind"], first["op"], first["module"], first["step"]) == ("inf", "aten.addmm.default", "0", 5)
    assert (first["counts"]["posinf"], first["cause"]) == (6 * 8, "range_overflow")
    assert first["location"]["line"] == line_of(text, "call")
    assert {k: replayed[k] for k in SAME} == {k: first[k] for k in SAME}
    assert replayed["location"] == first["location"]
    assert (watched["watch"]["detected"], watched["watch"]["exact"]) == ("loss", True)


def test_the_first_adam_update_replays_to_the_same_answer_every_time() -> None:
    """Issue 30.4: identical runs of the fp16 Adam case named ``mul_`` in 3 of 6, ``sqrt`` in 1, and one raised
    OverflowError: the replay read buffers a new snapshot layout had left unfilled. Six identical runs now give one
    answer, the full trace's ``addcdiv_`` (eps 1e-8 is 0 in float16: a zero second moment divides by zero)."""
    answers = set()
    for _ in range(6):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).half()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8, foreach=False)
        with dtypecheck.trace(model, watch=True) as handle:
            for _step in range(3):
                model(torch.randn(16, 8).half()).float().pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
        first, summary = handle.report.first, handle.report.watch
        assert first is not None
        assert summary is not None
        answers.add((first.kind, first.op, first.module, first.step, first.cause, summary.exact, summary.reason))
    # One answer (its cause unknown: an in-place update cannot be re-run in float64 after it wrote its input).
    assert answers == {("inf", "aten.addcdiv_.default", "0", 1, None, True, None)}
