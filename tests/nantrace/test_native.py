"""nan-trace's C++ checks (``dtypecheck.nantrace.native``) and the pure-Python checks they stand in for.

Both answer "is every value finite" for a list of tensors; each is checked against numpy's ``isfinite`` on the same
values, and watch mode's reports are compared field by field with the C++ checks on and off. The full trace's check
of one output (its extremes, its count below the smallest normal) is checked against numpy, and full reports are
compared with it on and off.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
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
@pytest.mark.parametrize(
    "bad", [None, float("nan"), -float("nan"), float("inf"), float("-inf")], ids=["none", "nan", "-nan", "inf", "-inf"]
)
def test_both_checks_answer_as_numpy_for_every_position(
    native_module: ModuleType, dtype: torch.dtype, bad: Any
) -> None:
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
        assert native_module.all_finite(planted) == int(expected)
        assert _python_answer(planted) is expected
        assert state.read_flags([state.all_finite(planted)]) is expected
    assert [t._version for t in tensors] == versions  # nothing written


def test_what_the_module_cannot_read_is_left_to_torch(native_module: ModuleType) -> None:
    transposed = torch.randn(8, 4).t()
    transposed[1, 2] = float("nan")
    assert native_module.all_finite([torch.randn(3), transposed]) == -1
    assert state.read_flags([state.all_finite([torch.randn(3), transposed])]) is False
    assert native_module.all_finite([torch.empty(3, device="meta")]) == -1
    assert native_module.all_finite([torch._efficientzerotensor(4)]) == -1  # no buffer behind it to read
    negated = torch.tensor([1 + 2j, 3 - 4j]).conj().imag  # its bits are not its values (a negated view)
    assert negated.is_neg()
    assert native_module.all_finite([negated]) == -1
    # Integers and bools are finite; an empty list has nothing non-finite.
    assert native_module.all_finite([torch.arange(5), torch.ones(2, dtype=torch.bool)]) == 1
    assert native_module.all_finite([]) == 1
    e5m2 = getattr(torch, "float8_e5m2", None)
    if e5m2 is not None:
        values = torch.tensor([1.0, float("inf")]).to(e5m2)
        assert native_module.all_finite([values]) == -1
        assert state.read_flags([state.all_finite([values])]) is False


SMALLEST_NORMAL = {torch.float16: 2.0**-14, torch.bfloat16: 2.0**-126}


def _check_reads_as_numpy(native_module: ModuleType, tensor: torch.Tensor, tiny: float) -> None:
    """``extrema`` against numpy in float64: the extremes (both NaN where one value is), and the count of magnitudes
    below ``tiny`` (none counted when it is 0)."""
    values = tensor.to(torch.float64).numpy()
    lo, hi, small = native_module.extrema(tensor, tiny)
    if np.isnan(values).any():
        assert math.isnan(lo)
        assert math.isnan(hi)
    else:
        assert (lo, hi) == (values.min(), values.max())
    assert small == (int((np.abs(values) < tiny).sum()) if tiny > 0 else 0)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")], ids=str)
def test_the_full_traces_check_reads_each_output_as_numpy_does(
    native_module: ModuleType, dtype: torch.dtype, bad: Any
) -> None:
    """``extrema`` (``Tracer._check`` of a CPU output): the lowest and highest value, NaN in both where one is NaN
    (as ``aminmax``), and in half precision how many magnitudes are below the smallest normal (zeros included)."""
    tiny = SMALLEST_NORMAL.get(dtype, 0.0)
    for tensor in _planted(dtype, seed=5):
        if tensor.numel() == 0:
            assert native_module.extrema(tensor, tiny) is None
            continue
        if bad is not None:
            tensor[tensor.numel() // 2] = bad
        _check_reads_as_numpy(native_module, tensor, tiny)


def test_what_the_full_traces_check_cannot_read_is_left_to_torch(native_module: ModuleType) -> None:
    freed = torch.randn(16)
    freed.untyped_storage().resize_(0)  # as FSDP frees an unsharded parameter: reading it would crash
    shrunk = torch.randn(16)
    shrunk.untyped_storage().resize_(8)  # 2 of its 16 values left: the rest would be read past the storage's end
    assert native_module.all_finite([shrunk]) == -1
    copies = state._Copies.of([torch.empty(16)])
    assert native_module.Snapshot([shrunk], copies.flat, copies.offsets).take() is False
    unread = [
        torch.randn(8, 4).t(),
        torch.empty(3, device="meta"),
        torch._efficientzerotensor(4),
        torch.arange(5),
        torch.ones(2, dtype=torch.bool),
        freed,
        shrunk,
    ]
    e5m2 = getattr(torch, "float8_e5m2", None)
    if e5m2 is not None:
        unread.append(torch.tensor([1.0, float("inf")]).to(e5m2))
    assert [native_module.extrema(t, 0.0) for t in unread] == [None] * len(unread)


def test_an_all_zero_output_has_a_magnitude_of_plus_zero() -> None:
    """Zeros of either sign as extremes (``aminmax`` returns whichever it read first): the magnitude is +0.0, as
    the C++ check's; ``max(-lo, hi)`` alone gave -0.0 for (0.0, 0.0)."""
    from dtypecheck.nantrace.records import Checked

    for lo, hi in ((0.0, 0.0), (-0.0, -0.0), (-0.0, 0.0), (0.0, -0.0)):
        checked = Checked.read(torch.zeros(2), lo, hi, 0)
        assert (checked.absmax, math.copysign(1.0, checked.absmax)) == (0.0, 1.0)
        assert (checked.has_nan, checked.has_inf) == (False, False)
    assert math.isnan(Checked.read(torch.zeros(2), math.nan, math.nan, 0).absmax)
    assert Checked.read(torch.zeros(2), -math.inf, 1.0, 0).has_inf


