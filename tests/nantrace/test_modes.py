"""``nan-trace`` beyond single scripts: factory mode, the Python API, the JSON document, exit codes, bad input."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import dtypecheck
from dtypecheck.nantrace.ops import OpKind, classify
from tests.nantrace._scripts import NanTrace, line_of

DTYPECHECK_DIR = str(Path(dtypecheck.__file__).parent)

FACTORY = """
import torch

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.log(self.proj(x) - 100.0)  # log

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Identity(), Block()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x

def clean():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)), torch.randn(3, 4)

def broken():
    return Net(), (torch.randn(3, 4),), lambda out: out.mean()

def wrong():
    return torch.randn(3)

def model_only():
    return torch.nn.Linear(2, 2)

def raises():
    raise ValueError("no data here")  # factory raises

def no_parameters():
    return torch.nn.ReLU(), torch.randn(3, 4)

def frozen():
    model = torch.nn.Linear(4, 2)
    model.requires_grad_(False)
    return model, torch.randn(3, 4)

not_a_function = 3
"""


def test_factory_mode_runs_steps_and_stays_clean(nantrace: NanTrace) -> None:
    path, _ = nantrace.write("factory.py", FACTORY)
    code, doc, _ = nantrace.json(f"{path}:clean", "--steps", "4")
    assert code == 0
    assert doc["status"] == "clean"
    assert doc["steps"] == 4
    assert doc["source"] == f"{path}:clean"
    assert doc["first"] is None


def test_factory_mode_names_the_module_from_named_modules(nantrace: NanTrace) -> None:
    path, text = nantrace.write("factory.py", FACTORY)
    code, doc, _ = nantrace.json(f"{path}:broken")
    assert code == 1
    first = doc["first"]
    # proj(x) - 100 is negative: log is NaN in float64 too.
    assert (first["kind"], first["op"], first["phase"]) == ("nan", "aten.log.default", "forward")
    assert first["module"] == "blocks.1"
    assert first["grad_fn"] == "LogBackward0"
    assert first["location"]["line"] == line_of(text, "log")
    assert first["cause"] == "invalid_math"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("missing", "factory.py defines no 'missing'"),
        ("not_a_function", "factory.py:not_a_function is not callable (it is a int)"),
        ("wrong", "wrong() must return an nn.Module, (model, inputs) or (model, inputs, loss_fn); got Tensor"),
        ("model_only", "model_only() must return (model, inputs) or (model, inputs, loss_fn) for nan-trace"),
        # These two crashed with torch's "ValueError: optimizer got an empty parameter list" traceback, exit 1.
        (
            "no_parameters",
            "no_parameters(): the model has no parameter that requires grad, and factory mode trains it (forward, "
            "backward, SGD step); trace a script that runs it instead",
        ),
        (
            "frozen",
            "frozen(): the model has no parameter that requires grad, and factory mode trains it (forward, "
            "backward, SGD step); trace a script that runs it instead",
        ),
    ],
)
def test_bad_factories_exit_3_with_one_line(nantrace: NanTrace, cli: Any, target: str, message: str) -> None:
    path, _ = nantrace.write("factory.py", FACTORY)
    result = cli("nan-trace", f"{path}:{target}")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_factory_that_raises_shows_its_own_traceback(nantrace: NanTrace, cli: Any) -> None:
    path, text = nantrace.write("factory.py", FACTORY)
    result = cli("nan-trace", f"{path}:raises")
    assert result.exit_code == 3
    at = f"at line {line_of(text, 'factory raises')} in raises"
    said = f"error: {path}: raises() raised ValueError: no data here"
    assert result.stderr == f"{said} ({at}; --traceback shows the traceback)\n"
    result = cli("nan-trace", f"{path}:raises", "--traceback")
    assert result.exit_code == 3
    assert f'File "{path}", line {line_of(text, "factory raises")}, in raises' in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"{said} ({at})"  # the traceback is there: no hint


RAISES = """
import torch

def helper(x):
    return x.view(7)  # bad view

