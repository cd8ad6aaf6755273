"""The one ``file.py:factory`` loader: the forms it accepts and one clear error for everything else."""

from __future__ import annotations

import pytest
import torch

from dtypecheck.errors import InputError, UsageError, UserCodeError
from dtypecheck.usercode import load_factory

HEADER = "import torch\nfrom torch import nn\n"


def _write(tmp_path, body: str, name: str = "factory.py"):
    path = tmp_path / name
    path.write_text(HEADER + body)
    return path


def test_module_alone(tmp_path):
    path = _write(tmp_path, "def build():\n    return nn.Linear(3, 2)\n")
    made = load_factory(f"{path}:build")
    assert isinstance(made.model, torch.nn.Linear)
    assert made.inputs is None
    assert made.loss_fn is None
    assert made.target == f"{path}:build"


def test_model_inputs_and_loss(tmp_path):
    body = (
        "def build():\n    model = nn.Linear(3, 2)\n    return model, torch.ones(4, 3), lambda out, inputs: out.sum()\n"
    )
    made = load_factory(f"{_write(tmp_path, body)}:build")
    assert made.inputs.shape == (4, 3)
    assert made.loss_fn is not None
    assert float(made.loss_fn(torch.ones(2), None)) == 2.0


def test_sibling_import_and_no_main_block(tmp_path):
    (tmp_path / "helper.py").write_text("WIDTH = 5\n")
    body = (
        "from helper import WIDTH\n"
        "def build():\n    return nn.Linear(WIDTH, 1), torch.zeros(1, WIDTH)\n"
        "if __name__ == '__main__':\n    raise SystemExit('main block ran')\n"
    )
    made = load_factory(f"{_write(tmp_path, body)}:build")
    assert made.model.in_features == 5


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("X = 1\n", "defines no 'build'"),
        ("build = 3\n", "is not callable"),
        ("def build():\n    return 3\n", "got int"),
        ("def build():\n    return nn.Linear(1, 1), 1, 2\n", "got (Linear, int, int)"),
    ],
)
def test_wrong_factories_are_input_errors(tmp_path, body, message):
    with pytest.raises(InputError, match=r"must return|defines no|is not callable") as caught:
        load_factory(f"{_write(tmp_path, body)}:build")
    assert message in str(caught.value)


def test_factory_that_raises_is_a_user_code_error(tmp_path):
    path = _write(tmp_path, "def build():\n    raise ValueError('bad width')\n")
    with pytest.raises(UserCodeError, match="build\\(\\) raised ValueError: bad width") as caught:
        load_factory(f"{path}:build")
    assert str(path.name) in caught.value.formatted


def test_missing_file_syntax_error_and_no_factory_name(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_factory(f"{tmp_path / 'absent.py'}:build")
    bad = tmp_path / "bad.py"
    bad.write_text("def (:\n")
    with pytest.raises(InputError, match="not a Python file"):
        load_factory(f"{bad}:build")
    with pytest.raises(UsageError, match="name the factory"):
        load_factory(str(bad))
