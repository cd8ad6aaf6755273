"""The tracer's fast paths (issue 23.3) report exactly what the slow ones did.

Each scenario runs under several read-back schedules: the default window, one op per window (every check read
back at once), a few ops per window, and CPU windows read back after every op's bytes (the 32 MiB CPU budget at
zero). The reports must be equal field for field (op, phase, module, line, cause, counts, history, warnings),
and the op, module, phase and line named are checked against the scenario's own marked lines.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from dtypecheck.nantrace import native as native_checks
from dtypecheck.nantrace import tracer as tracer_module
from dtypecheck.nantrace.judge import Judge
from dtypecheck.nantrace.report import NanTraceReport
from dtypecheck.nantrace.tracer import TraceOptions, Tracer
from tests.nantrace._scripts import line_of, subprocess_env

TEXT = Path(__file__).read_text(encoding="utf-8")


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(self.proj(x).relu())  # sqrt forward


def inf_born_in_backward() -> None:
    """sqrt's gradient at 0 is 1 / (2 * sqrt(0)) = inf: born in backward (SqrtBackward0's div), reported at the
    forward line that made the node, in the module that ran it."""
    torch.manual_seed(0)
    scaled = Scaled()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), scaled)
    with torch.no_grad():
        scaled.proj.weight.zero_()
        scaled.proj.bias.zero_()
    model(torch.randn(3, 4)).sum().backward()


def in_place_on_a_checked_tensor() -> None:
    """A chain of in-place ops on one checked tensor: the first op to overflow is named, not its neighbours."""
    x = torch.full((4,), 1e18)
    y = x * 1e10  # checked: 1e28, a near overflow at warn_frac 1e-11
    y.add_(1.0)
    y.mul_(1e20)  # in-place overflow
    y.sub_(1.0)
    (y * 2).sum()


def view_of_a_nonfinite_tensor() -> None:
    """Views pass a NaN on unchecked; the op that made it is still the one named."""
    x = torch.tensor([1.0, 3.0, 0.5, 4.0])
    z = torch.log(x - 2.0)  # log makes nan
    v = z.view(2, 2).t()[0]
    w = v.reshape(-1) * 2.0
    w.sum()


DATA = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])


def nan_in_data_read_through_views() -> None:
    """A NaN made before tracing, read through views (not checked): the first checked op to read it is named."""
    v = DATA.t().reshape(-1)[1:]
    (v + 1.0).sum()  # reads the data's nan


SCENARIOS: dict[str, tuple[Callable[[], None], str, str, str | None, str]] = {
    # name: (code, kind, op, module, marker of the reported line)
    "backward": (inf_born_in_backward, "inf", "aten.div.Tensor", "1", "sqrt forward"),
    "in_place": (in_place_on_a_checked_tensor, "inf", "aten.mul_.Tensor", None, "in-place overflow"),
    "view": (view_of_a_nonfinite_tensor, "nan", "aten.log.default", None, "log makes nan"),
    "data": (nan_in_data_read_through_views, "nan", "aten.add.Tensor", None, "reads the data's nan"),
}


def _traced(code: Callable[[], None], options: TraceOptions) -> NanTraceReport:
    with Tracer(options) as tracer:
        code()
    return tracer.report()


def _schedules() -> list[tuple[str, TraceOptions, int]]:
    """(name, options, CPU byte budget) of each read-back schedule."""
    default = tracer_module._CPU_HELD
    return [
        ("default", TraceOptions(warn_frac=1e-11), default),
        ("every op", TraceOptions(warn_frac=1e-11, window=1), default),
        ("three ops", TraceOptions(warn_frac=1e-11, window=3), default),
        ("cpu budget 0", TraceOptions(warn_frac=1e-11), 0),
    ]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_read_back_schedule_gives_the_same_report(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    code, kind, op, module, marker = SCENARIOS[name]
    reports = []
    for _, options, budget in _schedules():
        monkeypatch.setattr(tracer_module, "_CPU_HELD", budget)
        reports.append(_traced(code, options))
    first = reports[0].first
    assert first is not None
    assert (first.kind, first.op, first.module) == (kind, op, module)
    assert first.location is not None
    assert (first.location.file, first.location.line) == (__file__, line_of(TEXT, marker))
    assert first.phase == ("backward" if name == "backward" else "other")
    if name == "in_place":
        assert [(w.kind, w.op) for w in reports[0].warnings] == [("near_overflow", "aten.mul.Tensor")]
    for other in reports[1:]:
        # Everything the user reads; ``ops`` and ``stopped_early`` may differ (the run stops at a read-back).
        assert other.first == first
        assert other.events == reports[0].events
        assert other.warnings == reports[0].warnings
        assert other.handled == reports[0].handled
        assert other.status == reports[0].status


def test_history_before_an_in_place_overflow_names_the_ops_that_came_close() -> None:
    report = _traced(in_place_on_a_checked_tensor, TraceOptions(history=3))
    assert report.first is not None
    # full(1e18), y = x * 1e10, then add_ (1e28 + 1 rounds back to 1e28 in float32); mul_'s own output is the
    # event, not its history. Values as numpy's float32 arithmetic gives them.
    x = np.float32(1e18)
    y = float(x * np.float32(1e10))
    expected = [("aten.full.default", float(x)), ("aten.mul.Tensor", y), ("aten.add_.Tensor", y)]
    assert [(entry.op, entry.absmax) for entry in report.first.history] == expected
    assert [entry.phase for entry in report.first.history] == ["other"] * 3


def test_cpu_windows_are_read_back_once_they_hold_32_mib(monkeypatch: pytest.MonkeyPatch) -> None:
    windows: list[int] = []
    judge_window = Judge.judge_window

    def counting(self: Any, window: list[Any], native: Any = None) -> None:
        # With the C++ per-op path, the ops it ran count in the window too (its share, read before the reset).
        hook = native_checks.load_dispatch() if native is not None else None
        share = hook.counters()[0] if hook is not None else 0
        windows.append(len(window) + share)
        judge_window(self, window, native)

    monkeypatch.setattr(Judge, "judge_window", counting)
    x = torch.ones(1 << 21)  # 8 MiB of float32
    assert tracer_module._CPU_HELD == 32 << 20
    with Tracer() as tracer:
        for _ in range(9):
            x = x * 1.0  # each output 8 MiB: four of them fill the budget
    assert tracer.report().status == "clean"
    # The 4th and 7th outputs bring the window to 32 MiB: the three ops before each are judged (the op itself
    # opens the next window, its grad_fn not attached yet), and the last three at the end of tracing.
    assert windows == [3, 3, 3]


def test_checks_never_record_an_autograd_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the dispatch mode autograd is mostly excluded; where it is not (the ``detach`` autograd itself
    calls), a tensor that requires grad is detached before it is reduced."""
    seen: list[bool] = []
    original = tracer_module.Tracer.__init__

    def spying_init(self: Tracer, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._extrema = None  # torch's ops, which could record a graph (the C++ check reads memory only)
        reduce = self._aminmax

        def aminmax(tensor: torch.Tensor) -> Any:
            lo, hi = reduce(tensor)
            seen.append(lo.requires_grad or hi.requires_grad)
            return lo, hi

        self._aminmax = aminmax  # type: ignore[assignment]

    monkeypatch.setattr(tracer_module.Tracer, "__init__", spying_init)
    weight = torch.randn(3, requires_grad=True)
    with Tracer() as tracer:
        hidden = weight * 2
        hidden.add_(1.0)  # in-place on a tensor that requires grad: checked before and after
        hidden.exp().sum().backward()
    assert tracer.report().status == "clean"
    assert seen
    assert not any(seen)
    assert weight.grad is not None


def test_tracing_needs_neither_dynamo_nor_its_wrappers() -> None:
    """The dispatch mode is not wrapped in torch._dynamo.disable (two Python layers per op), and a traced block
    that compiles nothing never imports torch._dynamo."""
    code = (
        "import sys, torch\n"
        "from dtypecheck.nantrace.tracer import Tracer, _dispatch_mode_class\n"
        "with Tracer() as t:\n"
        "    (torch.ones(3) * 2).sum()\n"
        "wrapped = hasattr(_dispatch_mode_class().__torch_dispatch__, '_torchdynamo_disable')\n"
        "print(t.report().status, 'torch._dynamo' in sys.modules, wrapped)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(), check=True, timeout=120
    )
    assert done.stdout.split() == ["clean", "False", "False"]


def _counting_aminmax(monkeypatch: pytest.MonkeyPatch, *, native: bool = False) -> list[int]:
    """Patch every new tracer's reduction to count its calls (one list entry per call: the tensor's numel): torch's
    ``aminmax``, or with ``native`` the C++ check of a CPU tensor (which must then be there)."""
    calls: list[int] = []
    original = tracer_module.Tracer.__init__

    def counting_init(self: Tracer, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        reduce = self._aminmax
        read = self._extrema
        assert (read is not None) is native

        def aminmax(tensor: torch.Tensor) -> Any:
            calls.append(tensor.numel())
            return reduce(tensor)

        def extrema(tensor: torch.Tensor, tiny: float) -> Any:
            calls.append(tensor.numel())
            assert read is not None
            return read(tensor, tiny)

        self._aminmax = aminmax  # type: ignore[assignment]
        self._extrema = extrema if native else None

    monkeypatch.setattr(tracer_module.Tracer, "__init__", counting_init)
    return calls


@pytest.mark.parametrize("native", [False, True], ids=["torch", "native"])
def test_a_chain_of_in_place_ops_checks_each_link_once(
    monkeypatch: pytest.MonkeyPatch, native: bool, native_module: ModuleType
) -> None:
    """Each in-place op reads what the one before wrote: that op's check (its version counter taken as autograd
    left it) says what the next one reads, so the chain costs one reduction per op, not two. The same with torch's
    reductions and with the C++ check of a CPU tensor, in the Python dispatch mode (the C++ per-op path, which
    counts nothing here, is compared with it in test_native_dispatch)."""
    monkeypatch.setenv("DTYPECHECK_NATIVE_DISPATCH", "0")
    if not native:
        monkeypatch.setattr(native_checks, "load", lambda **_: None)
    calls = _counting_aminmax(monkeypatch, native=native)
    x = torch.ones(5)
    with Tracer() as tracer:
        y = x * 2.0  # 1 check (x is not checked: made before tracing and not overwritten)
        y.add_(1.0)  # reads y: the check above; writes y: 1 check
        y.mul_(2.0)  # reads add_'s output: its check; 1 check
        y.sub_(1.0)  # 1 check
    assert tracer.report().status == "clean"
    assert calls == [5, 5, 5, 5]
    assert torch.equal(y, torch.full((5,), 5.0))


def test_an_in_place_overflow_without_a_copy_still_has_its_counts() -> None:
    """The optimizer step keeps no copy of what it overwrites (too costly), so the op cannot be re-run from its
    inputs; its output, unchanged since, is read as it is. Hand-computed in float32 (max 3.4028e38): 3e38 + 3e38
    and 2e38 + 3e38 overflow to +inf, 1 + 3e38 stays finite."""
    weight = torch.nn.Parameter(torch.tensor([3e38, 2e38, 1.0]))
    optimizer = torch.optim.SGD([weight], lr=3e38)
    with Tracer() as tracer:
        weight.grad = torch.full((3,), -1.0)  # the update adds 3e38
        optimizer.step()
    first = tracer.report().first
    assert first is not None
    assert (first.kind, first.op, first.phase) == ("inf", "aten.add_.Tensor", "other")
    assert (first.counts.posinf, first.counts.neginf, first.counts.nan) == (2, 0, 0)
    assert first.consequence == "parameter"
