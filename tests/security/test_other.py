"""Class "other": output paths, names that forge lines or drive terminals, usage edge cases, exits and Ctrl-C
from user code, and safetensors/zip files the reference readers reject."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult
from tests.security import corpus
from tests.security.harness import handled, one_error_line, run_cli, run_hostile


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> dict[str, corpus.Hostile]:
    return {h.name: h for h in corpus.build(tmp_path_factory.mktemp("hostile"), ("other",))}


@pytest.fixture(scope="module")
def in_own_process(other: dict[str, corpus.Hostile]) -> Callable[[str], tuple[int, str]]:
    """Run an input in its own process once for the module: (exit code, stderr). Each such run costs a torch
    import (and Ctrl-C's a wait for the script to start); two tests read the same runs."""
    done: dict[str, tuple[int, str]] = {}

    def run(name: str) -> tuple[int, str]:
        if name not in done:
            returncode, stderr, _seconds = run_hostile(other[name], timeout=300)
            done[name] = (returncode, stderr)
        return done[name]

    return run


def test_every_input_is_handled_per_contract(
    other: dict[str, corpus.Hostile], cli: Callable[..., CliResult], in_own_process: Callable[[str], tuple[int, str]]
) -> None:
    for hostile in other.values():
        if hostile.needs_subprocess or "/proc/self/fd/1" in hostile.args:
            returncode, stderr = in_own_process(hostile.name)
        else:
            result = cli(*hostile.args)
            returncode, stderr = result.exit_code, result.stderr
        assert handled(returncode, stderr, hostile.expect), (hostile.name, returncode, stderr)


def test_output_through_a_symlink_to_a_device_keeps_the_device(
    other: dict[str, corpus.Hostile], cli: Callable[..., CliResult]
) -> None:
    hostile = other["output-symlink-to-device"]
    assert cli(*hostile.args).exit_code == 1
    link = Path(hostile.args[-1])
    assert link.is_symlink()
    assert str(link.readlink()) == "/dev/null"
    assert stat.S_ISCHR(Path("/dev/null").stat().st_mode)
    done = run_cli(other["output-dev-stdout"].args)
    assert done.returncode == 1
    assert json.loads(done.stdout)["summary"]["fail"] == 1  # written through to the real stdout


def test_names_cannot_forge_lines_or_drive_the_terminal(
    other: dict[str, corpus.Hostile], cli: Callable[..., CliResult]
) -> None:
    result = cli(*other["newline-in-file-name"].args)
    assert one_error_line(result.stderr)
    assert "a\\nerror: all checks passed.pt" in result.stderr
    for name in ("escape-in-tensor-name-table", "escape-in-error-message"):
        result = cli(*other[name].args)
        assert "\x1b" not in result.stdout + result.stderr
        assert "\x07" not in result.stdout + result.stderr
        assert "\\x1b]0;owned\\x07" in result.stdout + result.stderr


def test_empty_target_lists_are_usage_errors(other: dict[str, corpus.Hostile], cli: Callable[..., CliResult]) -> None:
    for name in ("empty-target", "empty-target-commas"):
        result = cli(*other[name].args)
        assert result.exit_code == 2
        assert result.stderr.startswith("error: empty dtype name")


def test_os_exit_and_ctrl_c_in_user_code(in_own_process: Callable[[str], tuple[int, str]]) -> None:
    returncode, stderr = in_own_process("os-exit-in-factory")
    assert returncode == 3
    assert stderr.endswith("the user's code called os._exit(7); no report was made\n")
    returncode, stderr = in_own_process("ctrl-c")
    assert returncode == 130
    assert stderr == "error: interrupted\n"


@pytest.mark.parametrize(
    "name", ["safetensors-metadata-not-string", "safetensors-gap", "safetensors-header-over-limit"]
)
def test_safetensors_the_reference_reader_rejects_are_rejected(
    other: dict[str, corpus.Hostile], cli: Callable[..., CliResult], name: str
) -> None:
    from safetensors import safe_open

    path = other[name].args[1]
    with pytest.raises(Exception), safe_open(path, "pt"):  # noqa: B017,PT011  (its errors have no common class)
        pass
    result = cli(*other[name].args)
    assert result.exit_code == 3
    assert one_error_line(result.stderr)


def test_a_zip_with_two_top_level_folders_is_refused_as_torch_refuses_it(
    other: dict[str, corpus.Hostile], cli: Callable[..., CliResult]
) -> None:
    import torch

    path = other["zip-two-top-level-folders"].args[1]
    with pytest.raises(RuntimeError, match="not in a subdirectory"):
        torch.load(path, weights_only=True)  # benign pickles: safe to hand to torch itself
    result = cli(*other["zip-two-top-level-folders"].args)
    assert result.exit_code == 3
    assert "entries outside archive/" in result.stderr
