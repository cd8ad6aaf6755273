"""Watch mode's C++ checks (``dtypecheck.nantrace.native``) and the pure-Python checks they stand in for.

Both answer "is every value finite" for a list of tensors; each is checked against numpy's ``isfinite`` on the same
values, and watch mode's reports are compared field by field with the C++ checks on and off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from dtypecheck.nantrace import native
from dtypecheck.nantrace.watch import state
from tests.nantrace._scripts import NanTrace
from tests.nantrace.test_watch import EMA, MODES

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@pytest.fixture(scope="module")
def module() -> Iterator[ModuleType]:
    """The compiled module, built now if this machine has not built it yet (cached for the next run)."""
    if not native.compiler_available():
        pytest.skip("no C++ compiler or ninja on this machine: only the pure-Python checks can run")
    native.build()
    native._load_once.cache_clear()  # a lookup before the build found nothing
    loaded = native.load(build_in_background=False)
    assert loaded is not None
    yield loaded
    native._load_once.cache_clear()


def _planted(dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """Tensors of assorted sizes with the dtype's extremes (max, -max, smallest subnormal, -0.0), all finite."""
    generator = torch.Generator().manual_seed(seed)
    info = torch.finfo(dtype)
    tensors = [torch.randn(n, generator=generator).to(dtype) for n in (0, 1, 7, 64, 1000, 4097)]
    tensors[4][:4] = torch.tensor([info.max, -info.max, info.smallest_normal * 2**-3, -0.0], dtype=dtype)
    return tensors


def _numpy_finite(tensors: list[torch.Tensor]) -> bool:
    # float32 holds every float16 and bfloat16 value exactly, inf and NaN too.
    return all(np.isfinite(t.to(torch.float64).numpy()).all() for t in tensors if t.is_floating_point())


def _python_answer(tensors: list[torch.Tensor]) -> bool:
    return state.read_flags([state._fused_all_finite(tensors)])


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")], ids=str)
def test_both_checks_answer_as_numpy_for_every_position(module: ModuleType, dtype: torch.dtype, bad: Any) -> None:
    tensors = _planted(dtype, seed=3)
    assert _numpy_finite(tensors)
    versions = [t._version for t in tensors]
    positions = [(1, 0), (2, 6), (4, 0), (4, 999), (5, 4096)] if bad is not None else [(1, 0)]
    for which, index in positions:
        planted = [t.clone() for t in tensors]
        if bad is not None:
            planted[which][index] = bad
        expected = _numpy_finite(planted)
        assert expected is (bad is None)
        assert module.all_finite(planted) == int(expected)
        assert _python_answer(planted) is expected
        assert state.read_flags([state.all_finite(planted)]) is expected
    assert [t._version for t in tensors] == versions  # nothing written


def test_what_the_module_cannot_read_is_left_to_torch(module: ModuleType) -> None:
    transposed = torch.randn(8, 4).t()
    transposed[1, 2] = float("nan")
    assert module.all_finite([torch.randn(3), transposed]) == -1
    assert state.read_flags([state.all_finite([torch.randn(3), transposed])]) is False
    assert module.all_finite([torch.empty(3, device="meta")]) == -1
    assert module.all_finite([torch._efficientzerotensor(4)]) == -1  # no buffer behind it to read
    # Integers and bools are finite; an empty list has nothing non-finite.
    assert module.all_finite([torch.arange(5), torch.ones(2, dtype=torch.bool)]) == 1
    assert module.all_finite([]) == 1
    e5m2 = getattr(torch, "float8_e5m2", None)
    if e5m2 is not None:
        values = torch.tensor([1.0, float("inf")]).to(e5m2)
        assert module.all_finite([values]) == -1
        assert state.read_flags([state.all_finite([values])]) is False


def test_mixed_dtypes_in_the_python_check_keep_every_value() -> None:
    # float16's max is finite and stays so after promotion with bfloat16 (to float32); a bfloat16 inf is found.
    half = torch.tensor([65504.0, -65504.0], dtype=torch.float16)
    brain = torch.tensor([3.0e38, 1.0], dtype=torch.bfloat16)
    assert _python_answer([half, brain]) is True
    brain[1] = float("inf")
    assert _python_answer([half, brain]) is False


def test_a_group_copies_exactly_or_nothing(module: ModuleType) -> None:
    sources = [torch.randn(5, 3), torch.randn(7).to(torch.bfloat16), torch.tensor(2.5, dtype=torch.float64)]
    sources[0][1, 1] = float("nan")
    buffers = [torch.empty_like(s) for s in sources]
    assert module.Group(buffers).copy_from(module.Group(sources)) is True
    for buffer, source in zip(buffers, sources, strict=True):
        assert buffer.reshape(-1).view(torch.uint8).equal(source.reshape(-1).view(torch.uint8))  # bit for bit, NaN too
    wrong = [torch.zeros(5, 3), torch.zeros(6, dtype=torch.bfloat16), torch.zeros((), dtype=torch.float64)]
    assert module.Group(wrong).copy_from(module.Group(sources)) is False
    assert all(not w.any() for w in wrong)  # nothing copied


