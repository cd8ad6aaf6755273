"""A live model ``file.py:factory``: parameters and buffers, tied parameters once, user errors reported cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dtypecheck.errors import InputError, UsageError, UserCodeError
from dtypecheck.loaders import open_checkpoint
from tests._ckpt_factory import read_tensor, same

MODEL = """
import torch

def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 5, bias=False))
    model[2].weight = model[0].weight  # tied
    return model

def not_a_model():
    return 42

def with_inputs():
    return build(), torch.ones(2, dtype=torch.long)

def with_loss():
    return build(), torch.ones(2, dtype=torch.long), lambda out, inputs: out.sum()

def broken():
    return helper()

def helper():
    raise ValueError("bad config value")
"""


def _write(tmp_path: Path, text: str = MODEL) -> Path:
    path = tmp_path / "model_def.py"
    path.write_text(text)
    return path


def test_parameters_and_buffers_with_tied_weights_once(tmp_path: Path) -> None:
    path = _write(tmp_path)
    checkpoint = open_checkpoint(f"{path}:build")
    torch.manual_seed(0)
    expected = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 5, bias=False))
    records = {r.name: r for r in checkpoint.records()}
    assert checkpoint.format == "live-model"
    assert list(records) == [
        "0.weight",
        "1.weight",
        "1.bias",
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
    ]
    embedding = expected[0]
    assert isinstance(embedding, torch.nn.Embedding)
    assert same(read_tensor(records["0.weight"], 8), embedding.weight.detach())
    assert records["1.num_batches_tracked"].dtype == "int64"
    assert records["0.weight"].saved_device == "cpu"
    checkpoint.close()


def test_user_code_error_keeps_user_frames(tmp_path: Path) -> None:
    path = _write(tmp_path)
    with pytest.raises(UserCodeError) as caught:
        open_checkpoint(f"{path}:broken")
    assert "ValueError: bad config value" in str(caught.value)
    assert 'raise ValueError("bad config value")' in caught.value.formatted
    assert "in helper" in caught.value.formatted
    assert "dtypecheck/loaders" not in caught.value.formatted


def test_error_while_importing_user_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "import torch\n1 / 0\n")
    with pytest.raises(UserCodeError, match="ZeroDivisionError"):
        open_checkpoint(f"{path}:build")


@pytest.mark.parametrize("factory", ["with_inputs", "with_loss"])
def test_factories_returning_inputs_and_loss_scan_their_model(tmp_path: Path, factory: str) -> None:
    """The same (model, inputs[, loss_fn]) forms as estimate-memory and nan-trace accept."""
    path = _write(tmp_path)
    checkpoint = open_checkpoint(f"{path}:{factory}")
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(5, 3)
    records = {r.name: r for r in checkpoint.records()}
    assert len(records) == 6
    assert same(read_tensor(records["0.weight"], 8), embedding.weight.detach())
    checkpoint.close()


@pytest.mark.parametrize(
    ("suffix", "match"),
    [
        (":missing", "defines no 'missing'"),
        (":not_a_model", "must return an nn.Module, (model, inputs) or (model, inputs, loss_fn); got int"),
    ],
)
def test_factory_problems_are_input_errors(tmp_path: Path, suffix: str, match: str) -> None:
    path = _write(tmp_path)
    with pytest.raises(InputError) as caught:
        open_checkpoint(f"{path}{suffix}")
    assert match in str(caught.value)
    assert not isinstance(caught.value, UserCodeError)


def test_a_file_without_a_factory_name_is_a_usage_error(tmp_path: Path) -> None:
    path = _write(tmp_path)
    with pytest.raises(UsageError, match=r"name the factory that builds the model, as .*model_def.py:NAME"):
        open_checkpoint(str(path))


def test_user_file_can_import_its_neighbours(tmp_path: Path) -> None:
    (tmp_path / "layers_for_dtypecheck_test.py").write_text("import torch\nWIDTH = 3\n")
    path = _write(
        tmp_path,
        "import torch\nfrom layers_for_dtypecheck_test import WIDTH\n"
        "def build():\n    return torch.nn.Linear(WIDTH, 1)\n",
    )
    checkpoint = open_checkpoint(f"{path}:build")
    assert [(r.name, r.shape) for r in checkpoint.records()] == [("weight", (1, 3)), ("bias", (1,))]
    checkpoint.close()