def _fp16_training() -> None:
    """Adam in float16 whose inputs grow 100x a step: near-limit outputs, then an overflow, in forward, backward
    and the update."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1)).half()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(4):
        loss = model(torch.randn(4, 8).half() * 100.0**step).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _small_and_zero_values() -> None:
    """bfloat16 values below its smallest normal, outputs of all zeros (of either sign), and log(0)."""
    tiny = torch.full((16,), 1e-39, dtype=torch.bfloat16) * 0.5
    signed = torch.zeros(4) * -1.0
    (torch.log(signed.abs()) + tiny.float().sum()).sum()


@pytest.mark.parametrize("program", [_fp16_training, _small_and_zero_values], ids=lambda p: p.__name__)
def test_a_full_trace_reports_the_same_with_the_cpu_check_as_with_torchs(
    native_module: ModuleType, monkeypatch: pytest.MonkeyPatch, program: Any
) -> None:
    """Every field of the report (events, warnings, history, counts, magnitudes), collecting every event."""
    from dtypecheck.nantrace.tracer import TraceOptions, Tracer

    documents = []
    for use_native in (True, False):
        with monkeypatch.context() as patch:
            if not use_native:
                patch.setattr(native, "load", lambda **_: None)
            with Tracer(TraceOptions(keep_going=True)) as tracer:
                assert (tracer._extrema is not None) is use_native
                program()
            report = tracer.report()
        assert report.status == "nonfinite"
        assert report.warnings or report.events
        documents.append(json.dumps(dataclasses.asdict(report), sort_keys=True, default=str))
    assert documents[0] == documents[1]


def test_mixed_dtypes_in_the_python_check_keep_every_value() -> None:
    # float16's max is finite and stays so after promotion with bfloat16 (to float32); a bfloat16 inf is found.
    half = torch.tensor([65504.0, -65504.0], dtype=torch.float16)
    brain = torch.tensor([3.0e38, 1.0], dtype=torch.bfloat16)
    assert _python_answer([half, brain]) is True
    brain[1] = float("inf")
    assert _python_answer([half, brain]) is False


def test_a_snapshot_copies_bit_for_bit_on_lines_of_its_own(native_module: ModuleType) -> None:
    sources = [
        torch.randn(5, 3),
        torch.randn(7).to(torch.bfloat16),
        torch.tensor(2.5, dtype=torch.float64),
        torch.empty(0, 4),
        torch.arange(33, dtype=torch.int16),
    ]
    sources[0][1, 1] = float("nan")
    copies = state._Copies.of(sources)
    # By hand: 60, 14, 8, 0 and 66 bytes, each rounded up to whole 64-byte lines.
    assert copies.offsets == [0, 64, 128, 192, 192]
    assert copies.flat is not None
    assert copies.flat.nbytes == 192 + 128 == copies.nbytes
    snapshot = native_module.Snapshot(sources, copies.flat, copies.offsets)
    assert snapshot.take() is True
    for view, source in zip(copies.views, sources, strict=True):
        assert (view.shape, view.dtype) == (source.shape, source.dtype)
        assert view.reshape(-1).view(torch.uint8).equal(source.reshape(-1).view(torch.uint8))  # bit for bit, NaN too
    sources[0][0, 0] = 7.0  # read as it is at each call
    assert snapshot.take() is True
    assert copies.views[0][0, 0].item() == 7.0
    sources[1].data = torch.zeros(6, dtype=torch.bfloat16)  # another size now: the caller copies with torch
    assert snapshot.take() is False
    with pytest.raises(RuntimeError, match="line-aligned"):
        native_module.Snapshot(sources[:2], copies.flat, [0, 32])


class _Marked(torch.Tensor):
    """A tensor subclass, as FSDP2's DTensor shards are: its copies are its own kind, not views of bytes."""


def test_a_snapshot_of_a_tensor_subclass_copies_into_tensors_of_its_kind() -> None:
    plain = torch.randn(3)
    marked = torch.randn(2, 2).as_subclass(_Marked)
    copies = state._Copies.of([plain, marked])
    assert copies.flat is None
    assert [type(v) for v in copies.views] == [torch.Tensor, _Marked]
    assert copies.nbytes == 3 * 4 + 4 * 4
    with torch.no_grad():
        torch._foreach_copy_(copies.views, [plain, marked])
    assert torch.equal(copies.views[0], plain)
    assert torch.equal(copies.views[1].as_subclass(torch.Tensor), marked.as_subclass(torch.Tensor))


