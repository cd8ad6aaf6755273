"""``nan-trace`` and ``dtypecheck.trace()`` on dtypes: the default dtype and who changed it, the first float64
promotion in a lower-precision program, and dtype-mismatch errors explained (exit 3, document still written).

Every expected line comes from a ``# marker`` in the script; every expected dtype from what the script builds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import dtypecheck
from dtypecheck.nantrace import TraceHandle
from dtypecheck.nantrace.explain import explanation_text, is_dtype_error
from dtypecheck.nantrace.report import (
    DefaultDtype,
    DefaultDtypeChange,
    DtypeError,
    Location,
    NanTraceReport,
    Promotion,
    TensorArg,
)
from dtypecheck.render import OutputFormat, render
from tests.nantrace._scripts import NanTrace, line_of


def _arg(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(a for a in doc["inputs"] if a["name"] == name)


DEFAULT_CHANGES = """
import torch

torch.set_default_dtype(torch.float64)  # set64
w = torch.randn(3)
torch.set_default_tensor_type(torch.FloatTensor)  # back32
torch.set_default_dtype(torch.float32)
torch.set_default_dtype(torch.float16)  # set16
"""


@pytest.mark.filterwarnings("ignore:torch.set_default_tensor_type")
def test_default_dtype_start_changes_and_lines_and_it_is_restored_after_the_run(nantrace: NanTrace) -> None:
    script, text = nantrace.write("defaults.py", DEFAULT_CHANGES)
    code, doc, _ = nantrace.json(str(script))
    assert code == 0
    default = doc["default_dtype"]
    assert (default["start"], default["end"]) == ("float32", "float16")
    # The call that set float32 while float32 was already the default changed nothing and is not listed.
    changes = [(c["old"], c["new"], c["call"], c["location"]["line"]) for c in default["changes"]]
    assert changes == [
        ("float32", "float64", "torch.set_default_dtype", line_of(text, "set64")),
        ("float64", "float32", "torch.set_default_tensor_type", line_of(text, "back32")),
        ("float32", "float16", "torch.set_default_dtype", line_of(text, "set16")),
    ]
    assert default["changes"][0]["location"]["file"] == str(script)
    # The script ran in this process: its float16 default must not leak into the caller, nor the wrappers.
    assert torch.get_default_dtype() is torch.float32
    assert torch.set_default_dtype.__module__ == "torch"


def test_clean_run_reports_the_default_dtype_without_changes(nantrace: NanTrace) -> None:
    script, _ = nantrace.write("plain.py", "import torch\nx = torch.ones(2) * 3\n")
    code, doc, _ = nantrace.json(str(script))
    assert code == 0
    assert doc["default_dtype"] == {"start": "float32", "end": "float32", "changes": []}
    assert (doc["promotions"], doc["dtype_error"]) == ([], None)


PROMOTION = """
import numpy as np
import torch

