"""estimate-memory runs fake tensors without importing torch._dynamo, and leaves torch whole for what comes after.

Each check runs in a process of its own: whether ``torch._dynamo`` is imported is a property of the process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._forks import run_each_forked
from tests.memory._fixtures import DECODER

DEEP = {**DECODER, "num_hidden_layers": 6}  # deeper than the shallow traces: the extrapolated path


def _python(code: str, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


ESTIMATE = """
    import json, sys
    if sys.argv[2] == "dynamo-first":
        import torch._dynamo
    from dtypecheck.memory import estimate_memory
    report = estimate_memory(sys.argv[1])
    print(json.dumps({
        "totals": [row.bytes.total for row in report.estimates],
        "dynamo": "torch._dynamo.convert_frame" in sys.modules,
    }))
"""

AFTER = """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    raw = FakeTensorMode.__dict__["__torch_dispatch__"].__wrapped__
    served_as_is = getattr(raw, "__dynamo_disable", None) is raw
    compiling = torch._dynamo.is_compiling()  # an attribute the stand-in does not hold: the real package loads
    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.arange(3.0)).tolist()
    print(json.dumps({
        "served_as_is": served_as_is,
        "compiling": compiling,
        "real": type(torch._dynamo).__name__ == "module" and sys.modules["torch._dynamo"] is torch._dynamo,
        "one_config": torch._dynamo.config is sys.modules["torch._dynamo.config"],
        "compiled": compiled,
        "frame_now": getattr(raw, "__dynamo_disable", None) not in (None, raw),
    }))
"""
"""Run after ``ESTIMATE`` in the same process: what comes after an estimate finds torch whole."""


@pytest.fixture(scope="module")
def deep_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("deep")
    (folder / "config.json").write_text(json.dumps(DEEP), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def fresh_estimate(deep_config: Path) -> list[dict[str, object]]:
    """One fresh interpreter that estimates (``ESTIMATE``, printing what it imported at that point) and then uses
    torch's dynamo (``AFTER``): the two documents it printed, in order. Each estimate traces a 6-block model, so
    the two tests below share this process rather than start one each."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ESTIMATE) + textwrap.dedent(AFTER), str(deep_config), "fresh"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()[-2:]]


def test_a_config_estimate_does_not_import_dynamo_and_equals_one_made_with_it(
    deep_config: Path, fresh_estimate: list[dict[str, object]]
) -> None:
    without = fresh_estimate[0]
    with_dynamo = _python(ESTIMATE, str(deep_config), "dynamo-first")
    assert without["dynamo"] is False
    assert with_dynamo["dynamo"] is True
    assert without["totals"] == with_dynamo["totals"]
    totals = without["totals"]
    assert isinstance(totals, list)
    assert len(totals) == 9  # the default grid


def test_torch_dynamo_is_whole_after_an_estimate(fresh_estimate: list[dict[str, object]]) -> None:
    assert fresh_estimate[1] == {
        "served_as_is": True,  # during the estimate, no dynamo-disable frame was built
        "compiling": False,
        "real": True,
        "one_config": True,
        "compiled": [1.0, 3.0, 5.0],
        "frame_now": True,  # the first dispatch after the real import built the real frame
    }


UNDER_THE_STAND_IN = """
import torch
from dtypecheck.lazy_dynamo import defer_dynamo_import
defer_dynamo_import()
"""
"""What each check below starts from: torch imported, its dynamo package a stand-in."""

SUBMODULE = """
import importlib.util, json, sys
stand_in = torch._dynamo
spec = importlib.util.find_spec("torch._dynamo")
before = "torch._dynamo.convert_frame" in sys.modules
from torch._dynamo.source import ConstantSource
import torch._dynamo.source as again
module = sys.modules["torch._dynamo.source"]
print(json.dumps({
    "spec": spec.name,
    "stand_in": type(stand_in).__name__,
    "before": before,
    "real": sys.modules["torch._dynamo"] is torch._dynamo and type(torch._dynamo).__name__ == "module",
    "same": again is module and torch._dynamo.source is module and ConstantSource is module.ConstantSource,
    "module_spec": module.__spec__.name,
    "works": ConstantSource("x").source_name,
}))
"""

# torch.compiler.disable at a class definition (transformers does this) must give a function dynamo skips for good,
# not the function itself: the stand-in serves only torch's own lazy wrappers.
DISABLE = """
import json, sys
def step(x):
    return x + 1
disabled = torch.compiler.disable(step, reason="views")
print(json.dumps({
    "wrapped": disabled is not step,
    "real": type(sys.modules["torch._dynamo"]).__name__ == "module",
    "value": disabled(torch.ones(1)).item(),
}))
"""


@pytest.fixture(scope="module")
def under_the_stand_in() -> dict[str, dict[str, object]]:
    """``SUBMODULE`` and ``DISABLE``, each in a process of its own forked from one fresh interpreter that ran
    ``UNDER_THE_STAND_IN`` (``tests/_forks.py``): each imports the real dynamo package for good, so neither may
    follow the other, but they need not import torch each: name -> the document it printed."""
    checks = {"submodule": SUBMODULE, "disable": DISABLE}
    done = run_each_forked(UNDER_THE_STAND_IN, [(code, ["-c"]) for code in checks.values()], timeout=300)
    for name, child in zip(checks, done, strict=True):
        assert child.returncode == 0, (name, child.stderr)
    return {name: json.loads(child.stdout.splitlines()[-1]) for name, child in zip(checks, done, strict=True)}


def test_a_dynamo_submodule_imported_under_the_stand_in_is_loaded_once_by_the_real_package(
    under_the_stand_in: dict[str, dict[str, object]],
) -> None:
    assert under_the_stand_in["submodule"] == {
        "spec": "torch._dynamo",
        "stand_in": "_StandIn",
        "before": False,
        "real": True,
        "same": True,
        "module_spec": "torch._dynamo.source",
        "works": "x",
    }


def test_a_decorator_disabling_dynamo_under_the_stand_in_gets_the_real_disable(
    under_the_stand_in: dict[str, dict[str, object]],
) -> None:
    assert under_the_stand_in["disable"] == {"wrapped": True, "real": True, "value": 2.0}
