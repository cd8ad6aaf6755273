"""Fixtures the estimate-memory tests share."""

from __future__ import annotations

import pytest

WIDE = """
import torch
from torch import nn


def wide():
    torch.manual_seed(0)
    return nn.Linear(256, 256, bias=False), torch.randn(4, 256)
"""


@pytest.fixture
def wide(tmp_path):
    """``file.py:wide``: one 256x256 Linear without bias and a batch of 4."""
    path = tmp_path / "wide.py"
    path.write_text(WIDE, encoding="utf-8")
    return f"{path}:wide"