helper(torch.ones(3))
"""


def test_script_that_raises_exits_3_with_only_its_own_frames(nantrace: NanTrace, cli: Any) -> None:
    path, text = nantrace.write("raises.py", RAISES)
    result = cli("nan-trace", str(path))
    assert result.exit_code == 3
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1  # one line, no traceback unless asked for
    assert result.stderr.startswith("error: raises.py raised RuntimeError: shape '[7]' is invalid")
    assert result.stderr.endswith(f"(at line {line_of(text, 'bad view')} in helper; --traceback shows the traceback)\n")
    result = cli("nan-trace", str(path), "--traceback")
    assert result.exit_code == 3
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert f'File "{path}", line {line_of(text, "bad view")}, in helper' in result.stderr
    assert DTYPECHECK_DIR not in result.stderr
    assert "runpy" not in result.stderr
    assert lines[-2].startswith("RuntimeError: shape '[7]' is invalid")
    assert lines[-1].startswith("error: raises.py raised RuntimeError: shape '[7]' is invalid")


def test_missing_script_and_non_python_exit_3(cli: Any, tmp_path: Path) -> None:
    result = cli("nan-trace", str(tmp_path / "nope.py"))
    assert (result.exit_code, result.stdout) == (3, "")
    assert result.stderr == f"error: no such file: {tmp_path / 'nope.py'}\n"
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)))
    result = cli("nan-trace", str(binary))
    assert result.exit_code == 3
    assert result.stderr.startswith("error: not a Python file")
    prose = tmp_path / "notes.py"
    prose.write_text("this is not python at all\n", encoding="utf-8")
    result = cli("nan-trace", str(prose))
    assert result.exit_code == 3
    assert result.stderr.startswith(f"error: not a Python file: {prose}: invalid syntax (line 1)")


def test_bad_options_exit_2(nantrace: NanTrace, cli: Any) -> None:
    path, _ = nantrace.write("ok.py", "x = 1\n")
    assert cli("nan-trace", str(path), "--autocast", "int8").exit_code == 2
    assert cli("nan-trace", str(path), "--autocast", "fp61").exit_code == 2
    assert cli("nan-trace", str(path), "--device", "nowhere").exit_code == 2


ARGV = """
import sys
import torch