class _Sharded(torch.Tensor):
    """A sharded tensor as watch mode sees FSDP2's DTensor: a wrapper (torch's Python key) whose ops run on the
    whole tensor, and whose ``to_local`` is this rank's shard."""

    whole: torch.Tensor
    shard: torch.Tensor

    @staticmethod
    def __new__(cls, whole: torch.Tensor, shard: torch.Tensor) -> _Sharded:
        tensor = torch.Tensor._make_wrapper_subclass(cls, whole.shape, dtype=whole.dtype, device=whole.device)
        tensor.whole, tensor.shard = whole, shard
        return tensor

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        from torch.utils._pytree import tree_map

        def whole(value: Any) -> Any:
            return value.whole if isinstance(value, _Sharded) else value

        return func(*tree_map(whole, args), **tree_map(whole, kwargs or {}))

    def to_local(self) -> torch.Tensor:
        return self.shard


def _sharded(whole: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
    return _Sharded(whole, shard)


@pytest.mark.parametrize("use_native", [True, False], ids=["cpp", "python"])
def test_a_sharded_tensor_is_checked_as_the_shard_this_rank_holds(
    use_native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty shard (a rank holding none of a small parameter) is finite; a reduction of the whole tensor failed
    there (``amax`` of no values) and would be a collective on a real DTensor."""
    if not use_native:
        monkeypatch.setattr(native, "load", lambda **_: None)
    empty = _sharded(torch.randn(3), torch.empty(0))
    assert state.read_flags([state.all_finite([empty, torch.randn(4)])]) is True
    bad_shard = torch.tensor([1.0, float("nan")])
    assert state.read_flags([state.all_finite([torch.randn(2), _sharded(torch.zeros(2), bad_shard)])]) is False
    # The whole tensor's values are not what is read: this rank's shard is.
    assert state.read_flags([state.all_finite([_sharded(torch.full((2,), float("inf")), torch.ones(1))])]) is True


def test_a_gradient_is_kept_as_backward_sends_it(native_module: ModuleType) -> None:
    """``keep_grad``: the gradient that flows into a node's output, summed over backward passes; None for a tensor
    no node made (a leaf)."""
    x = torch.randn(4, 3, requires_grad=True)
    weights = torch.randn(4, 2)
    first, second = x.split([2, 1], dim=1)  # two outputs of one node: the second's gradient is kept
    kept = native_module.keep_grad(second)
    before = kept.grad
    assert before is None  # before backward
    assert kept.nbytes == 0
    loss = (first * weights).sum() + (second * weights[:, :1] * 3).sum()
    loss.backward(retain_graph=True)
    expected = (weights[:, :1] * 3).numpy()  # d loss / d second, by hand
    np.testing.assert_array_equal(kept.grad.numpy(), expected)
    assert kept.nbytes == 4 * 1 * 4  # 4x1 float32
    loss.backward()
    np.testing.assert_array_equal(kept.grad.numpy(), expected + expected)
    assert native_module.keep_grad(torch.randn(2, requires_grad=True)) is None


def test_a_group_reads_what_it_holds_as_it_is_at_each_call(native_module: ModuleType) -> None:
    params = [torch.nn.Parameter(t) for t in (torch.randn(4), torch.randn(2, 3), torch.ones(1))]
    group = native_module.Group(params)
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
    held = native_module.Group([p.detach() for p in params])
    assert held.finite() == 1
    with torch.no_grad():
        params[2][0] = float("nan")
    assert held.finite() == 0
    params[1].grad = torch.tensor([1 + 1j]).conj().imag.expand(2, 3)  # a negated view: left to torch
    assert group.grads_finite() == -1


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
    native_module: ModuleType, nantrace: NanTrace, monkeypatch: pytest.MonkeyPatch, script: str, argv: tuple[str, ...]
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


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_the_check_orders_and_counts_as_numpy_does_across_its_blocks(
    native_module: ModuleType, dtype: torch.dtype
) -> None:
    """The check reads values as integers in blocks of 4,096 (so that the loop vectorises): sizes around the blocks'
    ends, all-negative and all-subnormal tensors, a NaN or an infinity at the first and the last position, and
    counts below thresholds the dtype cannot hold exactly, each against numpy in float64."""
    generator = torch.Generator().manual_seed(11)
    info = torch.finfo(dtype)
    cases = []
    for n in (1, 4095, 4096, 4097, 8197, 20000):
        drawn = torch.randn(n, generator=generator, dtype=torch.float64) * 3
        cases += [drawn.to(dtype), (-drawn.abs() - 1).to(dtype), (drawn * info.smallest_normal / 8).to(dtype)]
    for bad in (float("nan"), float("inf"), float("-inf")):
        for position in (0, 4095, 4096, -1):
            planted = torch.randn(8197, generator=generator).to(dtype)
            planted[position] = bad
            cases.append(planted)
    thresholds = (0.0, info.smallest_normal, 1e-5, 0.3, 1.0000001)
    for tensor in cases:
        for tiny in thresholds:
            _check_reads_as_numpy(native_module, tensor, tiny)
