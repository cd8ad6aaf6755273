"""The script cannot take the report away (issue 18.4): ``--output`` is fixed before the script runs, and the
document reaches the original stdout whatever the script does to ``sys.stdout``, ``sys.stderr``, descriptors 1 and 2
or the working directory. Run as child processes: only real descriptors show what a user's terminal gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.nantrace._scripts import NanTrace, line_of

VANDAL = """
import io
import os
import sys

import torch

loss = torch.nn.Linear(3, 1)(torch.ones(2, 3)).pow(2).mean()
loss.backward()
print("training done")
os.makedirs("elsewhere", exist_ok=True)
os.chdir("elsewhere")
if "close" in sys.argv:
    sys.stdout.close()
    sys.stderr.close()
    os.close(1)
if "replace" in sys.argv:
    sys.stdout = io.StringIO()
    sys.stderr = open(os.devnull, "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
"""


@pytest.mark.parametrize("how", ["close", "replace"])
@pytest.mark.parametrize("fmt", ["json", "table"])
def test_the_document_reaches_the_original_stdout(nantrace: NanTrace, how: str, fmt: str) -> None:
    script, _ = nantrace.write("vandal.py", VANDAL)
    done = nantrace.process(str(script), "--format", fmt, "--", how, cwd=nantrace.folder)
    assert done.returncode == 0, done.stderr
    if fmt == "json":
        doc = json.loads(done.stdout)
        assert (doc["status"], doc["steps"]) == ("clean", 1)
        assert "training done" in done.stderr
    else:
        assert "clean: no NaN or Inf in" in done.stdout
        assert "Fatal Python error" not in done.stderr


def test_a_relative_output_lands_where_the_command_was_given(nantrace: NanTrace) -> None:
    script, _ = nantrace.write("vandal.py", VANDAL)
    done = nantrace.process(
        str(script), "--format", "json", "--output", "report.json", "--", "close", cwd=nantrace.folder
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert json.loads((nantrace.folder / "report.json").read_text(encoding="utf-8"))["status"] == "clean"
    assert not (nantrace.folder / "elsewhere" / "report.json").exists()


def test_a_finding_after_chdir_keeps_its_source_line(nantrace: NanTrace, tmp_path: Path) -> None:
    _, text = nantrace.write(
        "moves.py",
        """
        import os
        import torch

        os.chdir(os.path.dirname(os.__file__))
        w = torch.nn.Parameter(torch.ones(2))
        (torch.log(w - 2)).sum().backward()  # producer
        """,
    )
    done = nantrace.process("moves.py", "--format", "json", "--output", "out.json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    first = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["first"]
    assert (first["location"]["file"], first["location"]["line"]) == ("moves.py", line_of(text, "producer"))
