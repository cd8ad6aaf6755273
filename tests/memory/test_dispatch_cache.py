"""The cheaper front of fake tensors' dispatch cache gives what the fake mode gives, op by op and pass by pass."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensorMode

from dtypecheck.memory import dispatch_cache
from dtypecheck.memory.dispatch_cache import cached_call
from dtypecheck.memory.fakes import fake_inputs, fakify_module, new_fake_mode
from dtypecheck.memory.tracing import Traceable, trace_pass

aten = torch.ops.aten


def _metadata(t: torch.Tensor) -> tuple[object, ...]:
    return (t.dtype, t.shape, t.stride(), t.device, t.storage_offset(), t.untyped_storage().nbytes(), t.requires_grad)


@pytest.fixture
def fresh_cache():
    dispatch_cache._ENTRIES.clear()
    yield dispatch_cache._ENTRIES
    dispatch_cache._ENTRIES.clear()


def _counting_dispatch(monkeypatch) -> list[object]:
    """Every op that reaches the fake mode's own cached dispatch (the front cache answers the others itself)."""
    seen: list[object] = []
    original = FakeTensorMode._cached_dispatch_impl

    def counted(self, func, types, args, kwargs):
        seen.append(func)
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(FakeTensorMode, "_cached_dispatch_impl", counted)
    return seen


def test_a_second_call_is_answered_by_the_front_cache_with_the_fake_modes_own_output(fresh_cache, monkeypatch):
    mode = new_fake_mode()
    with mode:
        a = torch.empty(3, 5)
        b = torch.empty(5, 7)
        first = cached_call(aten.mm.default, (a, b), {})
        seen = _counting_dispatch(monkeypatch)
        second = cached_call(aten.mm.default, (a, b), {})
    assert seen == []  # the fake mode was not asked again
    assert _metadata(second) == _metadata(first) == (torch.float32, (3, 7), (7, 1), torch.device("cpu"), 0, 84, False)
    assert second is not first
    assert second.untyped_storage()._cdata != first.untyped_storage()._cdata


def test_a_view_shares_its_inputs_storage_and_an_in_place_op_returns_its_argument(fresh_cache):
    mode = new_fake_mode()
    with mode:
        x = torch.empty(4, 6)
        for _ in range(2):  # the first call fills the entry, the second is built from it
            view = cached_call(aten.transpose.int, (x, 0, 1), {})
            assert (view.shape, view.stride()) == ((6, 4), (1, 6))
            assert view.untyped_storage()._cdata == x.untyped_storage()._cdata
            same = cached_call(aten.add_.Tensor, (x, x), {})
            assert same is x
    assert len(fresh_cache) == 2


def test_arguments_that_differ_in_any_fact_the_output_depends_on_get_their_own_entry(fresh_cache):
    mode = new_fake_mode()
    with mode:
        x = torch.empty(2, 8)
        outs = [
            cached_call(aten.sum.dim_IntList, (x, [1]), {}),
            cached_call(aten.sum.dim_IntList, (x, [0]), {}),
            cached_call(aten.sum.dim_IntList, (x, [1], True), {}),
            cached_call(aten.sum.dim_IntList, (x.t(), [1]), {}),  # other strides
            cached_call(aten.mul.Tensor, (x, 2), {}),
            cached_call(aten.mul.Tensor, (x, 2.0), {}),  # 2 and 2.0 hash alike
            cached_call(aten.mul.Tensor, (x.to(torch.int32), 2), {}),
            cached_call(aten.mul.Tensor, (x.to(torch.int32), 2.0), {}),  # an int tensor times a float: float
        ]
    assert [tuple(o.shape) for o in outs[:4]] == [(2,), (8,), (2, 1), (8,)]
    assert [o.dtype for o in outs[4:]] == [torch.float32, torch.float32, torch.int32, torch.float32]
    assert len(fresh_cache) == len(outs)


def test_an_op_the_fake_mode_does_not_cache_runs_through_it_every_time(fresh_cache, monkeypatch):
    mode = new_fake_mode()
    with mode:
        x = torch.empty(3, 4)
        seen = _counting_dispatch(monkeypatch)
        for _ in range(2):
            with pytest.raises(DynamicOutputShapeException):
                cached_call(aten.nonzero.default, (x,), {})
    assert seen == [aten.nonzero.default, aten.nonzero.default]


def test_an_op_that_neither_views_nor_writes_is_met_once_whatever_its_arguments_offset(fresh_cache, monkeypatch):
    # A scan over the sequence (Mamba's slow path): every step multiplies another slice of one tensor.
    mode = new_fake_mode()
    with mode:
        x = torch.empty(2, 16, 8)
        state = torch.empty(2, 8)
        seen = _counting_dispatch(monkeypatch)
        outs = []
        for i in range(16):
            step = cached_call(aten.select.int, (x, 1, i), {})
            turned = cached_call(aten.t.default, (step,), {})
            assert turned.storage_offset() == i * 8  # a view of a view keeps where it lies: an entry per offset
            outs.append(cached_call(aten.mul.Tensor, (step, state), {}))
    assert seen.count(aten.mul.Tensor) == 1
    assert seen.count(aten.select.int) == seen.count(aten.t.default) == 16
    assert {_metadata(o) for o in outs} == {(torch.float32, (2, 8), (8, 1), torch.device("cpu"), 0, 64, False)}


class _Scan(nn.Module):
    """A gated scan over the sequence, step by step, as a state-space model's reference path runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = torch.zeros(x.shape[0], 8)
        outs = []
        for i in range(x.shape[1]):
            state = torch.sigmoid(self.gate(x[:, i])) * state + x[:, i]
            outs.append(state)
        return torch.stack(outs, dim=1)


def _transformer() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 3, enable_nested_tensor=False), torch.randn(2, 12, 32)


def _scan() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return _Scan(), torch.randn(3, 20, 8)


def _timeline(train: bool, make=_transformer) -> tuple[object, ...]:
    model, x = make()
    mode = new_fake_mode()
    fake_model = fakify_module(copy.deepcopy(model), mode)
    fake_x = fake_inputs(mode, x)
    traceable = Traceable(mode, fake_model, lambda b, s: fake_x.clone(), int(x.shape[0]))
    profile = trace_pass(traceable, train=train, autocast_dtype=None, checkpointing=False)
    return profile.timeline, profile.frontier, profile.retained_bytes, profile.ops


@pytest.mark.parametrize("make", [_transformer, _scan], ids=["transformer", "scan"])
@pytest.mark.parametrize("train", [True, False], ids=["training", "inference"])
def test_a_pass_traced_through_the_front_cache_is_the_pass_traced_without_it(fresh_cache, monkeypatch, train, make):
    with_cache = _timeline(train, make)
    again = _timeline(train, make)  # every op now answered from the front cache
    assert fresh_cache  # the front cache was used
    monkeypatch.setattr(dispatch_cache, "_torch", lambda: None)
    without = _timeline(train, make)
    assert with_cache == again == without


def test_a_torch_whose_cache_internals_take_other_arguments_is_not_fronted(monkeypatch):
    assert dispatch_cache._torch() is not None  # this torch's are the ones the front is written for
    dispatch_cache._torch.cache_clear()
    monkeypatch.setattr(dispatch_cache, "_OUTPUT_ARGUMENTS", ["state", "entry", "func", "args"])
    try:
        assert dispatch_cache._torch() is None
    finally:
        dispatch_cache._torch.cache_clear()
