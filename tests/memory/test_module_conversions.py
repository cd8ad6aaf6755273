"""A model whose own forward converts a module (``self.router = self.router.to(self.dtype)``, as NLLB-MoE's router
does at every call) is estimated: torch swaps each parameter for its converted copy in place, which fake
parameters refused ("_apply(): Couldn't swap Linear.weight")."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from dtypecheck.dtypes import lookup
from dtypecheck.memory import EstimateOptions, estimate_memory, open_subject
from dtypecheck.memory.fakes import fake_module_conversions

MODEL = """
import torch
from torch import nn


class Routed(nn.Module):
    def __init__(self, cast):
        super().__init__()
        self.cast = cast
        self.embed = nn.Embedding(100, 32)
        self.router = nn.Linear(32, 4, bias=False)
        self.head = nn.Linear(32, 100)

    def forward(self, ids):
        if self.cast:
            self.router = self.router.to(self.embed.weight.dtype)  # NLLB-MoE's ``_cast_classifier``
        hidden = self.embed(ids)
        return self.head(hidden * self.router(hidden).softmax(-1).amax(-1, keepdim=True))


def casting():
    torch.manual_seed(0)
    return Routed(True), torch.randint(0, 100, (2, 12)), lambda logits, ids: logits.float().pow(2).mean()


def plain():
    torch.manual_seed(0)
    return Routed(False), torch.randint(0, 100, (2, 12)), lambda logits, ids: logits.float().pow(2).mean()
"""


def test_a_forward_that_converts_its_own_module_estimates_as_one_that_does_not(tmp_path):
    path = tmp_path / "routed.py"
    path.write_text(MODEL, encoding="utf-8")
    options = EstimateOptions(dtypes=(lookup("float32"), lookup("bfloat16")))

    def totals(factory: str) -> list[int]:
        report = estimate_memory(open_subject(f"{path}:{factory}"), options)
        return [row.bytes.total for row in report.estimates]

    casting = totals("casting")
    assert len(casting) == 4  # inference and training, each dtype
    assert casting == totals("plain")  # the conversion to the dtype it already has allocates nothing


def test_a_conversion_to_another_dtype_replaces_the_fake_parameters_and_their_gradients():
    mode = FakeTensorMode()
    with mode:
        module = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
        module[0].weight.grad = torch.ones(3, 4)
    with pytest.raises(RuntimeError, match="Couldn't swap"):
        module.double()  # torch's own conversion, on fake parameters
    kept = module[1].weight
    with fake_module_conversions(), mode:
        module.double()
        doubled = module[0].weight
        module[0].double()  # no change: the parameter itself stays
        module[1].float()  # back: a new fake again
    assert module[0].weight is doubled
    assert module[0].weight.dtype == torch.float64
    assert module[1].weight.dtype == torch.float32
    assert module[1].weight is not kept
    assert isinstance(module[0].weight, nn.Parameter)
    assert isinstance(module[0].weight, FakeTensor)
    assert module[0].weight.grad is not None
    assert module[0].weight.grad.dtype == torch.float64
    assert [tuple(p.shape) for p in module.parameters()] == [(3, 4), (3,), (3,), (3,)]
    with fake_module_conversions():
        real = nn.Linear(2, 2)
        weight = real.weight
        real.double()  # a module without fakes: torch's own conversion, in place
    assert real.weight is weight
    assert real.weight.dtype == torch.float64


def test_a_conversion_keeps_tied_fake_parameters_tied():
    mode = FakeTensorMode()
    with mode:
        module = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    module[1].weight = module[0].weight
    with fake_module_conversions(), mode:
        module.double()
    assert module[0].weight.dtype == torch.float64
    assert module[1].weight is module[0].weight
    assert len(list(module.parameters())) == 1