model = torch.nn.Linear(4, 4)
scale = torch.from_numpy(np.full((4,), 2.0))  # made
out = model(torch.randn(2, 4))
loss = (out * scale).sum()  # promote
loss.backward()
"""


def test_first_float64_promotion_names_the_op_and_the_line_that_made_the_float64_tensor(nantrace: NanTrace) -> None:
    script, text = nantrace.write("promote.py", PROMOTION)
    code, doc, _ = nantrace.json(str(script))
    assert code == 0  # a warning-level finding: exit 0 unless --fail-on warn
    assert doc["status"] == "clean"
    assert len(doc["promotions"]) == 1
    promotion = doc["promotions"][0]
    # float32 (4-wide Linear output) times a float64 numpy array: torch promotes the product to float64.
    assert (promotion["op"], promotion["dtype"], promotion["dominant"]) == ("aten.mul.Tensor", "float64", "float32")
    assert promotion["phase"] == "forward"
    assert promotion["module"] is None
    assert promotion["location"]["line"] == line_of(text, "promote")
    assert promotion["created"]["line"] == line_of(text, "made")
    assert [(a["name"], a["dtype"], a["shape"]) for a in promotion["inputs"]] == [
        ("self", "float32", [2, 4]),
        ("other", "float64", [4]),
    ]
    assert _arg(promotion, "other")["created_by"] == "aten.lift_fresh.default"
    code, _, _ = nantrace.json(str(script), "--fail-on", "warn")
    assert code == 1


def test_promotion_in_factory_mode_uses_the_models_dtype_and_a_cast_as_the_origin(
    nantrace: NanTrace, tmp_path: Path
) -> None:
    factory, text = nantrace.write(
        "fact.py",
        """
        import torch

        def loss_fn(out):
            wide = out.double()  # cast
            return wide.pow(2).mean()  # widened

        def make():
            return torch.nn.Linear(3, 2), torch.randn(4, 3), loss_fn
        """,
    )
    code, doc, _ = nantrace.json(f"{factory}:make", "--steps", "1")
    assert code == 0
    (promotion,) = doc["promotions"]
    assert (promotion["op"], promotion["dominant"]) == ("aten.pow.Tensor_Scalar", "float32")
    assert promotion["location"]["line"] == line_of(text, "widened")
    assert promotion["created"]["line"] == line_of(text, "cast")
    assert promotion["inputs"][0]["created_by"] == "aten._to_copy.default"


def test_float64_program_is_not_a_promotion(nantrace: NanTrace, tmp_path: Path) -> None:
    script, _ = nantrace.write(
        "all64.py",
        """
        import torch

        torch.set_default_dtype(torch.float64)
        model = torch.nn.Linear(4, 4)
        model(torch.randn(2, 4)).sum().backward()
        """,
    )
    code, doc, _ = nantrace.json(str(script))
    assert (code, doc["promotions"]) == (0, [])


HALF_MODEL = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)  # call

net = Net().half()  # half
batch = torch.randn(2, 8)  # made
net(batch)
"""


def test_half_model_fed_float32_exits_3_with_the_explanation_in_the_document(nantrace: NanTrace, cli: Any) -> None:
    script, text = nantrace.write("half.py", HALF_MODEL)
    result = cli("nan-trace", str(script), "--format", "json")
    assert result.exit_code == 3
    doc = result.json()
    assert doc["status"] == "error"
    error = doc["dtype_error"]
    assert error["exception"] == "RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half"
    assert (error["op"], error["module"], error["module_type"]) == ("aten.addmm.default", "fc", "Linear")
    assert error["location"]["line"] == line_of(text, "call")
    # addmm(bias, input, weight.t()): Linear(8, 4) in half, fed a (2, 8) float32 batch.
    assert [(a["name"], a["dtype"], a["shape"], a["parameter"]) for a in error["inputs"]] == [
        ("self", "float16", [4], "fc.bias"),
        ("mat1", "float32", [2, 8], None),
        ("mat2", "float16", [8, 4], "fc.weight"),
    ]
    assert (error["expected"], error["odd"]) == ("float16", ["mat1"])
    assert _arg(error, "mat1")["created"]["line"] == line_of(text, "made")
    assert _arg(error, "mat1")["created_by"] == "aten.randn.default"
    # The parameters became float16 at .half(): that cast is where their dtype came from.
    assert _arg(error, "mat2")["created"]["line"] == line_of(text, "half")
    assert error["fix"] == (
        f"cast `x` with `x.to(torch.float16)` before `self.fc` (line {line_of(text, 'call')}), or where it is "
        f"created (half.py:{line_of(text, 'made')}); or keep the model in float32 with `model.float()`"
    )
    # stderr: one error line carrying the fix; the full explanation is in the document.
    line = (
        "error: half.py died of a dtype mismatch: RuntimeError: mat1 and mat2 must have the same dtype, "
        f"but got Float and Half; fix: {error['fix']}"
    )
    assert result.stderr == line + "\n"
    # --traceback: the script's own frames before it (no torch internals).
    result = cli("nan-trace", str(script), "--format", "json", "--traceback")
    assert result.exit_code == 3
    assert "site-packages/torch" not in result.stderr
    assert f'File "{script}", line {line_of(text, "call")}, in forward' in result.stderr
    assert "<- the odd one" not in result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == line


def test_table_shows_the_dtype_error_panel_and_stderr_keeps_only_the_error_line(nantrace: NanTrace, cli: Any) -> None:
    script, _ = nantrace.write("half.py", HALF_MODEL)
    result = cli("nan-trace", str(script))
    assert result.exit_code == 3
    assert "dtype mismatch" in result.stdout
    assert "x.to(torch.float16)" in result.stdout
    assert "<- the odd one" not in result.stderr  # not said twice
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: half.py died of a dtype mismatch")


