"""User code (factories, scripts) may print or exit: stdout stays the report's, and exits become input errors."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

FACTORY = """
import os, sys
import torch

print("printed at import")

def noisy():
    print("printed by the factory")
    os.write(1, b"written to fd 1\\n")
    return torch.nn.Linear(4, 2)

def noisy_pair():
    print("printed by the factory")
    return torch.nn.Linear(4, 2), torch.ones(3, 4)

def quits():
    sys.exit(5)

def quits_quietly():
    sys.exit(0)
"""


@pytest.fixture
def factory_file(tmp_path: Path) -> Path:
    path = tmp_path / "fac.py"
    path.write_text(FACTORY)
    return path


@pytest.mark.parametrize(
    ("command", "factory"),
    [("scan-model", "noisy"), ("estimate-memory", "noisy_pair"), ("nan-trace", "noisy_pair")],
)
def test_factory_output_goes_to_stderr_and_the_json_parses(cli, factory_file: Path, command: str, factory: str) -> None:
    result = cli(command, f"{factory_file}:{factory}", "--format", "json", "--quiet")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["schema"].startswith("dtypecheck.")
    assert "printed by the factory" in result.stderr
    assert "printed at import" in result.stderr


@pytest.mark.parametrize("command", ["scan-model", "estimate-memory", "nan-trace"])
@pytest.mark.parametrize(("factory", "code"), [("quits", "5"), ("quits_quietly", "0")])
def test_sys_exit_in_a_factory_is_an_input_error(
    cli, factory_file: Path, command: str, factory: str, code: str
) -> None:
    result = cli(command, f"{factory_file}:{factory}", "--format", "json", "--quiet")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {factory_file}:{factory}: the user's code called sys.exit({code}); no report was made"
    )


def test_script_writes_below_print_do_not_reach_the_json(capfd, tmp_path: Path) -> None:
    from dtypecheck.cli import main

    script = tmp_path / "loud.py"
    script.write_text(
        "import os, sys, torch\n"
        "print('print')\n"
        "os.write(1, b'fd one\\n')\n"
        "sys.__stdout__.write('dunder\\n'); sys.__stdout__.flush()\n"
        "os.system('echo from a subprocess')\n"
        "x = torch.ones(2) * 2\n"
    )
    code = main(["nan-trace", str(script), "--format", "json", "--quiet"])
    out, err = capfd.readouterr()
    assert code == 0
    assert json.loads(out)["status"] == "clean"
    for line in ("print", "fd one", "dunder", "from a subprocess"):
        assert line in err


def test_steps_with_a_script_is_a_usage_error(cli, tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("x = 1\n")
    result = cli("nan-trace", str(script), "--steps", "3")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --steps applies to file.py:factory")


def test_output_file_gets_the_usual_mode_and_keeps_an_existing_one(cli, tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.json"
        assert cli("info", "fp16", "-f", "json", "-q", "-o", str(fresh)).exit_code == 0
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
        shared = tmp_path / "shared.json"
        shared.write_text("old")
        shared.chmod(0o664)
        assert cli("info", "fp16", "-f", "json", "-q", "-o", str(shared)).exit_code == 0
        assert stat.S_IMODE(shared.stat().st_mode) == 0o664
    finally:
        os.umask(umask)


def _console(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dtypecheck", *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def test_console_entry_keeps_exit_codes_and_complete_output(tmp_path: Path) -> None:
    unknown = _console("info", "fp61")
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert unknown.stderr.startswith("error: unknown dtype 'fp61'")
    ckpt = tmp_path / "m.safetensors"
    save_file({"w": torch.tensor([1.0, float("nan")])}, str(ckpt))
    scanned = _console("scan-model", str(ckpt), "--format", "json")
    assert scanned.returncode == 1
    assert json.loads(scanned.stdout)["summary"]["level"] == "fail"  # the whole document arrived


@pytest.mark.parametrize("name", ["writes.py", "train"])  # a script need not be named *.py
def test_a_script_that_leaves_a_file_open_still_gets_it_flushed(tmp_path: Path, name: str) -> None:
    # User code ran, so the console entry exits the normal way and the script's open file is flushed.
    script = tmp_path / name
    script.write_text(f"log = open({str(tmp_path / 'log.txt')!r}, 'w')\nlog.write('step 1 done')\n")
    done = _console("nan-trace", str(script), "--quiet")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "log.txt").read_text() == "step 1 done"
