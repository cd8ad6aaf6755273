"""The setup every nan-trace test repeats, as the ``nantrace`` fixture (see ``_scripts.NanTrace``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult
from tests.nantrace._scripts import NanTrace


@pytest.fixture
def nantrace(cli: Callable[..., CliResult], tmp_path: Path) -> NanTrace:
    """Scripts written to the test's own folder, traced through the CLI's real error boundary."""
    return NanTrace(cli, tmp_path)
