"""The full trace's per-op path in C++ (``native/dispatch.cpp``, issue 30.5) reports what the Python mode reports.

Every program below is traced twice through the CLI, with the C++ path (the default) and with
``DTYPECHECK_NATIVE_DISPATCH=0`` (the Python dispatch mode takes every op), and the two JSON reports are compared
whole. Two fields are left out, ``ops`` and the events' ``op_index``: the Python mode keeps each op's output alive
until its window is judged, so autograd's ``AccumulateGrad`` copies a gradient it would otherwise take over
(``new_empty_strided`` and ``copy_``, more ops); the C++ path keeps nothing and runs the plain run's ops, which
``test_it_counts_the_ops_the_plain_run_runs`` checks against a mode that only counts.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dtypecheck
from dtypecheck.nantrace import native
from tests.nantrace._scripts import NanTrace, line_of
from tests.nantrace.test_consequences import MASKED

SMALL_MODEL = """
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.norm(self.fc(x)))


torch.manual_seed(0)
model = torch.nn.Sequential(*(Block() for _ in range(3)), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(1, 9):
    x = torch.randn(4, 16)
    if step == BAD:
        x = x * SCALE
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""

IN_PLACE_ON_OUTPUT = """
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        out = self.fc(x)  # the linear
        out += x  # in place
        return out


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), Block())
with torch.no_grad():
    model[0].weight.mul_(1e-30)
    model[0].bias.mul_(1e-30)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-35)
for step in range(1, 5):
    if step == 4:
        with torch.no_grad():
            model[1].fc.weight.fill_(1e38)
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()  # backward
    optimizer.step()
    optimizer.zero_grad()
"""

PROGRAMS: dict[str, str] = {
    # A clean run: nothing to report but the counts.
    "clean": SMALL_MODEL.replace("BAD", "0").replace("SCALE", "1.0"),
    # An input of 1e38 at step 6: near overflow, then inf in the forward, after five clean steps.
    "late overflow": SMALL_MODEL.replace("BAD", "6").replace("SCALE", "1e38"),
    # An input of 1e18 at step 4: the square of the loss overflows in backward and reaches the update.
    "backward overflow": SMALL_MODEL.replace("BAD", "4").replace("SCALE", "1e18"),
    # torch.where masks a log of negatives (a note each step); the norm of zeros divides 0 by 0 in backward.
    "masked": MASKED,
    # An in-place chain whose third link overflows on its third run.
    "in-place chain": """
import torch

for scale in (1.0, 1.0, 1e20):
    x = torch.full((4,), 1e18)
    y = x * 1e10
    y.add_(1.0)
    y.mul_(scale)
    y.sub_(1.0)
print((y * 2).sum())
""",
    # The optimizer writes inf into a parameter (no module, no grad: the owner is named), at its fifth step.
    "update overflow": """
import torch

weight = torch.nn.Parameter(torch.tensor([3e38, 2e38, 1.0]))
optimizer = torch.optim.SGD([weight], lr=1e37)
for step in range(6):
    weight.grad = torch.full((3,), -1.0)
    optimizer.step()
""",
    # float16 Adam with an eps too small for float16: 0 / 0 in the update.
    "fp16 adam": """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 8).half()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8)
for step in range(4):
    x = torch.randn(16, 8).half()
    loss = model(x).float().pow(2).mean()
    loss.backward()
    with torch.no_grad():
        model.weight.grad[0].zero_()
    optimizer.step()
    optimizer.zero_grad()
""",
    # bfloat16 values that float32 keeps but bfloat16 flushes, and a log of zero, after clean bfloat16 steps.
    "bf16 underflow": """
import torch

x = torch.full((64,), 1e-20, dtype=torch.bfloat16)
for step in range(3):
    y = (x * 1e20 + 1.0).sqrt()
tiny = x * x
print(tiny.sum())
z = torch.log(torch.zeros(4, dtype=torch.bfloat16))
print(z)
""",
    # A float64 constant promotes a float32 program, then a NaN in the data is read, after clean steps.
    "promotion and data": """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
clean = torch.ones(1, 4)
for step in range(3):
    (model(clean) * 2.0).sum().backward()
scale = torch.tensor([2.0], dtype=torch.float64)
promoted = model(clean) * scale
data = torch.tensor([[1.0, float("nan"), 2.0, 3.0]])
model(data).sum().backward()
""",
    # An in-place op on a fresh forward output (a residual ``+=``), then inf in that forward op's backward: the
    # linear's node must carry its line though the output's node is the add's by the time the window is judged.
    "in-place on a fresh output": IN_PLACE_ON_OUTPUT,
    # A dtype mismatch kills the run: explained, not a traceback.
    "dtype error": """
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
x = torch.randn(2, 4, dtype=torch.float64)
model(torch.randn(2, 4)).sum().backward()
model(x)
""",
}


class Counting(TorchDispatchMode):
    """A mode that only counts the ops it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def dispatch_module(native_module: ModuleType) -> ModuleType:
    """The compiled per-op path (``native_module`` built both)."""
    native._load_dispatch_once.cache_clear()
    loaded = native.load_dispatch()
    assert loaded is not None, "native/dispatch.cpp did not build against this torch"
    return loaded


def _without_op_counts(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_op_counts(v) for k, v in value.items() if k not in ("ops", "op_index")}
    if isinstance(value, list):
        return [_without_op_counts(v) for v in value]
    return value


def _trace(
    nantrace: NanTrace, monkeypatch: pytest.MonkeyPatch, name: str, dispatch: bool, *options: str
) -> tuple[int, Any]:
    monkeypatch.setenv("DTYPECHECK_NATIVE_DISPATCH", "1" if dispatch else "0")
    script, _ = nantrace.write(name.replace(" ", "_") + ".py", PROGRAMS[name])
    code, doc, _ = nantrace.json(*options, str(script))
    return code, doc


CASES = [(name, ()) for name in sorted(PROGRAMS)] + [
    (name, ("--keep-going",)) for name in ("backward overflow", "fp16 adam", "late overflow", "masked")
]
"""Each program as the CLI runs it (stopping at the first failure), and those with several producers also with
``--keep-going`` (every producer followed to the end)."""


@pytest.mark.parametrize(("name", "options"), CASES, ids=[" ".join((n, *o)) for n, o in CASES])
def test_the_c_path_reports_what_the_python_mode_reports(
    name: str,
    options: tuple[str, ...],
    nantrace: NanTrace,
    monkeypatch: pytest.MonkeyPatch,
    dispatch_module: ModuleType,
) -> None:
    python_code, python_doc = _trace(nantrace, monkeypatch, name, False, *options)
    code, doc = _trace(nantrace, monkeypatch, name, True, *options)
    ran, _, _ = dispatch_module.stats()
    assert ran > 0  # the C++ path took ops: the comparison is not the Python mode against itself
    assert code == python_code
    assert _without_op_counts(doc) == _without_op_counts(python_doc)
    expected = {"clean": "clean", "masked": "clean", "dtype error": "error"}.get(name, "nonfinite")
    assert doc["status"] == expected


def test_programs_cover_every_kind_of_finding(nantrace: NanTrace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The corpus above is only worth comparing if it makes each thing the judge reports: checked here on the
    Python mode's reports (what the C++ path must then match)."""
    kinds: set[str] = set()
    for name in PROGRAMS:
        _, doc = _trace(nantrace, monkeypatch, name, dispatch=False)
        kinds |= {e["kind"] for e in doc["events"]} | {w["kind"] for w in doc["warnings"]}
        kinds |= {f"handled {e['consequence']}" for e in doc["handled"]}
        kinds |= {"promotion"} if doc["promotions"] else set()
        kinds |= {"dtype_mismatch"} if doc["dtype_error"] else set()
        kinds |= {"history"} if any(e["history"] for e in doc["events"]) else set()
    assert kinds >= {
        "nan",
        "inf",
        "near_overflow",
        "underflow",
        "handled masked",
        "promotion",
        "dtype_mismatch",
        "history",
    }


def test_it_counts_the_ops_the_plain_run_runs(dispatch_module: ModuleType) -> None:
    """A mode that only counts keeps nothing alive, so autograd runs the plain run's ops under it: the C++ path's
    count is that count (two steps of a small model: forward, backward and AdamW's update). The inputs and the
    loss's gradient are made before tracing: a tensor made under tracing is remembered by the dtype watch, whose
    look at it is an op of its own (``detach``) in both of the tracer's paths."""
    inputs = [torch.randn(4, 8) for _ in range(2)]
    one = torch.ones(())

    def steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        for x in inputs:
            model(x).pow(2).mean().backward(one)
            optimizer.step()
            optimizer.zero_grad()

    def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
        return model, torch.optim.AdamW(model.parameters())

    model, optimizer = fresh()
    counting = Counting()
    with counting:
        steps(model, optimizer)
    model, optimizer = fresh()
    with dtypecheck.trace(model) as traced:
        steps(model, optimizer)
    assert traced.report.status == "clean"
    assert dispatch_module.stats()[0] > 0
    assert traced.report.ops == counting.ops


def test_a_steady_step_runs_every_op_in_c_including_each_phase_s_first(dispatch_module: ModuleType) -> None:
    """Once the C++ path knows a loop's ops, a clean step hands none to the Python mode: not the first op of
    backward nor the update's first (``profiler._record_function_enter_new``), where the window is judged
    (``Tracer._phase_changed``, called from C++). Each such hand-over cost a Python op a phase change."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    inputs = [torch.randn(4, 8) for _ in range(4)]
    with dtypecheck.trace(model) as traced:
        for step, x in enumerate(inputs):
            if step == 2:
                ran, forwarded, _ = dispatch_module.stats()
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        later = dispatch_module.stats()
    assert traced.report.status == "clean"
    assert later[0] > ran
    assert later[1] == forwarded


def test_autocast_and_a_nested_tracer_leave_the_ops_to_the_python_mode(dispatch_module: ModuleType) -> None:
    """Autocast's fall-through rule (autocast.py) lives in Python: once autocast may be on, no op runs in C++. A
    tracer inside another gets the Python mode (the hook marks one mode at a time)."""
    model = torch.nn.Linear(4, 4)
    with dtypecheck.trace(model) as traced, torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(2, 4)).float().sum().backward()
    assert traced.report.status == "clean"
    assert dispatch_module.stats()[0] == 0
    with dtypecheck.trace(model) as outer, dtypecheck.trace(model) as inner:
        torch.log(model(torch.randn(2, 4)) - 100.0)
    for traced in (inner, outer):  # the outer mode is given what the inner one runs
        first = traced.report.first
        assert first is not None
        assert (first.kind, first.op) == ("nan", "aten.log.default")
    assert outer.report.ops >= inner.report.ops > 0


def test_a_failed_build_leaves_the_checks_and_the_python_mode(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, native_module: ModuleType
) -> None:
    """A torch whose interpreter interface differs does not compile dispatch.cpp: the failure is remembered in its
    folder (not retried at every run), the checks are still built, and no per-op path is loaded."""
    built = native.build_folder()
    monkeypatch.setattr(
        native, "build_folder", lambda source=native._SOURCE: built if source == native._SOURCE else tmp_path
    )

    def failing(source: Any, name: str, wait_s: float) -> Any:
        if source == native._DISPATCH_SOURCE:
            raise RuntimeError("Error building extension '_dtypecheck_dispatch': no member named 'vtable_'")
        return native._library(built)

    monkeypatch.setattr(native, "_build_one", failing)
    assert native.build() == native._library(built)
    assert "no member named 'vtable_'" in (tmp_path / "failed").read_text(encoding="utf-8")
    assert not native.dispatch_built()
    native._load_dispatch_once.cache_clear()
    try:
        assert native.load_dispatch() is None
    finally:
        native._load_dispatch_once.cache_clear()


LIBRARY_CALLS = """
import torch
import torch.nn.functional as F

torch.manual_seed(0)
x = torch.randn(4, 8)
for step in range(3):
    a = F.layer_norm(x, (8,))  # first call
    b = F.layer_norm(x * 2.0, (8,))  # second call
c = F.layer_norm(x, (8,))  # third call
print(torch.log(c - 10.0))  # the NaN
"""


def test_each_op_is_named_at_the_line_that_called_the_library(
    nantrace: NanTrace, monkeypatch: pytest.MonkeyPatch, dispatch_module: ModuleType
) -> None:
    """Ops issued from one library frame share a walk to the user's line (the C++ path keeps it for that frame);
    each new call of the same library function, from another line, is walked again. The history before the NaN
    names each layer_norm at its own line, as the Python mode does."""
    monkeypatch.setenv("DTYPECHECK_NATIVE_DISPATCH", "1")
    script, text = nantrace.write("library_calls.py", LIBRARY_CALLS)
    code, doc, _ = nantrace.json(str(script))
    assert code == 1
    assert dispatch_module.stats()[0] > 0
    lines = {name: line_of(text, name) for name in ("first call", "second call", "third call", "the NaN")}
    history = [(h["op"], h["location"]["line"]) for h in doc["first"]["history"]]
    norms = [line for op, line in history if op == "aten.native_layer_norm.default"]
    # Three outputs each (the result, the mean, the reciprocal deviation): the last loop's two calls, then the third.
    calls = ("first call", "second call", "third call")
    assert norms[-9:] == [lines[name] for name in calls for _ in range(3)]
    assert doc["first"]["location"]["line"] == lines["the NaN"]
    monkeypatch.setenv("DTYPECHECK_NATIVE_DISPATCH", "0")
    _, python_doc, _ = nantrace.json(str(script))
    assert _without_op_counts(doc) == _without_op_counts(python_doc)


def test_a_forward_ops_backward_is_named_at_its_line_after_an_in_place_op_on_its_output(
    nantrace: NanTrace, monkeypatch: pytest.MonkeyPatch, dispatch_module: ModuleType
) -> None:
    """``out = self.fc(x); out += x``: autograd gives ``out`` the linear's node once the linear returns, and the add's
    node once the add returns. Both paths tag the linear's node before the add returns, so the inf its backward
    makes at step 4 (its grad_input, 1 x 1e38 x 4, overflows float32) is named at the linear's line and module, not
    at ``backward()``'s. The Python mode used to tag at the window's judging, when only the add's node was left."""
    for dispatch in (True, False):
        monkeypatch.setenv("DTYPECHECK_NATIVE_DISPATCH", "1" if dispatch else "0")
        script, text = nantrace.write("in_place_on_output.py", IN_PLACE_ON_OUTPUT)
        code, doc, _ = nantrace.json(str(script))
        assert code == 1
        first = doc["first"]
        assert (first["kind"], first["op"], first["phase"], first["step"]) == ("inf", "aten.mm.default", "backward", 4)
        assert (first["module"], first["grad_fn"]) == ("1.fc", "AddmmBackward0")
        assert first["location"]["line"] == line_of(text, "the linear")
    assert dispatch_module.stats()[0] > 0


def _included() -> set[str]:
    """The names of this thread's included dispatch keys (``Fake`` has no Python binding of its own)."""
    text = str(torch._C._dispatch_tls_local_include_set())  # DispatchKeySet(BackendSelect, Fake, ...)
    return {name.strip() for name in text[text.index("(") + 1 : text.rindex(")")].split(",") if name.strip()}


def test_ops_come_in_below_the_python_key_and_the_thread_is_left_as_it_was(
    nantrace: NanTrace, monkeypatch: pytest.MonkeyPatch, dispatch_module: ModuleType
) -> None:
    """While the tracer's mode is on top, the thread's ops reach the C++ path through the ``Fake`` key's fallback
    instead of torch's Python keys (about a quarter of the full trace's overhead on small ops); after the trace the
    thread's included keys are what they were. ``DTYPECHECK_DISPATCH_KEY=0`` keeps torch's way, and the two reports
    agree whole, op counts included."""
    monkeypatch.delenv("DTYPECHECK_DISPATCH_KEY", raising=False)
    model = torch.nn.Linear(4, 4)
    before = _included()
    assert "Fake" not in before
    with dtypecheck.trace(model):
        model(torch.randn(2, 4)).sum().backward()  # autograd puts its copy of the thread's state back at the end:
        model(torch.randn(2, 4))  # the Python keys, until the next op through them switches again
        inside = _included()
    assert "Fake" in inside
    assert not inside & {"Python", "PythonTLSSnapshot"}
    assert _included() == before
    monkeypatch.setenv("DTYPECHECK_DISPATCH_KEY", "0")
    with dtypecheck.trace(model):
        model(torch.randn(2, 4)).sum().backward()
        inside = _included()
    assert "Fake" not in inside
    assert inside >= {"Python", "PythonTLSSnapshot"}
    assert _included() == before
    for name in ("late overflow", "fp16 adam"):
        _trace(nantrace, monkeypatch, name, True)  # the C++ path learns the program's ops (a first run hands
        # the ops it does not know yet to the Python mode, which keeps their outputs longer: other op counts)
        monkeypatch.setenv("DTYPECHECK_DISPATCH_KEY", "0")
        code, python_key = _trace(nantrace, monkeypatch, name, True)
        monkeypatch.delenv("DTYPECHECK_DISPATCH_KEY")
        assert _trace(nantrace, monkeypatch, name, True) == (code, python_key)


def test_a_mode_pushed_inside_the_trace_is_given_every_op(dispatch_module: ModuleType) -> None:
    """torch includes its Python keys only when a first mode is pushed: a mode pushed over the tracer's, while the
    tracer's ops come in through the ``Fake`` key, would never be called if the C++ path did not hand its ops
    back to torch's way. Counted against the same ops with no trace; the tracer still names the NaN after it."""
    model = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)

    def elementwise() -> torch.Tensor:
        return ((x * 2.0 + 1.0).exp() - 3.0).abs()

    alone = Counting()
    with alone, torch.no_grad():
        elementwise()
    with dtypecheck.trace(model) as traced:
        model(torch.randn(2, 4)).sum().backward()  # the tracer's ops now come in below the Python key
        inner = Counting()
        with inner, torch.no_grad():
            elementwise()
        torch.log(model(x) - 100.0)
    assert inner.ops == alone.ops == 5
    first = traced.report.first
    assert first is not None
    assert (first.kind, first.op) == ("nan", "aten.log.default")
