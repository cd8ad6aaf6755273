"""A finding survives the script's exception (issue 18.2): the NaN producer is reported, the exception is its
consequence (type, message, the user's line) and the exit code is 1; exit 3 stays for exceptions with nothing
non-finite involved. The CLI and ``dtypecheck.trace()`` report the same."""

from __future__ import annotations

import json
import runpy

import pytest

import dtypecheck
from tests.nantrace._scripts import NanTrace, line_of

# Each script makes a NaN with a log of a negative number (marked "producer"), then dies of it at "raises".
DIES_OF_IT = {
    "bce": (
        """
        import torch
        import torch.nn.functional as F

        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(4, 1))
        x = torch.randn(8, 4)
        p = torch.sigmoid(x @ w) * torch.log(-torch.ones(8, 1))  # producer
        loss = F.binary_cross_entropy(p, torch.ones(8, 1))  # raises
        loss.backward()
        """,
        "RuntimeError",
        "all elements of input should be between 0 and 1",
    ),
    "index": (
        """
        import torch

        table = torch.nn.Embedding(10, 3)
        scores = torch.log(torch.tensor([-1.0, 2.0]))  # producer
        ids = scores.long()
        out = table(ids)  # raises
        """,
        "IndexError",
        "index out of range in self",
    ),
    "multinomial": (
        """
        import torch

        logits = torch.tensor([[1.0, 2.0, 3.0]])
        probs = torch.softmax(logits, dim=-1) * torch.log(torch.tensor(-1.0))  # producer
        token = torch.multinomial(probs, 1)  # raises
        """,
        "RuntimeError",
        "probability tensor contains either `inf`, `nan` or element < 0",
    ),
    "assert": (
        """
        import torch

        model = torch.nn.Linear(3, 1)
        loss = torch.log(model(torch.ones(2, 3)).mean() - 1e6)  # producer
        assert torch.isfinite(loss), f"loss is {loss.item()}"  # raises
        loss.backward()
        """,
        "AssertionError",
        "loss is nan",
    ),
}


@pytest.mark.parametrize("case", sorted(DIES_OF_IT))
def test_a_nan_the_script_dies_of_is_reported_with_the_exception_and_exit_1(nantrace: NanTrace, case: str) -> None:
    source, kind, message = DIES_OF_IT[case]
    script, text = nantrace.write(f"{case}.py", source)
    code, doc, _ = nantrace.json(str(script))
    assert code == 1
    assert doc["status"] == "nonfinite"
    first = doc["first"]
    assert (first["kind"], first["op"], first["cause"]) == ("nan", "aten.log.default", "invalid_math")
    assert first["location"]["line"] == line_of(text, "producer")
    assert first["consequence"] == "exception"
    assert first["level"] == "fail"
    raised = doc["exception"]
    assert raised["type"] == kind
    assert raised["message"].startswith(message), raised["message"]
    assert raised["location"]["file"] == str(script)
    assert raised["location"]["line"] == line_of(text, "raises")


def test_the_python_api_reports_the_same_and_reraises(nantrace: NanTrace) -> None:
    source, _, message = DIES_OF_IT["multinomial"]
    script, text = nantrace.write("api.py", source)
    with pytest.raises(RuntimeError, match="probability tensor"), dtypecheck.trace() as traced:
        runpy.run_path(str(script))
    report = traced.report
    assert report.status == "nonfinite"
    assert report.first is not None
    assert (report.first.op, report.first.consequence) == ("aten.log.default", "exception")
    assert report.first.location is not None
    assert report.first.location.line == line_of(text, "producer")
    assert report.exception is not None
    assert (report.exception.type, report.exception.message[: len(message)]) == ("RuntimeError", message)
    assert report.exception.location is not None
    assert report.exception.location.line == line_of(text, "raises")


def test_the_table_says_what_was_raised_where(nantrace: NanTrace) -> None:
    script, text = nantrace.write("bce.py", DIES_OF_IT["bce"][0])
    result = nantrace.run(str(script))
    assert result.exit_code == 1
    out = " ".join(result.stdout.split())
    assert "was in flight when the traced code raised (below)" in out
    said = "then the traced code raised RuntimeError: all elements of input should be between 0 and 1"
    assert f"{said} at {script}:{line_of(text, 'raises')}" in out


def test_an_exit_after_the_nan_is_the_consequence_too(nantrace: NanTrace) -> None:
    script, text = nantrace.write(
        "bail.py",
        """
        import sys
        import torch

        loss = torch.log(torch.tensor(-2.0))  # producer
        if not torch.isfinite(loss):
            sys.exit(4)  # raises
        """,
    )
    code, doc, _ = nantrace.json(str(script))
    assert code == 1
    assert doc["first"]["location"]["line"] == line_of(text, "producer")
    assert doc["exception"] == {
        "type": "SystemExit",
        "message": "sys.exit(4)",
        "location": {
            "file": str(script),
            "line": line_of(text, "raises"),
            "function": "<module>",
            "code": "sys.exit(4)  # raises",
        },
    }


def test_an_exception_with_nothing_nonfinite_still_exits_3(nantrace: NanTrace) -> None:
    script, _ = nantrace.write(
        "plain.py",
        """
        import torch

        probs = torch.tensor([[0.2, -0.1, 0.9]])  # negative, finite: multinomial refuses it
        torch.multinomial(probs, 1)  # raises
        """,
    )
    result = nantrace.run(str(script), "--format", "json")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {script.name} raised RuntimeError: probability")
    assert result.stderr.count("\n") == 1
    masked = nantrace.write(
        "masked.py",
        """
        import torch

        x = torch.nan_to_num(torch.log(torch.tensor([-1.0, 1.0])))  # masked at once
        raise ValueError("unrelated")
        """,
    )[0]
    result = nantrace.run(str(masked), "--format", "json")
    assert result.exit_code == 3
    assert result.stderr == (
        f"error: {masked.name} raised ValueError: unrelated (at line 4 in <module>; --traceback shows the traceback)\n"
    )  # line 4: the dedented script starts with an empty line


@pytest.mark.parametrize(
    ("ending", "code", "error"),
    [
        ("sys.exit(0)", 0, None),
        ("sys.exit()", 0, None),
        ("os._exit(0)", 0, None),
        ("sys.exit(5)", 3, "error: ends.py exited with status 5\n"),
        ("exit(5)", 3, "error: ends.py exited with status 5\n"),
        # It said "exited with status fatal: bad config".
        ('sys.exit("fatal: bad config")', 3, "error: ends.py exited with status 1: sys.exit('fatal: bad config')\n"),
    ],
)
def test_a_script_that_exits_ends_as_its_exit_status_says(
    nantrace: NanTrace, ending: str, code: int, error: str | None
) -> None:
    """A script's ``sys.exit(0)`` is its normal end (the report is written, exit 0, as ``python train.py`` would
    succeed); a non-zero status is an input error naming it, with nothing on stdout."""
    script, _ = nantrace.write("ends.py", f"import os, sys\nimport torch\n\ntorch.ones(2).sum()\n{ending}\n")
    result = nantrace.run(str(script), "--format", "json", "--quiet")
    assert result.exit_code == code
    if error is None:
        assert json.loads(result.stdout)["status"] == "clean"
        assert result.stderr == ""
    else:
        assert (result.stdout, result.stderr) == ("", error)
