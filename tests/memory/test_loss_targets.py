"""The default loss fits the head (issue 31.6): a regression head takes MSE against a float target of its
output's shape, that target is part of the batch for the whole step, and a config's step is the one its users run
(no ``use_cache=False`` that the real step does not pass).

Referee: PyTorch's MemTracker on the second iteration of a plain training loop written here, whose batch holds its
target from before the forward pass."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from dtypecheck.dtypes import lookup
from dtypecheck.memory import EstimateOptions, estimate_memory, open_subject
from dtypecheck.memory_words import Mode

MODELS = """
import torch
from torch import nn


class TextRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(300, 64)
        self.body = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
        self.head = nn.Linear(64, 1)

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)).mean(dim=1))


def text_regressor():
    torch.manual_seed(0)
    return TextRegressor(), torch.randint(0, 300, (8, 32))


def image_to_image():
    torch.manual_seed(0)
    # Dense along the rows of each channel: an image in, an image of the same shape out.
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 32))
    return model, torch.randn(2, 3, 32, 32)
"""


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(MODELS, encoding="utf-8")
    return str(path)


def _loop_peak(model: nn.Module, batch: Callable[[], tuple[Any, Any]], step_loss) -> int:
    """MemTracker's peak of a loop's second step: ``x, y = next(loader)``, ``output, loss = step_loss(model, x,
    y)``, backward, AdamW (for-loop)."""
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False)

    def step() -> None:
        x, y = batch()
        _output, loss = step_loss(model, x, y)  # the output stays referenced, as ``out = model(x)`` does
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracker:
            step()
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def _mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[Any, torch.Tensor]:
    output = model(x)
    return output, F.mse_loss(output, y)


def _own_loss(model: nn.Module, ids: torch.Tensor, _y: Any) -> tuple[Any, torch.Tensor]:
    output = model(input_ids=ids, labels=ids)
    return output, output.loss


def _training(subject_or_target: Any, **kwargs: Any):
    subject = open_subject(subject_or_target, **kwargs) if isinstance(subject_or_target, str) else subject_or_target
    options = EstimateOptions(dtypes=(lookup("float32"),), modes=(Mode.training,))
    return estimate_memory(subject, options)


def _namespace(path: str) -> dict[str, Any]:
    import runpy

    return runpy.run_path(path)


def test_a_one_output_head_on_token_ids_is_a_regressor_with_mse(models):
    model, ids = _namespace(models)["text_regressor"]()
    measured = _loop_peak(model, lambda: (ids.clone(), torch.zeros(8, 1)), _mse)
    report = _training(f"{models}:text_regressor")
    assert report.model.loss == "mse"
    # Exact, the MSE's scalar counted with the elementwise buffer its CPU kernel keeps behind it (8 x 1 float32).
    # Cross-entropy over one class, the old default, differs.
    assert measured == report.estimates[0].bytes.total


def test_the_default_mse_target_is_held_with_the_batch(models):
    model, images = _namespace(models)["image_to_image"]()
    measured = _loop_peak(model, lambda: (images.clone(), torch.zeros(2, 3, 32, 32)), _mse)
    report = _training(f"{models}:image_to_image")
    assert report.model.loss == "mse"
    # The target (2*3*32*32 float32 = 24,576 B) is alive from the batch's load to the step's end, and counted
    # (it was not: -9.6%); so is the loss's storage, the elementwise buffer its CPU kernel reduced in place (the
    # "one output-sized tensor more and 4-byte scalar less" every MSE step showed). Exact.
    assert measured == report.estimates[0].bytes.total


def test_measure_of_the_default_mse_runs_the_users_loop(models):
    # --measure holds the default target as the loop that loads it with the batch does, so it measures what the
    # user's loop measures (test above), which the estimate is.
    model, images = _namespace(models)["image_to_image"]()
    loop = _loop_peak(model, lambda: (images.clone(), torch.zeros(2, 3, 32, 32)), _mse)
    subject = open_subject(f"{models}:image_to_image")
    options = EstimateOptions(dtypes=(lookup("float32"),), modes=(Mode.training,))
    report = estimate_memory(subject, options, measure=True)
    assert report.measured is not None
    assert report.measured.peak_bytes == loop
    assert report.measured.peak_bytes == report.estimates[0].bytes.total


LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 256,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def test_a_config_step_is_the_step_its_users_run(tmp_path):
    transformers = pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(LLAMA), encoding="utf-8")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    ids = torch.randint(0, 256, (1, 32))
    measured = _loop_peak(model, lambda: (ids.clone(), None), _own_loss)
    report = _training(str(tmp_path), seq_len=32)
    assert report.model.loss == "model"
    assert report.estimates[0].bytes.total == measured


REDUCED = """
import torch
import torch.nn.functional as F
from torch import nn


def _model():
    torch.manual_seed(0)
    return nn.Linear(256, 1024), torch.randn(4096, 256)


def default_mse():
    return _model()


def mse():
    model, x = _model()
    return model, x, lambda out, inputs: F.mse_loss(out, torch.zeros_like(out))


def smooth_l1():
    model, x = _model()
    return model, x, lambda out, inputs: F.smooth_l1_loss(out, torch.zeros_like(out))


def bce():
    model, x = _model()
    return model, x, lambda out, inputs: F.binary_cross_entropy(out.sigmoid(), torch.full_like(out, 0.5))


def soft_margin():
    model, x = _model()
    return model, x, lambda out, inputs: F.soft_margin_loss(out, torch.ones_like(out))
"""


@pytest.mark.parametrize("factory", ["default_mse", "mse", "smooth_l1", "bce", "soft_margin"])
def test_a_reduced_loss_keeps_its_elementwise_buffer_as_the_real_kernel_does(tmp_path, factory):
    # The CPU kernels of these losses return the mean in a 0-dim view of the 16 MiB elementwise buffer, alive with
    # the loss through backward: counted as a 4-byte scalar, a training step was 22% under MemTracker.
    path = tmp_path / "reduced.py"
    path.write_text(REDUCED, encoding="utf-8")
    report = estimate_memory(f"{path}:{factory}", EstimateOptions(dtypes=(lookup("float32"),)), measure=True)
    training = next(m for m in report.measurements if m.mode == Mode.training)
    assert abs(training.error) < 0.005, training
