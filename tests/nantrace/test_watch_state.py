"""Watch mode's per-step state, kept cheap (issue 30.5) without keeping it wrong: the buffers a step saves as the
tree changes, the gradient a model call's output received, a snapshot copied bit for bit, and the run's own
update kept when its replay differs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from dtypecheck.nantrace import native
from dtypecheck.nantrace.watch import Watcher, state
from dtypecheck.nantrace.watch.state import BufferSnapshot


@contextlib.contextmanager
def _counting(snapshot: BufferSnapshot) -> Iterator[None]:
    """``snapshot.install`` with its patches and hooks undone on the way out, as the watcher does."""
    restore: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        restore.append((owner, name, original))
        setattr(owner, name, make(original))

    handles = snapshot.install(patch)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for owner, name, original in reversed(restore):
            setattr(owner, name, original)


def _taken(snapshot: BufferSnapshot, module: torch.nn.Module) -> list[torch.Tensor]:
    snapshot.clear()
    snapshot.take(module)
    return [buffer for buffer, _, _ in snapshot._saved]


def _same(found: list[torch.Tensor], module: torch.nn.Module) -> bool:
    expected = list(module.buffers())  # torch's own walk, as it is now
    return len(found) == len(expected) and all(a is b for a, b in zip(found, expected, strict=True))


def test_the_kept_buffer_list_follows_every_change_to_the_tree() -> None:
    blocks = torch.nn.ModuleList([torch.nn.Linear(3, 3)])
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), blocks)
    snapshot = BufferSnapshot()
    with _counting(snapshot):
        assert _taken(snapshot, model) == []
        model.register_buffer("mask", torch.ones(3))  # registered: a hook counts it
        assert _same(_taken(snapshot, model), model)
        blocks.insert(0, torch.nn.BatchNorm1d(3))  # written into _modules directly
        assert _same(_taken(snapshot, model), model)
        assert len(list(model.buffers())) == 4
        before = _taken(snapshot, model)
        model.double()  # _apply replaces every buffer directly
        after = _taken(snapshot, model)
        assert _same(after, model)
        assert all(a is not b for a, b in zip(before, after, strict=True) if a.is_floating_point())
        model.mask = torch.zeros(3)  # a buffer assigned anew
        assert _same(_taken(snapshot, model), model)
        model._buffers["mask"] = torch.full((3,), 2.0)  # behind torch's back: the tensor is compared too
        assert _same(_taken(snapshot, model), model)
        del blocks[0]
        assert _same(_taken(snapshot, model), model)
        assert len(list(model.buffers())) == 1
        kept = snapshot._trees[id(model)]
        assert _taken(snapshot, model) is not None
        assert snapshot._trees[id(model)] is kept


@pytest.mark.parametrize("compiled_autograd", [False, True], ids=["cpp-hook", "python-hook"])
def test_a_call_keeps_the_gradient_its_output_received_even_when_changed_in_place_after(
    compiled_autograd: bool, monkeypatch: pytest.MonkeyPatch, native_module: ModuleType
) -> None:
    """By the C++ hook (``native.keep_grad``), or by the Python one where compiled autograd is on (it compiles only
    Python hooks)."""
    assert native_module.keep_grad is not None
    assert getattr(native.load(), "keep_grad", None) is not None  # what the watcher asks for
    if compiled_autograd:
        import importlib

        compiled = importlib.import_module("torch._dynamo.compiled_autograd")
        monkeypatch.setattr(compiled, "compiled_autograd_enabled", True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    watcher = Watcher(model=model)
    with watcher:
        out = model(x)
        out.mul_(2.0)  # the user's own in-place change after the call
        weights = torch.arange(15.0).reshape(5, 3)
        (out * weights).sum().backward()
        call = watcher._calls[0]
        assert (bool(call.kept), bool(call.grads)) == (not compiled_autograd, compiled_autograd)
        # d/d(out as returned) of sum(2 * out * weights) is 2 * weights, by hand.
        assert torch.equal(call.gradients()[0], 2.0 * weights)


def test_a_snapshot_copy_is_bit_for_bit_at_every_alignment_and_length(native_module: ModuleType) -> None:
    """Each tensor's whole lines streamed and its last partial line copied through the cache, whatever its source's
    alignment: every byte of each copy is its source's, and the padding after it is left as it was."""
    module = native_module
    torch.manual_seed(0)
    for offset in range(5):
        sources = []
        for length in (1, 3, 15, 16, 17, 63, 64, 65, 1000, 4099):
            base = torch.randn(length + offset)
            base[(7 * length) % (length + offset)] = float("nan")
            sources.append(base[offset:])  # contiguous, its data 4 * offset bytes past an aligned start
        copies = state._Copies.of(sources)
        assert copies.flat is not None
        copies.flat.fill_(0xAB)
        assert module.Snapshot(sources, copies.flat, copies.offsets).take() is True
        for view, source, at in zip(copies.views, sources, copies.offsets, strict=True):
            assert view.view(torch.int32).equal(source.view(torch.int32)), (offset, source.numel())
            end, line_end = at + source.nbytes, at + -(-source.nbytes // 64) * 64
            assert bool((copies.flat[end:line_end] == 0xAB).all())  # nothing written past it


NOISY = """
class Noisy(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(torch.rand_like(p) - 0.5)  # random: a replay writes other values
                if self.state.setdefault(p, {}).setdefault("n", 0) == 2:
                    p.view(-1)[0] = float("nan")
                self.state[p]["n"] += 1
"""


def _noisy_run(watched: bool) -> torch.Tensor:
    namespace: dict[str, Any] = {"torch": torch}
    exec(NOISY, namespace)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = namespace["Noisy"](model.parameters())
    with Watcher(model=model) if watched else contextlib.nullcontext():
        for _ in range(3):
            model(torch.ones(2, 3)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return model.weight.detach().clone()


def test_an_update_replayed_to_other_values_leaves_the_run_as_its_own_update_left_it() -> None:
    plain, watched = _noisy_run(False), _noisy_run(True)
    assert plain[0, 0].isnan()
    assert watched[0, 0].isnan()
    assert torch.equal(plain[0, 1:], watched[0, 1:])  # the run's values, not the replay's