def test_sequential_layer_error_names_the_variable_at_the_models_call(nantrace: NanTrace, tmp_path: Path) -> None:
    script, text = nantrace.write(
        "seq.py",
        """
        import torch

        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        features = torch.randn(4, 8, dtype=torch.float64)  # made
        model(features)  # call
        """,
    )
    code, doc, _ = nantrace.json(str(script))
    assert code == 3
    error = doc["dtype_error"]
    assert (error["module"], error["module_type"], error["expected"]) == ("0", "Linear", "float32")
    assert error["fix"] == (
        f"cast `features` with `features.to(torch.float32)` before `model` (line {line_of(text, 'call')}), or "
        f"where it is created (seq.py:{line_of(text, 'made')}); or keep the model in float64 with `model.double()`"
    )


def test_conv_input_bias_check_raised_before_any_op_is_explained_from_the_module(
    nantrace: NanTrace, tmp_path: Path
) -> None:
    script, text = nantrace.write(
        "conv.py",
        """
        import numpy as np
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(1, 2, 3)

            def forward(self, image):
                return self.conv(image)  # call

        net = Net()
        batch = torch.tensor(np.zeros((1, 1, 5, 5)))  # made
        net(batch)
        """,
    )
    code, doc, _ = nantrace.json(str(script))
    assert code == 3
    error = doc["dtype_error"]
    assert error["exception"] == "RuntimeError: Input type (double) and bias type (float) should be the same"
    assert (error["op"], error["module"], error["module_type"]) == (None, "conv", "Conv2d")
    assert error["location"]["line"] == line_of(text, "call")
    assert [(a["name"], a["dtype"], a["shape"], a["parameter"]) for a in error["inputs"]] == [
        ("input", "float64", [1, 1, 5, 5], None),
        ("weight", "float32", [2, 1, 3, 3], "conv.weight"),
        ("bias", "float32", [2], "conv.bias"),
    ]
    assert error["odd"] == ["input"]
    assert _arg(error, "input")["created"]["line"] == line_of(text, "made")
    assert error["fix"].startswith("cast `image` with `image.to(torch.float32)` before `self.conv` (line ")


def test_index_put_and_masked_fill_errors_outside_modules(nantrace: NanTrace, tmp_path: Path) -> None:
    script, text = nantrace.write(
        "put.py",
        """
        import torch

        buf = torch.zeros(5)
        vals = torch.ones(2, dtype=torch.float64)  # made
        buf[torch.tensor([0, 1])] = vals  # put
        """,
    )
    code, doc, _ = nantrace.json(str(script))
    assert code == 3
    error = doc["dtype_error"]
    assert (error["op"], error["module"]) == ("aten.index_put_.default", None)
    assert error["location"]["line"] == line_of(text, "put")
    assert [(a["name"], a["dtype"]) for a in error["inputs"]] == [
        ("self", "float32"),
        ("indices[0]", "int64"),
        ("values", "float64"),
    ]
    assert (error["expected"], error["odd"]) == ("float32", ["values"])
    assert _arg(error, "values")["created"]["line"] == line_of(text, "made")
    assert _arg(error, "values")["created_by"] == "aten.ones.default"

    script, text = nantrace.write(
        "mask.py",
        """
        import torch

        scores = torch.randn(3)
        mask = torch.tensor([1, 0, 1])
        scores.masked_fill(mask, 0.0)  # fill
        """,
    )
    code, doc, _ = nantrace.json(str(script))
    assert code == 3
    error = doc["dtype_error"]
    assert (error["op"], error["expected"], error["odd"]) == ("aten.masked_fill.Scalar", "bool", ["mask"])
    assert error["fix"] == "make `mask` boolean with `.bool()`"
    assert error["location"]["line"] == line_of(text, "fill")


def test_other_errors_still_exit_3_with_the_plain_traceback_and_no_document(nantrace: NanTrace, cli: Any) -> None:
    script, _ = nantrace.write("shape.py", "import torch\ntorch.ones(2, 3) @ torch.ones(2, 3)\n")
    result = cli("nan-trace", str(script), "--format", "json")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert "mat1 and mat2 shapes cannot be multiplied" in result.stderr


