"""``nantrace.harness``: what a traced and a watched run share, checked on the helpers themselves."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dtypecheck.nantrace.harness import FactoryTraining, as_main, default_loss, run_main
from dtypecheck.nantrace.options import RunSettings
from dtypecheck.nantrace.runner import run_script

MOVES = """
import os
import sys

print("argv", sys.argv[1:], "first on path", sys.path[0])
os.chdir(os.path.dirname(os.__file__))
"""


def test_as_main_gives_the_script_its_argv_and_path_and_puts_back_argv_path_and_directory(tmp_path: Path) -> None:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text(MOVES, encoding="utf-8")
    argv, path, cwd = sys.argv[:], sys.path[:], Path.cwd()
    printed = io.StringIO()
    with as_main(script, ["--lr", "1"], RunSettings(), stdout=printed):
        run_main(script)
    assert printed.getvalue() == f"argv ['--lr', '1'] first on path {script.parent.resolve()}\n"
    assert (sys.argv, sys.path, Path.cwd()) == (argv, path, cwd)


def test_a_watched_script_that_changes_directory_leaves_the_callers_in_place(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(MOVES, encoding="utf-8")
    cwd = Path.cwd()
    report = run_script(script, [], RunSettings(watch=True), stdout=io.StringIO())
    assert (report.status, Path.cwd()) == ("clean", cwd)


def test_the_default_loss_is_the_mean_square_of_the_first_output_in_float32() -> None:
    values = np.array([[1.5, -2.0], [3.0, 0.25]], dtype=np.float16)
    first = torch.from_numpy(values)
    loss = default_loss(torch.ones(2, 2))({"logits": (first, torch.ones(3))})  # float inputs: MSE against zeros
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(float(np.mean(values.astype(np.float64) ** 2)))
    scalar = torch.tensor(7.0, requires_grad=True)
    assert default_loss(torch.ones(2))([scalar]).item() == 7.0  # a scalar output is the model's own loss


def test_the_default_loss_of_token_ids_and_logits_is_estimate_memorys_cross_entropy() -> None:
    ids = torch.tensor([[1, 3], [2, 0]])
    logits64 = np.array([[[0.5, 1.0, -1.0, 2.0], [0.0, 0.0, 1.0, -0.5]], [[1.0, 2.0, 3.0, 4.0], [0.1, 0.2, 0.3, 0.4]]])
    logits = torch.tensor(logits64, dtype=torch.float16)
    loss = default_loss({"input_ids": ids})(logits)
    # numpy: log-softmax over the last dimension of the float16 logits widened to float64, at the batch's own ids
    wide = logits.double().numpy()
    log_softmax = wide - np.log(np.exp(wide).sum(axis=-1, keepdims=True))
    expected = -np.mean([log_softmax[b, t, ids[b, t].item()] for b in range(2) for t in range(2)])
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_factory_training_runs_sgd_steps_on_the_mean_square_and_counts_them(tmp_path: Path) -> None:
    (tmp_path / "f.py").write_text(
        "import torch\n"
        "def make():\n"
        "    model = torch.nn.Linear(2, 1, bias=False)\n"
        "    with torch.no_grad():\n"
        "        model.weight.copy_(torch.tensor([[0.5, -1.0]]))\n"
        "    return model, {'input': torch.tensor([[1.0, 2.0], [3.0, 1.0]])}\n",
        encoding="utf-8",
    )
    training = FactoryTraining.load(tmp_path / "f.py", "make", RunSettings())
    seen: list[tuple[int, int, str]] = []
    training.train(2, lambda done, total, message: seen.append((done, total, message)))
    assert (training.done, seen) == (2, [(1, 2, "step 1/2"), (2, 2, "step 2/2")])
    # loss = mean((x w)^2), d/dw = 2/n * x^T (x w); two SGD steps with lr 1e-3, computed independently in float64.
    x, w = np.array([[1.0, 2.0], [3.0, 1.0]]), np.array([0.5, -1.0])
    for _ in range(2):
        w = w - 1e-3 * (2 / len(x)) * x.T @ (x @ w)
    np.testing.assert_allclose(training.model.get_parameter("weight").detach().numpy()[0], w, rtol=1e-6)
