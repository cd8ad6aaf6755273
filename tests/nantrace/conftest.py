"""What nan-trace tests share: the ``nantrace`` fixture (``_scripts.NanTrace``) and the compiled C++ checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from dtypecheck.nantrace import native
from tests.conftest import CliResult
from tests.nantrace._scripts import NanTrace


@pytest.fixture
def nantrace(cli: Callable[..., CliResult], tmp_path: Path) -> NanTrace:
    """Scripts written to the test's own folder, traced through the CLI's real error boundary."""
    return NanTrace(cli, tmp_path)


@pytest.fixture(scope="module")
def native_module() -> Iterator[ModuleType]:
    """The compiled C++ checks (``dtypecheck.nantrace.native``), built now if this machine has not built them yet
    (cached for the next run)."""
    if not native.compiler_available():
        pytest.skip("no C++ compiler or ninja on this machine: only the pure-Python checks can run")
    native.build()
    native._load_once.cache_clear()  # a lookup before the build found nothing
    loaded = native.load(build_in_background=False)
    assert loaded is not None
    yield loaded
    native._load_once.cache_clear()
