"""nan-trace judges a non-finite value by what became of it: healthy fp16 scripts (GradScaler's skipped steps,
values torch masks itself) exit 0 with notes; a value that reaches the loss, a parameter or the output fails."""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests._forks import run_each_forked
from tests.nantrace._scripts import NanTrace, line_of

# An HF-style model (config object, embedding-free MLP blocks with LayerNorm, a loss computed inside forward that
# returns a dict) trained the way the AMP recipe says: fp16 autocast, GradScaler, AdamW, a linear LR schedule.
AMP_LOOP = """
import json
import sys

import torch


class Config:
    hidden_size = 32
    num_layers = 2


class Block(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.norm = torch.nn.LayerNorm(config.hidden_size)
        self.dense = torch.nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden):
        return hidden + torch.nn.functional.gelu(self.dense(self.norm(hidden)))


class TinyRegressor(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.head = torch.nn.Linear(config.hidden_size, 1)

    def forward(self, inputs, labels=None):
        hidden = inputs
        for layer in self.layers:
            hidden = layer(hidden)
        logits = self.head(hidden)
        loss = None if labels is None else torch.nn.functional.mse_loss(logits.float(), labels)
        return {"loss": loss, "logits": logits}


torch.manual_seed(0)
model = TinyRegressor(Config())
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / 100)
if sys.argv[1] == "default":
    scaler = torch.amp.GradScaler("cpu")  # init_scale 2**16, backoff 0.5, growth every 2000 steps
else:
    scaler = torch.amp.GradScaler("cpu", init_scale=float(sys.argv[1]))
for step in range(12):
    inputs, labels = torch.randn(8, 32), torch.randn(8, 1)
    with torch.autocast("cpu", dtype=torch.float16):
        outputs = model(inputs, labels=labels)
    scaler.scale(outputs["loss"]).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    before = scaler.get_scale()
    scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if scaler.get_scale() < before:
        print("SKIPPED " + json.dumps([step + 1, before, scaler.get_scale()]), file=sys.stderr)
"""


AMP_NAN = AMP_LOOP.replace(
    "    inputs, labels = torch.randn(8, 32), torch.randn(8, 1)\n",
    "    inputs, labels = torch.randn(8, 32), torch.randn(8, 1)\n"
    "    if step >= 5:\n"
    "        inputs = inputs.log()  # log of negatives\n",
)
"""``AMP_LOOP`` whose inputs are NaN from its 6th step on."""

PLAIN_RUNS = {"amp_loop.py": AMP_LOOP, "amp_nan.py": AMP_NAN}
"""The scripts whose plain runs the tests below compare with: file name -> text."""


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], list[list[float]]]:
    """Each script of ``PLAIN_RUNS`` run as plain Python, outside dtypecheck, with the scale arguments the tests
    give it: (file name, argument) -> the steps its own GradScaler shrank its scale on. Each run is a process of its
    own, forked from one fresh interpreter that imported torch (``tests/_forks.py``): a process per run spent most of
    its ~3.5 CPU s importing torch."""
    folder = tmp_path_factory.mktemp("plain")
    runs = [("amp_loop.py", "default"), ("amp_loop.py", "16777216"), ("amp_nan.py", "default")]
    for name, text in PLAIN_RUNS.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    run_as_a_script = "import runpy, sys\nrunpy.run_path(sys.argv[0], run_name='__main__')"
    checks = [(run_as_a_script, [str(folder / name), argument]) for name, argument in runs]
    found = {}
    for run, done in zip(runs, run_each_forked("import torch", checks, timeout=300), strict=True):
        assert done.returncode == 0, (run, done.stderr)
        found[run] = [
            json.loads(line.removeprefix("SKIPPED ")) for line in done.stderr.splitlines() if line.startswith("SKIPPED")
        ]
    return found


