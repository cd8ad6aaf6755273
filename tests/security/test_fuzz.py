"""Class "fuzz": damaged checkpoints of every format give a report or one error line; no payload ever runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.conftest import CliResult
from tests.security import corpus
from tests.security.harness import handled


def test_damaged_files_are_handled_per_contract(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    inputs = corpus.build(tmp_path, ("fuzz",))
    assert len(inputs) == 5 * corpus.FUZZ_PER_ORIGINAL
    exits = []
    for hostile in inputs:
        result = cli(*hostile.args)
        assert handled(result.exit_code, result.stderr, hostile.expect), (hostile.name, result.stderr)
        exits.append(result.exit_code)
        assert hostile.canary is None or not hostile.canary.exists()
    assert exits.count(3) >= len(inputs) // 4  # the damage is real: many files are refused
