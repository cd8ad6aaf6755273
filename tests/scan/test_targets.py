"""Which dtypes can be scan targets: e8m0 (power-of-two MX scales, no zero, no sign) is refused everywhere alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from dtypecheck.dtypes import REGISTRY, lookup
from dtypecheck.errors import UsageError
from dtypecheck.scan.run import scan_checkpoint
from dtypecheck.targets import check_targets, target_problem


def _ckpt(tmp_path: Path) -> str:
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.tensor([-1.0, 0.0, 0.5, 3.0])}, str(path))
    return str(path)


def test_e8m0_is_the_only_float_refused() -> None:
    refused = [s.name for s in REGISTRY if s.kind == "float" and target_problem(s) is not None]
    assert refused == ["float8_e8m0fnu"]
    assert "MX" in (target_problem(lookup("e8m0")) or "")


def test_library_refuses_e8m0(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="float8_e8m0fnu"):
        scan_checkpoint(_ckpt(tmp_path), [lookup("e8m0")])
    with pytest.raises(UsageError):
        check_targets([lookup("fp16"), lookup("float8_e8m0fnu")])
    assert [s.name for s in check_targets([lookup("e4m3"), lookup("int8")])] == ["float8_e4m3fn", "int8"]


@pytest.mark.parametrize("name", ["e8m0", "fp16,e8m0fnu", "torch.float8_e8m0fnu"])
def test_cli_refuses_e8m0_target(cli: Callable[..., Any], tmp_path: Path, name: str) -> None:
    result = cli("scan-model", _ckpt(tmp_path), "--target", name, "--format", "json")
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: --target float8_e8m0fnu")
    assert "no zero, no sign" in lines[0]


def test_config_refuses_e8m0_target(cli: Callable[..., Any], tmp_path: Path) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.dtypecheck.scan-model]\ntargets = ["fp16", "e8m0"]\n')
    result = cli("scan-model", _ckpt(tmp_path), "--config", str(config))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: ")
    assert "targets[1]: float8_e8m0fnu holds only positive powers of two" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