@pytest.mark.parametrize("init_scale", ["default", "16777216"])
def test_gradscaler_skipped_steps_are_notes_with_the_scale_before_and_after(
    nantrace: NanTrace, init_scale: str, plain_runs: dict[tuple[str, str], list[list[float]]]
) -> None:
    script, _ = nantrace.write("amp_loop.py", AMP_LOOP)
    expected = plain_runs["amp_loop.py", init_scale]
    # The default scale overflows fp16 gradients in the first steps; 2**24 halves its way down over many more.
    assert 1 <= len(expected) <= 3 if init_scale == "default" else len(expected) >= 6
    code, doc, _ = nantrace.json(str(script), "--", init_scale)
    assert code == 0
    assert doc["status"] == "clean"
    assert doc["first"] is None
    assert doc["events"] == []
    assert doc["scale_collapse"] is None
    assert doc["steps"] == 12
    # GradScaler's scaled gradients near fp16's max, and its float64 scalar maths, are by design: no warnings.
    assert (doc["warnings"], doc["promotions"]) == ([], [])
    notes = doc["skipped_steps"]
    assert [[n["step"], n["scale_before"], n["scale_after"]] for n in notes] == expected
    for note in notes:
        assert (note["kind"], note["level"]) == ("skipped_step", "ok")
        assert note["scale_after"] == note["scale_before"] / 2  # GradScaler's default backoff_factor
        first = note["first"]
        assert (first["kind"], first["phase"], first["level"], first["consequence"]) == (
            "inf",
            "backward",
            "ok",
            "skipped_step",
        )
        assert first["step"] == note["step"]
    assert all(e["level"] == "ok" for e in doc["handled"])
    assert {e["consequence"] for e in doc["handled"]} == {"skipped_step"}


def _first_streak(skipped: list[list[float]], length: int) -> list[list[float]]:
    """The first ``length`` consecutive skipped steps of a plain run."""
    for start in range(len(skipped) - length + 1):
        run = skipped[start : start + length]
        if all(b[0] == a[0] + 1 for a, b in itertools.pairwise(run)):
            return run
    raise AssertionError(f"no {length} consecutive skipped steps in {skipped}")


def test_a_nan_every_step_collapses_the_scale_and_fails(
    nantrace: NanTrace, plain_runs: dict[tuple[str, str], list[list[float]]]
) -> None:
    script, text = nantrace.write("amp_nan.py", AMP_NAN)
    streak = _first_streak(plain_runs["amp_nan.py", "default"], 3)
    assert streak[-1][0] >= 6  # the natural skips of the first steps are over before the NaNs begin
    code, doc, _ = nantrace.json(str(script), "--max-skipped-steps", "3", "--", "default")
    assert code == 1
    assert doc["status"] == "nonfinite"
    collapse = doc["scale_collapse"]
    assert (collapse["steps"], collapse["first_step"], collapse["last_step"]) == (3, streak[0][0], streak[-1][0])
    assert (collapse["scale_before"], collapse["scale_after"], collapse["limit"]) == (streak[0][1], streak[-1][2], 3)
    assert collapse["scale_after"] == collapse["scale_before"] / 8
    assert (collapse["kind"], collapse["level"]) == ("scale_collapse", "fail")
    first = doc["first"]
    assert (first["kind"], first["op"], first["phase"], first["module"]) == ("nan", "aten.log.default", "other", None)
    assert first["location"]["line"] == line_of(text, "log of negatives")
    assert (first["step"], first["level"], first["consequence"]) == (streak[-1][0], "fail", "scale_collapse")
    assert [n["step"] for n in doc["skipped_steps"]][-3:] == [s[0] for s in streak]


def test_max_skipped_steps_comes_from_the_project_config(
    nantrace: NanTrace,
    cli: Any,
    tmp_path: Path,
    monkeypatch: Any,
    plain_runs: dict[tuple[str, str], list[list[float]]],
) -> None:
    script, _ = nantrace.write("amp_loop.py", AMP_LOOP)
    skipped = plain_runs["amp_loop.py", "16777216"]
    longest = max(n for n in range(1, len(skipped) + 1) if _has_streak(skipped, n))
    (tmp_path / "pyproject.toml").write_text(
        f"[tool.dtypecheck.nan-trace]\nmax-skipped-steps = {longest}\n", encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)
    code, doc, _ = nantrace.json(str(script), "--", "16777216")
    assert code == 1  # 2**24 halves on `longest` steps in a row before its first good step
    assert doc["scale_collapse"]["steps"] == longest
    code, doc, _ = nantrace.json(str(script), "--max-skipped-steps", str(longest + 1), "--", "16777216")
    assert (code, doc["scale_collapse"]) == (0, None)
    (tmp_path / "pyproject.toml").write_text("[tool.dtypecheck.nan-trace]\nmax-skipped-steps = 0\n", encoding="utf-8")
    result = cli("nan-trace", str(script))
    assert result.exit_code == 2
    assert "max-skipped-steps: expected a positive integer, got 0" in result.stderr


def _has_streak(skipped: list[list[float]], length: int) -> bool:
    try:
        _first_streak(skipped, length)
    except AssertionError:
        return False
    return True


