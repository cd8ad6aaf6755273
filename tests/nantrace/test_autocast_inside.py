"""Tracing keeps autocast on for the ops a kernel calls from inside it (issue 30.1): ``affine_grid_generator`` (no
autocast rule of its own) runs its ``bmm`` in bf16 plainly, and must under the tracer too. Compared with the plain
run bit for bit, and with the dtype autocast's own rule gives (``bmm`` is on its lower-precision list)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.nn import functional

from dtypecheck.nantrace.autocast import falls_through
from dtypecheck.nantrace.tracer import Tracer


def _grid_and_bilinear(traced: bool, dtype: torch.dtype) -> list[torch.Tensor]:
    torch.manual_seed(0)
    theta = torch.randn(2, 2, 3, requires_grad=True)
    bilinear = torch.nn.Bilinear(5, 6, 4)
    a, b = torch.randn(3, 5), torch.randn(3, 6)
    tracer = Tracer() if traced else contextlib.nullcontext()
    with torch.autocast("cpu", dtype=dtype), tracer:  # the tracer entered inside autocast, as the CLI does
        grid = functional.affine_grid(theta, [2, 3, 4, 4], align_corners=False)
        out = bilinear(a, b)
        (grid.float().sum() + out.float().sum()).backward()
    assert theta.grad is not None
    assert bilinear.weight.grad is not None
    return [grid, out, theta.grad, bilinear.weight.grad]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_kernels_inner_ops_meet_autocast_as_plainly(dtype: torch.dtype) -> None:
    plain = _grid_and_bilinear(False, dtype)
    traced = _grid_and_bilinear(True, dtype)
    assert plain[0].dtype == dtype  # the grid comes out of the inner bmm, cast by autocast
    assert [t.dtype for t in traced] == [t.dtype for t in plain]
    for got, want in zip(traced, plain, strict=True):
        assert torch.equal(got, want)


def test_autocast_entered_after_tracing_began_is_seen() -> None:
    torch.manual_seed(0)
    theta = torch.randn(1, 2, 3)
    with Tracer(), torch.autocast("cpu", dtype=torch.bfloat16):
        grid = functional.affine_grid(theta, [1, 1, 3, 3], align_corners=False)
    assert grid.dtype == torch.bfloat16


def test_only_ops_without_an_autocast_rule_fall_through() -> None:
    cpu = torch._C.DispatchKey.AutocastCPU
    assert cpu not in falls_through(torch.ops.aten.mm.default)  # on autocast's lower-precision list
    assert cpu in falls_through(torch.ops.aten.affine_grid_generator.default)
    assert cpu in falls_through(torch.ops.aten._transformer_encoder_layer_fwd.default)