def test_a_group_reads_what_it_holds_as_it_is_at_each_call(module: ModuleType) -> None:
    params = [torch.nn.Parameter(t) for t in (torch.randn(4), torch.randn(2, 3), torch.ones(1))]
    group = module.Group(params)
    assert group.grads_finite() == 1  # no gradient yet: nothing to check
    params[0].grad, params[1].grad = torch.randn(4), torch.randn(2, 3)
    assert _numpy_finite([params[0].grad, params[1].grad])
    assert group.grads_finite() == 1
    params[1].grad[1, 2] = float("inf")
    assert group.grads_finite() == 0
    params[1].grad = None  # the parameter's gradient as it is now, not as it was when the group was made
    assert group.grads_finite() == 1
    params[1].grad = torch.randn(3, 2).t()  # one it cannot read (not contiguous): left to torch
    assert group.grads_finite() == -1
    params[1].grad = None
    held = module.Group([p.detach() for p in params])
    assert held.finite() == 1
    with torch.no_grad():
        params[2][0] = float("nan")
    assert held.finite() == 0
    buffers = [torch.empty_like(p) for p in params]
    assert module.Group(buffers).copy_from(held) is True
    for buffer, source in zip(buffers, params, strict=True):
        assert buffer.reshape(-1).view(torch.uint8).equal(source.detach().reshape(-1).view(torch.uint8))
    assert module.Group(buffers[:2]).copy_from(held) is False  # not the same layout: nothing copied


def _reports(nantrace: NanTrace, monkeypatch: pytest.MonkeyPatch, path: Path, *argv: str) -> list[dict[str, Any]]:
    """The watched report with the C++ checks, then without."""
    docs = []
    for use_native in (True, False):
        with monkeypatch.context() as patch:
            if not use_native:
                patch.setattr(native, "load", lambda **_: None)
            assert (state._native() is not None) is use_native
            code, doc, _ = nantrace.json("--watch", str(path), "--", *argv)
            assert code == (1 if doc["status"] == "nonfinite" else 0)
            docs.append(doc)
    return docs


@pytest.mark.parametrize(
    ("script", "argv"),
    [(MODES, ("forward", "7")), (MODES, ("backward", "7")), (MODES, ("optimizer", "7")), (EMA, ("7",)), (EMA, ("0",))],
    ids=["loss", "gradients", "update", "held", "clean"],
)
def test_watch_reports_are_the_same_with_and_without_the_cpp_checks(
    module: ModuleType, nantrace: NanTrace, monkeypatch: pytest.MonkeyPatch, script: str, argv: tuple[str, ...]
) -> None:
    path, _ = nantrace.write("run.py", script)
    with_cpp, without = _reports(nantrace, monkeypatch, path, *argv)
    assert set(with_cpp) == set(without)
    for key in with_cpp:
        assert with_cpp[key] == without[key], key
    expected = {"forward": "loss", "backward": "gradients", "optimizer": "optimizer_step", "7": "held_tensors"}
    assert with_cpp["watch"]["detected"] == expected.get(argv[0])


def test_the_buffer_walk_finds_what_module_buffers_does() -> None:
    shared = torch.nn.BatchNorm1d(3)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 3), shared, torch.nn.Sequential(shared, torch.nn.BatchNorm1d(3)), torch.nn.Identity()
    )
    mask = torch.ones(2)
    model.register_buffer("mask", mask)
    model.register_buffer("absent", None)
    model[2].register_buffer("alias", mask)  # the same tensor under two names: once, as torch counts it
    walked = state._buffers_of(model)
    expected = list(model.buffers())
    assert len(walked) == len(expected) == 1 + 3 + 3  # mask, the shared norm's three, the second norm's three
    assert all(a is b for a, b in zip(walked, expected, strict=True))
    modules = state._modules_of(model)
    assert len(modules) == len(list(model.modules())) == 6  # the shared norm once
    assert all(a is b for a, b in zip(modules, model.modules(), strict=True))


def test_a_first_use_without_the_module_starts_one_background_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[list[str]] = []
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "compiler_available", lambda: True)
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **_: started.append(argv))
    native._load_once.cache_clear()
    try:
        assert native.load() is None  # this run: the pure-Python checks
        assert started == [[sys.executable, "-m", "dtypecheck.nantrace.native", "--quiet"]]
        marker = native.build_folder() / "building"
        marker.touch()  # the build is under way: a second process starts none
        native._start_background_build(native.build_folder())
        assert len(started) == 1
        old = time.time() - 3600
        os.utime(marker, (old, old))  # a build that died an hour ago: started again
        native._start_background_build(native.build_folder())
        assert len(started) == 2
        monkeypatch.setattr(native, "compiler_available", lambda: False)
        native._start_background_build(native.build_folder())
        assert len(started) == 2  # nothing to build with
    finally:
        native._load_once.cache_clear()
