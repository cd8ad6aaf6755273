"""Ops whose real output holds more storage than fake tensors say: every one is corrected by the tracer.

One training step of common modules and every ``torch.nn.functional`` loss runs for real under a dispatch mode
that also runs each op's first call on fake copies of its arguments; an output whose real storage is larger (not a
view of an input) is a place the trace would count short. The MSE family's scalar keeps its elementwise buffer
(found so: a default-MSE step was one output short), a fold's or unfold's smaller output keeps its input's storage
and oneDNN's LSTM returns a workspace; each must be what the tracer corrects (``workspaces.held_output_bytes``,
``workspaces.workspace_output``), at the real size."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from dtypecheck.memory.workspaces import held_output_bytes, workspace_output


class _Probe(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self.seen: set[str] = set()
        self.larger: dict[str, tuple[int, int | None]] = {}
        """op -> (real bytes, what the tracer counts: ``held_output_bytes`` or None)"""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        if name in self.seen:
            return out
        self.seen.add(name)
        try:
            with self.fake:
                fargs, fkwargs = tree_map(
                    lambda t: self.fake.from_tensor(t) if isinstance(t, torch.Tensor) else t, (args, kwargs)
                )
                fout = func(*fargs, **fkwargs)
        except Exception:  # noqa: BLE001  (an op fake tensors cannot run: not this test's question)
            return out
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for real, fake in zip(tree_flatten(out)[0], tree_flatten(fout)[0], strict=False):
            if not (isinstance(real, torch.Tensor) and isinstance(fake, torch.Tensor)) or real.layout != torch.strided:
                continue
            if real.untyped_storage().data_ptr() in inputs:
                continue
            if real.untyped_storage().nbytes() > fake.untyped_storage().nbytes():
                counted = held_output_bytes(func, fargs, fkwargs, fake) if isinstance(fout, torch.Tensor) else None
                self.larger[name] = (real.untyped_storage().nbytes(), counted)
        return out


def _step(probe: _Probe, model: nn.Module, x: torch.Tensor, loss: Any) -> None:
    optimizer = torch.optim.AdamW(model.parameters())
    with probe:
        loss(model(x)).backward()
        optimizer.step()


def test_every_real_storage_larger_than_the_fake_one_is_corrected():
    torch.manual_seed(0)
    probe = _Probe()
    x = torch.randn(8, 16, 32)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2)
    ids = torch.zeros(128, dtype=torch.long)
    losses = [
        lambda o: F.mse_loss(o, torch.zeros_like(o)),
        lambda o: F.mse_loss(o, torch.zeros_like(o), reduction="sum"),
        lambda o: F.smooth_l1_loss(o, torch.zeros_like(o)),
        lambda o: F.binary_cross_entropy(o.sigmoid(), torch.full_like(o, 0.5)),
        lambda o: F.soft_margin_loss(o, torch.ones_like(o)),
        lambda o: F.l1_loss(o, torch.zeros_like(o)),
        lambda o: F.huber_loss(o, torch.zeros_like(o)),
        lambda o: F.kl_div(o.log_softmax(-1), torch.full_like(o, 1 / 32), reduction="batchmean"),
        lambda o: F.cross_entropy(o.flatten(0, 1), ids),
        lambda o: F.binary_cross_entropy_with_logits(o, torch.full_like(o, 0.5)),
        lambda o: F.gaussian_nll_loss(o, torch.zeros_like(o), torch.ones_like(o)),
        lambda o: F.poisson_nll_loss(o, torch.ones_like(o)),
        lambda o: F.cosine_embedding_loss(o.flatten(0, 1), o.flatten(0, 1).detach(), torch.ones(128)),
        lambda o: F.hinge_embedding_loss(o, torch.ones_like(o)),
        lambda o: F.triplet_margin_loss(o.flatten(0, 1), o.flatten(0, 1).detach(), 2 * o.flatten(0, 1).detach()),
        lambda o: F.multi_margin_loss(o.flatten(0, 1), ids),
        lambda o: F.multilabel_margin_loss(o.flatten(0, 1), torch.zeros(128, 32, dtype=torch.long)),
    ]
    for loss in losses:
        probe.seen.clear()
        _step(probe, encoder, x, loss)
    cnn = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.LazyLinear(4)
    )
    cnn(torch.randn(4, 3, 16, 16))
    _step(probe, cnn, torch.randn(4, 3, 16, 16), lambda o: F.cross_entropy(o, torch.zeros(4, dtype=torch.long)))
    _step(probe, nn.LSTM(32, 32, batch_first=True), x, lambda o: o[0].pow(2).mean())
    embed = nn.Sequential(nn.Embedding(100, 32), nn.LayerNorm(32), nn.Dropout(0.1), nn.GELU())
    _step(probe, embed, torch.randint(0, 100, (8, 16)), lambda o: o.pow(2).mean())
    # Overlap-add of 16 frames of 32 at a hop of 8 (an ISTFT's), and 2 x 2 blocks unfolded at a stride of 3.
    overlap = nn.Sequential(nn.Linear(16, 16), nn.Fold((1, 152), (1, 32), stride=(1, 8)))
    _step(probe, overlap, torch.randn(1, 32, 16), lambda o: o.pow(2).mean())
    strided = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Unfold(2, stride=3))
    probe.seen.clear()  # the fold's backward ran im2col already, its output larger than its input
    _step(probe, strided, torch.randn(2, 3, 12, 12), lambda o: o.pow(2).mean())

    larger = dict(probe.larger)
    rnn = larger.pop("aten.mkldnn_rnn_layer.default", None)
    if rnn is not None:  # oneDNN's workspace, sized by the real kernel (test_step.py checks its bytes)
        assert workspace_output(torch.ops.aten.mkldnn_rnn_layer.default) == 3
    # The reduced losses keep their elementwise buffer: 8 x 16 x 32 float32, counted at that size. A fold's
    # signal (152 values) and an unfold's blocks (2 x 12 x 16) keep their input's storage (32 x 16 frames,
    # 2 x 4 x 12 x 12 features): before, counted at the output's size (NeuCodec's inference 6.4% short).
    buffer = 8 * 16 * 32 * 4
    assert larger == {
        "aten.mse_loss.default": (buffer, buffer),
        "aten.smooth_l1_loss.default": (buffer, buffer),
        "aten.binary_cross_entropy.default": (buffer, buffer),
        "aten.soft_margin_loss.default": (buffer, buffer),
        "aten.col2im.default": (32 * 16 * 4, 32 * 16 * 4),
        "aten.im2col.default": (2 * 4 * 12 * 12 * 4, 2 * 4 * 12 * 12 * 4),
    }