MASKED = """
import torch


class Normalised(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.direction = torch.nn.Parameter(torch.zeros(4))
        self.fc = torch.nn.Linear(4, 1)

    def forward(self, x):
        penalty = self.direction.norm()  # norm of zeros
        safe = torch.where(x > 0, torch.log(x), torch.zeros_like(x))  # where-masked log
        return self.fc(safe).mean() + penalty


torch.manual_seed(0)
model = Normalised()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(8, 4))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("direction", model.direction.tolist())
"""


def test_values_torch_masks_itself_are_notes(nantrace: NanTrace) -> None:
    script, text = nantrace.write("masked.py", MASKED)
    code, doc, stderr = nantrace.json(str(script))
    assert code == 0
    assert doc["status"] == "clean"
    assert "direction [0.0, 0.0, 0.0, 0.0]" in stderr  # the weights stayed finite (and zero)
    handled = [(e["kind"], e["op"], e["phase"], e["module"], e["location"]["line"], e["step"]) for e in doc["handled"]]
    # Each step: log of the negative half of the batch (forward, masked by where), then the norm's backward
    # dividing 0 by 0 (masked by torch's own masked_fill_).
    norm_line, log_line = line_of(text, "norm of zeros"), line_of(text, "where-masked log")
    assert handled == [
        e
        for step in (1, 2, 3)
        for e in (
            ("nan", "aten.log.default", "forward", "", log_line, step),
            ("nan", "aten.div.Tensor", "backward", "", norm_line, step),
        )
    ]
    assert {(e["level"], e["consequence"]) for e in doc["handled"]} == {("ok", "masked")}
    div = doc["handled"][1]
    assert div["grad_fn"] == "LinalgVectorNormBackward0"
    assert div["cause"] == "invalid_math"
    assert div["counts"]["nan"] == 4


UNMASKED_NORM = """
import torch

direction = torch.zeros(4, requires_grad=True)
unit = direction / direction.norm()  # 0 / 0
loss = unit.sum()
loss.backward()
"""


def test_the_same_zero_norm_divided_by_the_user_fails(nantrace: NanTrace) -> None:
    first, _, text = nantrace.failing("unmasked.py", UNMASKED_NORM)
    assert (first["kind"], first["op"], first["phase"], first["consequence"]) == (
        "nan",
        "aten.div.Tensor",
        "forward",
        "loss",
    )
    assert first["location"]["line"] == line_of(text, "0 / 0")


# Three loops of different shapes, each with a NaN in the data of its third batch.
DATA_PLAIN = """
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    optimizer.zero_grad()
    batch = torch.randn(6, 4)
    if step == 2:
        batch[0, 1] = float("nan")  # bad sample
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
"""

DATA_LOADER = """
import numpy as np
import torch


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 30

    def __getitem__(self, index):
        row = np.random.default_rng(index).standard_normal(4).astype(np.float32)
        if index == 13:
            row[1] = np.nan
        return torch.from_numpy(row), torch.tensor([1.0])  # sample


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, features):
        return self.head(torch.relu(self.encoder(features)))


def train():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Samples(), batch_size=6)  # batch 3 holds samples 12..17
    for step, (features, target) in enumerate(loader, start=1):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(features).float(), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    train()
"""

DATA_NO_OPTIMIZER = """
import torch

torch.manual_seed(0)
weight = torch.randn(4, 1, requires_grad=True)
batches = [torch.randn(6, 4) for _ in range(5)]
batches[2][3, 0] = float("nan")  # bad sample
for batch in batches:
    loss = (batch @ weight).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        weight -= 0.01 * weight.grad
        weight.grad = None
"""


def test_a_nan_in_the_third_batch_is_step_3_whatever_the_loop_looks_like(nantrace: NanTrace) -> None:
    script, text = nantrace.write("plain.py", DATA_PLAIN)
    code, doc, _ = nantrace.json(str(script))
    assert code == 1
    first = doc["first"]
    assert (first["step"], first["op"], first["location"]["line"]) == (
        3,
        "aten.lift_fresh.default",
        line_of(text, "bad sample"),
    )
    assert (first["consequence"], first["cause"]) == ("loss", "input")
    assert doc["steps"] == 2  # two optimizer steps completed before the run was stopped

    script, text = nantrace.write("loader.py", DATA_LOADER)
    code, doc, _ = nantrace.json(str(script))
    assert code == 1
    first = doc["first"]
    # from_numpy becomes a tensor (lift_fresh) in the dataset's __getitem__, called by the loader for batch 3.
    assert (first["step"], first["op"], first["module"]) == (3, "aten.lift_fresh.default", None)
    assert first["location"]["line"] == line_of(text, "sample")
    assert (first["cause"], first["consequence"]) == ("input", "loss")

    first, doc, text = nantrace.failing("no_optimizer.py", DATA_NO_OPTIMIZER)
    assert (first["step"], first["op"], first["consequence"]) == (1, "aten.lift_fresh.default", "loss")
    assert first["location"]["line"] == line_of(text, "bad sample")  # written before the loop: step 1
    assert doc["steps"] == 2  # two backward passes (steps) completed; the third loss is NaN