def _traced_mixed_step(model: torch.nn.Module, handles: list[TraceHandle]) -> None:
    with dtypecheck.trace(model) as t:
        handles.append(t)
        offset = torch.ones(2, dtype=torch.float64)  # api-made
        wide = model(torch.randn(3, 4)) + offset  # api-promote
        torch.set_default_dtype(torch.float64)  # api-set
        model(wide)  # api-call


def test_python_api_records_changes_promotion_and_the_error_then_reraises() -> None:
    handles: list[TraceHandle] = []
    try:
        with pytest.raises(RuntimeError, match="same dtype") as raised:
            _traced_mixed_step(torch.nn.Linear(4, 2), handles)
    finally:
        torch.set_default_dtype(torch.float32)  # the API leaves the user's own change in place
    report = handles[0].report
    here = Path(__file__).read_text(encoding="utf-8")
    assert report.status == "error"
    assert report.default_dtype is not None
    (change,) = report.default_dtype.changes
    assert (change.old, change.new, change.call) == ("float32", "float64", "torch.set_default_dtype")
    assert change.location is not None
    assert change.location.line == line_of(here, "api-set")
    (promotion,) = report.promotions
    assert (promotion.op, promotion.dominant) == ("aten.add.Tensor", "float32")
    assert promotion.location is not None
    assert promotion.location.line == line_of(here, "api-promote")
    assert promotion.created is not None
    assert promotion.created.line == line_of(here, "api-made")
    error = report.dtype_error
    assert error is not None
    assert error.exception == f"RuntimeError: {raised.value}"
    assert (error.op, error.module, error.expected, error.odd) == ("aten.addmm.default", "", "float32", ("mat1",))
    assert error.location is not None
    assert error.location.line == line_of(here, "api-call")
    assert error.fix.startswith("cast `wide` with `wide.to(torch.float32)` before `model` (line ")


def test_python_api_non_dtype_error_is_reraised_without_an_explanation() -> None:
    with pytest.raises(ValueError, match="boom"), dtypecheck.trace() as t:
        raise ValueError("boom")
    assert t.report.dtype_error is None
    assert t.report.status == "clean"


def _dtype_report() -> NanTraceReport:
    call = Location("/work/train.py", 12, "forward", "return self.fc(x)")
    made = Location("/work/train.py", 20, "<module>", "x = torch.from_numpy(batch)")
    inputs = (
        TensorArg("self", "float32", (4,), "fc.bias", Location("/work/train.py", 7, "__init__", ""), "aten.empty"),
        TensorArg("mat1", "float64", (2, 8), None, made, "aten.lift_fresh.default"),
        TensorArg("mat2", "float32", (8, 4), "fc.weight", None, None),
    )
    error = DtypeError(
        exception="RuntimeError: mat1 and mat2 must have the same dtype, but got Double and Float",
        op="aten.addmm.default",
        module="fc",
        module_type="Linear",
        location=call,
        inputs=inputs,
        expected="float32",
        odd=("mat1",),
        fix="cast `x` with `x.to(torch.float32)` before `self.fc` (line 12); or keep the model in float64 with "
        "`model.double()`",
        traceback="Traceback (most recent call last):\n",
    )
    promotion = Promotion(
        op="aten.mul.Tensor",
        phase="forward",
        module=None,
        dtype="float64",
        dominant="float32",
        inputs=inputs[1:2],
        location=Location("/work/train.py", 21, "<module>", "y = x * 2"),
        created=made,
        step=1,
        op_index=9,
    )
    default = DefaultDtype(
        "float32",
        "float64",
        (DefaultDtypeChange("float32", "float64", "torch.set_default_dtype", Location("/work/train.py", 3, "", "")),),
    )
    return NanTraceReport(
        status="error",
        first=None,
        warnings=(),
        ops=40,
        steps=0,
        source="/work/train.py",
        default_dtype=default,
        promotions=(promotion,),
        dtype_error=error,
    )


def test_dtype_table_golden(golden: Callable[[str, str], None]) -> None:
    golden("nantrace_dtypes.txt", render(_dtype_report(), OutputFormat.table, width=120))


def test_explanation_text_lists_inputs_and_marks_the_odd_one() -> None:
    error = _dtype_report().dtype_error
    assert error is not None
    assert explanation_text(error).splitlines() == [
        "dtype mismatch in aten.addmm.default in module fc (Linear) at train.py:12",
        "    return self.fc(x)",
        "  self  float32  (4,)    fc.bias    created at train.py:7 by aten.empty",
        "  mat1  float64  (2, 8)             created at train.py:20 by aten.lift_fresh.default  <- the odd one",
        "  mat2  float32  (8, 4)  fc.weight",
        "  expected float32",
        "  fix: cast `x` with `x.to(torch.float32)` before `self.fc` (line 12); or keep the model in float64 with "
        "`model.double()`",
    ]