assert __name__ == "__main__"
assert sys.argv[1:] == ["--lr", "3"], sys.argv
print("script says hi")
model = torch.compile(torch.nn.Linear(2, 2))
model(torch.ones(1, 2)).sum().backward()
"""


def test_script_gets_its_argv_and_its_prints_go_to_stderr_for_json(nantrace: NanTrace, cli: Any) -> None:
    path, _ = nantrace.write("argv.py", ARGV)
    result = cli("nan-trace", str(path), "--format", "json", "--", "--lr", "3")
    assert result.exit_code == 0
    assert "script says hi" in result.stderr
    doc = result.json()  # stdout holds only the document
    assert doc["schema"] == "dtypecheck.nantrace/1"
    assert doc["status"] == "clean"
    # torch.compile ran eagerly, and the report says so.
    assert len(doc["notes"]) == 1
    assert "torch.compile was called 1 time(s) and ran eagerly" in doc["notes"][0]
    table = cli("nan-trace", str(path), "--", "--lr", "3")
    assert table.exit_code == 0
    assert table.stdout.startswith("script says hi\n")
    assert "clean: no NaN or Inf in" in table.stdout
    assert "note: torch.compile was called 1 time(s)" in table.stdout


def test_json_document_shape(nantrace: NanTrace) -> None:
    path, _ = nantrace.write("factory.py", FACTORY)
    _, doc, _ = nantrace.json(f"{path}:broken")
    assert {"schema", "dtypecheck_version", "status", "first", "warnings", "ops", "steps"} <= doc.keys()
    assert doc["dtypecheck_version"] == dtypecheck.__version__
    assert isinstance(doc["ops"], int)
    assert doc["ops"] > 0
    event = doc["first"]
    contract = {"kind", "phase", "op", "grad_fn", "module", "dtype", "location", "counts", "absmax", "limit", "cause"}
    assert contract <= event.keys()
    assert set(event["location"]) == {"file", "line", "function", "code"}
    assert set(event["counts"]) == {"nan", "posinf", "neginf", "zeros", "subnormal"}
    assert event["counts"]["nan"] == 12  # all 3 x 4 outputs of log(negative)
    assert event["absmax"] == 0.0  # nothing but NaN in the output
    for entry in event["history"]:
        assert {"op", "phase", "module", "dtype", "absmax", "limit", "ratio", "location"} <= entry.keys()


def test_python_api_returns_the_same_report(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Softplus())
    x = torch.zeros(2, 3)
    with dtypecheck.trace(model) as t:
        y = model(x)
        z = (y - y).div(y - y)  # api
        z.sum().backward()
    report = t.report
    assert isinstance(report, dtypecheck.NanTraceReport)
    assert report.status == "nonfinite"
    assert report.level == "fail"
    assert report.first is not None
    assert (report.first.kind, report.first.op, report.first.phase) == ("nan", "aten.div.Tensor", "forward")
    assert report.first.module is None
    assert report.first.location is not None
    assert report.first.location.file == __file__
    assert "# api" in report.first.location.code
    assert report.first.cause == "invalid_math"  # 0 / 0
    assert report.steps == 1
    assert report.source is None


def test_python_api_clean_block_and_module_paths(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Sequential(torch.nn.Linear(3, 3)))
    optimizer = torch.optim.AdamW(model.parameters())
    with dtypecheck.trace(warn_frac=0.0) as t:
        model(torch.randn(2, 3)).sum().backward()
        optimizer.step()
    report = t.report
    assert report.status == "clean"
    assert report.first is None
    # warn_frac 0 makes every op a near-overflow warning: one per module shows the module paths.
    modules = [w.module for w in report.warnings]
    assert "0" in modules
    assert "1.0" in modules
    assert None in modules
    assert len(modules) == len(set(modules))  # backward ops belong to their forward module: no second warning
    assert (report.warnings[0].op, report.warnings[0].phase) == ("aten.randn.default", "other")


def test_report_is_unavailable_inside_the_block() -> None:
    with dtypecheck.trace() as t, pytest.raises(RuntimeError, match="still running"):
        _ = t.report


def test_uninitialised_memory_ops_are_never_checked() -> None:
    for op in (
        torch.ops.aten.empty.memory_format,
        torch.ops.aten.empty_like.default,
        torch.ops.aten.new_empty.default,
        torch.ops.aten.empty_strided.default,
    ):
        assert classify(op).kind is OpKind.UNINITIALISED
    assert classify(torch.ops.aten.add_.Tensor).read_mutated == (0,)
    assert classify(torch.ops.aten.copy_.default).read_mutated == ()  # overwritten, not read
    # A buffer that starts as garbage NaN and is then fully written is clean.
    with dtypecheck.trace() as t:
        buffer = torch.empty(4)
        buffer.copy_(torch.ones(4))
        (buffer * 2).sum()
    assert t.report.status == "clean"


def test_package_import_stays_torch_free() -> None:
    import subprocess

    code = "import sys, dtypecheck; dtypecheck.trace; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_window_and_memory_budget_only_change_when_checks_are_read_back(nantrace: NanTrace) -> None:
    from dtypecheck.nantrace.tracer import TraceOptions, Tracer

    def run(options: TraceOptions) -> Any:
        x = torch.full((4,), 1e20)
        with Tracer(options) as tracer:
            y = x * 1e10
            y.mul_(1e10)  # 1e40 overflows float32
            (y - y).sum()
        return tracer.report()

    for options in (TraceOptions(), TraceOptions(window=1), TraceOptions(held_bytes=0)):
        report = run(options)
        assert report.first is not None
        assert (report.first.op, report.first.kind) == ("aten.mul_.Tensor", "inf")
        assert report.first.counts.posinf == 4
    # With no room for a copy of mul_'s target, the float64 re-run is impossible: the cause stays unknown.
    assert run(TraceOptions()).first.cause == "range_overflow"
    assert run(TraceOptions(held_bytes=0)).first.cause is None


def test_whole_process_smoke(nantrace: NanTrace) -> None:
    """``python -m dtypecheck nan-trace`` end to end: the script's print goes to stderr, stdout is the document."""
    import json
    import subprocess

    path, text = nantrace.write(
        "smoke.py",
        """
        import torch
        print("from the script")
        torch.exp(torch.full((2,), 100.0, dtype=torch.float16))  # exp
        """,
    )
    done = subprocess.run(
        [sys.executable, "-m", "dtypecheck", "nan-trace", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "from the script" in done.stderr
    first = json.loads(done.stdout)["first"]
    assert (first["op"], first["dtype"], first["cause"]) == ("aten.exp.default", "float16", "range_overflow")
    assert first["location"]["line"] == line_of(text, "exp")


def test_project_config_supplies_defaults_and_the_command_line_wins(nantrace: NanTrace, tmp_path: Path) -> None:
    path, _ = nantrace.write("factory.py", FACTORY)
    config = tmp_path / "pyproject.toml"
    config.write_text(
        "[tool.dtypecheck.nan-trace]\nhistory = 1\nsteps = 2\nkeep-going = true\nwarn-frac = 0.0\n", encoding="utf-8"
    )
    code, doc, _ = nantrace.json(f"{path}:clean", "--config", str(config))
    assert (code, doc["steps"]) == (0, 2)
    assert doc["warnings"] != []  # warn-frac 0: every module's first op warns
    _, doc, _ = nantrace.json(f"{path}:clean", "--config", str(config), "--warn-frac", "1.0")
    assert doc["warnings"] == []
    _, doc, _ = nantrace.json(f"{path}:broken", "--config", str(config))
    assert len(doc["first"]["history"]) == 1
    assert doc["stopped_early"] is False  # keep-going from the config


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_device_the_machine_lacks_is_a_usage_error(cli, tmp_path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import torch\nx = torch.ones(3)\n")
    result = cli("nan-trace", str(script), "--device", "cuda")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --device 'cuda': this machine")
    assert "has no cuda device" in result.stderr