def test_a_real_nan_under_a_gradscaler_fails_at_its_line_once_the_scale_collapses(
    nantrace: NanTrace, tmp_path: Path
) -> None:
    script, text = nantrace.write(
        "amp_real.py",
        AMP_LOOP.replace(
            "        return hidden + torch.nn.functional.gelu(self.dense(self.norm(hidden)))\n",
            "        return hidden + torch.sqrt(self.dense(self.norm(hidden)))  # sqrt of negatives\n",
        ),
    )
    code, doc, _ = nantrace.json(str(script), "--", "default")
    # With its GradScaler this is a skipped step after another; below the default limit the run is clean...
    assert code == 0
    assert len(doc["skipped_steps"]) == 12
    # ...until the limit is reached, and the first producer is named.
    code, doc, _ = nantrace.json(str(script), "--max-skipped-steps", "2", "--", "default")
    assert code == 1
    first = doc["first"]
    assert (first["kind"], first["op"], first["phase"], first["module"]) == (
        "nan",
        "aten.sqrt.default",
        "forward",
        "layers.0",
    )
    assert first["location"]["line"] == line_of(text, "sqrt of negatives")
    assert (first["step"], first["consequence"]) == (2, "scale_collapse")


def test_nan_written_into_a_parameter_fails_as_a_parameter(nantrace: NanTrace) -> None:
    from tests.nantrace.test_scripts import OPTIMIZER

    script, _ = nantrace.write("optimizer.py", OPTIMIZER)
    code, doc, _ = nantrace.json(str(script))
    assert code == 1
    assert (doc["first"]["consequence"], doc["first"]["level"]) == ("parameter", "fail")


DROPPED = """
import torch


def log_metric(values):
    return torch.log(values - 10.0).mean().item()  # metric


model = torch.nn.Linear(3, 1)
for step in range(2):
    batch = torch.randn(4, 3)
    print("metric", log_metric(batch))
    model(batch).sum().backward()
"""


def test_a_value_held_at_the_end_or_dropped_unmasked_fails_and_says_which(nantrace: NanTrace) -> None:
    from tests.nantrace.test_scripts import INPLACE

    script, text = nantrace.write("inplace.py", INPLACE)
    code, doc, _ = nantrace.json(str(script))
    assert code == 1
    # mul_'s infinities made the NaN (h - h) that the script still holds in `out` when it ends.
    assert (doc["first"]["op"], doc["first"]["consequence"]) == ("aten.mul_.Tensor", "output")
    script, text = nantrace.write("dropped.py", DROPPED)
    code, doc, stderr = nantrace.json(str(script))
    assert code == 1
    first = doc["first"]
    # The NaN metric was read out and dropped: nothing masked it.
    assert (first["op"], first["consequence"], first["step"]) == ("aten.log.default", "unmasked", 1)
    assert first["location"]["line"] == line_of(text, "metric")
    assert "metric nan" in stderr


def test_an_infinite_constant_overwritten_before_the_flush_is_the_users_own() -> None:
    """A quantisation observer's running min starts as ``torch.tensor(inf)`` and is overwritten by the first batch's
    minimum (issue 30.2): lift_fresh hands the constant through itself, so by the flush its input reads as
    written since; it is still what the user wrote, not a value born in tracing. A NaN made from it still fails."""
    import torch

    import dtypecheck

    with dtypecheck.trace() as handle:
        running_min = torch.tensor(float("inf"))
        x = torch.tensor([3.0, -2.0, 5.0])
        if running_min == float("inf"):
            running_min.copy_(x.min())
    assert handle.report.status == "clean"
    assert running_min.item() == -2.0
    with dtypecheck.trace() as handle:
        running_min = torch.tensor(float("inf"))
        spread = running_min - running_min  # inf - inf: born here
    assert handle.report.status == "nonfinite"
    assert handle.report.first is not None
    assert (handle.report.first.kind, handle.report.first.op) == ("nan", "aten.sub.Tensor")
    assert torch.isnan(spread).item()