def test_promotion_alone_is_a_warning_level() -> None:
    report = _dtype_report()
    warn_only = dataclasses.replace(report, status="clean", dtype_error=None)
    assert warn_only.level == "warn"
    assert dataclasses.replace(warn_only, promotions=()).level == "ok"


def test_factory_mode_dtype_error_blames_the_model_not_the_command_line(nantrace: NanTrace, tmp_path: Path) -> None:
    factory, _ = nantrace.write(
        "fact_half.py",
        """
        import torch

        def make():
            return torch.nn.Linear(3, 2).half(), torch.randn(4, 3)
        """,
    )
    code, doc, _ = nantrace.json(f"{factory}:make")
    assert code == 3
    error = doc["dtype_error"]
    assert (error["op"], error["module"], error["module_type"]) == ("aten.addmm.default", "", "Linear")
    # dtypecheck itself called the model: there is no user line (never typer's or click's).
    assert error["location"] is None
    assert [(a["name"], a["dtype"], a["parameter"]) for a in error["inputs"]] == [
        ("self", "float16", "bias"),
        ("mat1", "float32", None),
        ("mat2", "float16", "weight"),
    ]
    assert error["fix"] == (
        "cast the `mat1` argument with `.to(torch.float16)` before the model; or keep the model in float32 with "
        "`model.float()`"
    )


@pytest.mark.parametrize(
    "message",
    [
        "expected mat1 and mat2 to have the same dtype, but got: float != c10::Half",
        "expected scalar type Float but found Double",
        "Input type (double) and bias type (float) should be the same",
        "Index put requires the source and destination dtypes match, got Float for the destination and Double",
        "mixed dtype (CPU): all inputs must share same datatype.",
    ],
)
def test_torch_dtype_mismatch_messages_are_recognised(message: str) -> None:
    assert is_dtype_error(RuntimeError(message))


def test_shape_errors_are_not_dtype_errors() -> None:
    assert not is_dtype_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)"))
    assert not is_dtype_error(ValueError("expected scalar type Float but found Double"))


def _bmm_half_by_float() -> None:
    left = torch.randn(1, 2, 2).half()  # bmm-left
    right = torch.randn(1, 2, 2)
    torch.bmm(left, right)  # bmm-call


def _embedding_with_float_ids() -> None:
    table = torch.nn.Embedding(10, 4)
    ids = torch.tensor([1.0, 2.0])  # ids-made
    table(ids)  # ids-call


@pytest.mark.parametrize(
    ("block", "op", "odd", "expected", "made", "call", "fix"),
    [
        (
            _bmm_half_by_float,
            "aten.bmm.default",
            ("self",),
            "float32",  # no model: the program's dtype is the first float op's (randn's float32)
            "bmm-left",  # made float16 by .half(): the cast is where its dtype came from
            "bmm-call",
            "cast the `self` argument with `.to(torch.float32)`, or where it is created (test_dtypes.py:{made})",
        ),
        (
            _embedding_with_float_ids,
            "aten.embedding.default",
            ("indices",),
            "int64",
            "ids-made",
            "ids-call",
            "cast `indices` to integers with `.long()`",
        ),
    ],
)
def test_python_api_explains_errors_outside_and_inside_modules(
    block: Callable[[], None],
    op: str,
    odd: tuple[str, ...],
    expected: str,
    made: str,
    call: str,
    fix: str,
) -> None:
    here = Path(__file__).read_text(encoding="utf-8")
    with pytest.raises(RuntimeError), dtypecheck.trace() as t:
        block()
    error = t.report.dtype_error
    assert error is not None
    made_line = line_of(here, made) if made is not None else None
    assert (error.op, error.odd, error.expected) == (op, odd, expected)
    assert error.fix == fix.format(made=made_line)
    assert error.location is not None
    assert error.location.line == line_of(here, call)
    (odd_arg,) = [a for a in error.inputs if a.name in odd]
    assert odd_arg.created is not None
    assert odd_arg.created.line == made_line
