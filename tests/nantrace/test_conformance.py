"""Tracing never changes a script's outcome (issue 18.1): every parameterised or stateful ``torch.nn`` module and
functional that training code uses, in float32, bf16 autocast and fp16 autocast + GradScaler, run plainly and under
``nan-trace`` from the same seed: the same exit code and the same losses, bit for bit.

Each case is a few lines defining ``model`` and ``forward()`` (a scalar loss), run by one harness: two SGD steps
with momentum, the loss scaled by a GradScaler that is enabled for fp16 only. ``INFERENCE = True`` cases (the fast
paths torch takes only in eval mode without grad) run the forward alone under ``torch.inference_mode``. The whole
script is traced, model construction included (that is where ``Embedding(padding_idx=...)`` writes ``weight[0]``
under no_grad). The plain run is the same script through ``runpy`` in this process, so both share torch's state.
"""

from __future__ import annotations

import json
import runpy
import sys
import textwrap
from pathlib import Path

import pytest

from tests.nantrace._scripts import NanTrace

HARNESS = """
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

PRECISION, OUT = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
INFERENCE = False
{setup}
dtype = {{"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}}[PRECISION]
autocast = torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)
losses = []
if INFERENCE:
    model.eval()
    with torch.inference_mode(), autocast:
        losses.append(forward().item())
else:
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", enabled=PRECISION == "fp16")
    for step in range(2):
        optimizer.zero_grad()
        with autocast:
            loss = forward()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
with open(OUT, "w", encoding="utf-8") as handle:
    json.dump(losses, handle)
"""

CASES: dict[str, str] = {
    "embedding_padding_idx": """
        model = nn.Embedding(50, 16, padding_idx=0)
        ids = torch.randint(0, 50, (4, 7))
        ids[:, -2:] = 0
        def forward():
            return model(ids).pow(2).mean()
    """,
    "embedding_max_norm": """
        model = nn.Embedding(20, 8, max_norm=1.0)  # renormalises rows in place, under no_grad, in forward
        ids = torch.randint(0, 20, (3, 5))
        def forward():
            return model(ids).sum()
    """,
    "embedding_bag": """
        model = nn.EmbeddingBag(30, 8, mode="mean", padding_idx=1)
        ids = torch.randint(0, 30, (12,))
        offsets = torch.tensor([0, 4, 9])
        def forward():
            return model(ids, offsets).pow(2).mean()
    """,
    "bilstm_dropout_over_padded_embedding": """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(50, 16, padding_idx=0)
                self.lstm = nn.LSTM(16, 8, num_layers=2, bidirectional=True, dropout=0.25, batch_first=True)
            def forward(self, ids):
                return self.lstm(self.emb(ids))[0]
        model = Net()
        ids = torch.randint(0, 50, (4, 7))
        def forward():
            return model(ids).pow(2).mean()
    """,
    "packed_gru": """
        model = nn.GRU(6, 5, num_layers=2, dropout=0.2)
        x = torch.randn(7, 3, 6)
        lengths = torch.tensor([7, 5, 2])
        def forward():
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=True)
            out, _ = model(packed)
            padded, _ = nn.utils.rnn.pad_packed_sequence(out)
            return padded.pow(2).mean()
    """,
    "rnn_tanh_bidirectional": """
        model = nn.RNN(4, 6, bidirectional=True, batch_first=True)
        x = torch.randn(2, 5, 4)
        def forward():
            return model(x)[0].mean()
    """,
    "batchnorm_running_stats": """
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.BatchNorm1d(4 * 36))
        x = torch.randn(5, 3, 8, 8)
        def forward():
            return model(x).pow(2).mean()
    """,
    "instancenorm_groupnorm": """
        model = nn.Sequential(
            nn.Conv1d(4, 8, 3), nn.InstanceNorm1d(8, affine=True, track_running_stats=True), nn.GroupNorm(2, 8)
        )
        x = torch.randn(3, 4, 10)
        def forward():
            return model(x).pow(2).mean()
    """,
    "layernorm_rmsnorm": """
        model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU(), nn.RMSNorm(8), nn.Linear(8, 2))
        x = torch.randn(4, 8)
        def forward():
            return model(x).pow(2).mean()
    """,
    "multihead_attention": """
        model = nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True)
        x = torch.randn(2, 5, 8)
        mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
        def forward():
            out, weights = model(x, x, x, key_padding_mask=mask)
            return out.pow(2).mean() + weights.mean()
    """,
    "multihead_attention_fast_path": """
        INFERENCE = True  # torch's fused kernel runs only in eval mode without grad
        model = nn.MultiheadAttention(8, 2, batch_first=True)
        x = torch.randn(2, 5, 8)
        def forward():
            return model(x, x, x, need_weights=False)[0].float().pow(2).mean()
    """,
    "transformer_encoder_decoder_layers": """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.enc = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.1, batch_first=True)
                self.dec = nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.1, batch_first=True)
            def forward(self, src, tgt):
                causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
                return self.dec(tgt, self.enc(src), tgt_mask=causal)
        model = Net()
        src, tgt = torch.randn(2, 6, 8), torch.randn(2, 4, 8)
        def forward():
            return model(src, tgt).pow(2).mean()
    """,
    "transformer_encoder_fast_path": """
        INFERENCE = True  # the nested-tensor fast path: eval, no grad, a padding mask
        layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
        model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True)
        x = torch.randn(2, 6, 8)
        mask = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
        def forward():
            return model(x, src_key_padding_mask=mask).float().nan_to_num().pow(2).mean()
    """,
    "conv_1d_2d_3d": """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.c1, self.c2, self.c3 = nn.Conv1d(2, 3, 3), nn.Conv2d(2, 3, 3, stride=2), nn.Conv3d(2, 3, 2)
            def forward(self, a, b, c):
                return self.c1(a).mean() + self.c2(b).mean() + self.c3(c).pow(2).mean()
        model = Net()
        a, b, c = torch.randn(2, 2, 9), torch.randn(2, 2, 7, 7), torch.randn(1, 2, 4, 4, 4)
        def forward():
            return model(a, b, c)
    """,
    "conv_transpose_1d_2d_3d": """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.t1 = nn.ConvTranspose1d(2, 3, 3, stride=2)
                self.t2 = nn.ConvTranspose2d(2, 3, 3, stride=2, output_padding=1)
                self.t3 = nn.ConvTranspose3d(2, 2, 2)
            def forward(self, a, b, c):
                return self.t1(a).mean() + self.t2(b).pow(2).mean() + self.t3(c).mean()
        model = Net()
        a, b, c = torch.randn(2, 2, 5), torch.randn(2, 2, 4, 4), torch.randn(1, 2, 3, 3, 3)
        def forward():
            return model(a, b, c)
    """,
    "weight_norm_and_orthogonal_parametrizations": """
        from torch.nn.utils import parametrizations
        model = nn.Sequential(parametrizations.weight_norm(nn.Linear(6, 6)), nn.Tanh(), nn.Linear(6, 3))
        parametrizations.orthogonal(model[2])
        x = torch.randn(4, 6)
        def forward():
            return model(x).pow(2).mean()
    """,
    "spectral_norm": """
        from torch.nn.utils import parametrizations
        model = nn.Sequential(parametrizations.spectral_norm(nn.Linear(6, 6)), nn.ReLU(), nn.Linear(6, 1))
        x = torch.randn(4, 6)  # power iteration updates its u/v buffers in place at every training forward
        def forward():
            return model(x).pow(2).mean()
    """,
    "inplace_activations": """
        model = nn.Sequential(
            nn.Linear(6, 8), nn.ReLU(inplace=True), nn.Linear(8, 8), nn.LeakyReLU(0.1, inplace=True),
            nn.Linear(8, 8), nn.Hardtanh(inplace=True), nn.Linear(8, 8), nn.SiLU(inplace=True),
            nn.Dropout(0.3, inplace=True), nn.Linear(8, 1),
        )
        x = torch.randn(5, 6)
        def forward():
            return model(x).pow(2).mean()
    """,
    "activation_checkpointing": """
        from torch.utils.checkpoint import checkpoint
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.block = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Dropout(0.2), nn.Linear(12, 6))
                self.head = nn.Linear(6, 1)
            def forward(self, x):
                return self.head(checkpoint(self.block, x, use_reentrant=False) + x)
        model = Net()
        x = torch.randn(4, 6)
        def forward():
            return model(x).pow(2).mean()
    """,
    "torch_compile": """
        # The eager backend runs the very aten ops dynamo captured, so the plain run is comparable bit for bit;
        # under tracing torch.compile hands back the model itself (a note in the report says so).
        model = torch.compile(nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 1)), backend="eager")
        x = torch.randn(4, 6)
        def forward():
            return model(x).pow(2).mean()
    """,
    "sdpa_causal_with_dropout": """
        model = nn.Linear(8, 24)
        x = torch.randn(2, 5, 8)
        def forward():
            q, k, v = model(x).view(2, 5, 3, 2, 4).unbind(2)
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
            return out.pow(2).mean()
    """,
    "functional_losses": """
        model = nn.Linear(6, 5)
        x, labels = torch.randn(8, 6), torch.tensor([0, 1, 2, 3, 4, -100, 1, 2])
        def forward():
            logits = model(x)
            ce = F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1)
            nll = F.nll_loss(F.log_softmax(logits, dim=-1), labels.clamp(min=0))
            bce = F.binary_cross_entropy_with_logits(logits, torch.sigmoid(logits.detach()))
            kl = F.kl_div(F.log_softmax(logits, -1), F.softmax(logits.detach() * 2, -1), reduction="batchmean")
            smooth = F.smooth_l1_loss(logits, logits.detach() * 0.5) + F.mse_loss(logits, logits.detach())
            return ce + nll + bce + kl + smooth
    """,
    "functional_layers": """
        weight = nn.Parameter(torch.randn(10, 4))
        gamma, beta = nn.Parameter(torch.ones(4)), nn.Parameter(torch.zeros(4))
        model = nn.ParameterList([weight, gamma, beta])
        running_mean, running_var = torch.zeros(4), torch.ones(4)
        ids = torch.randint(0, 10, (6,))
        def forward():
            h = F.embedding(ids, weight, padding_idx=0)
            h = F.batch_norm(h, running_mean, running_var, gamma, beta, training=True)
            h = F.layer_norm(F.dropout(F.gelu(h), 0.2, training=True), (4,))
            return F.normalize(h, dim=-1).pow(2).sum() + F.softplus(h).mean()
    """,
    "affine_grid_grid_sample": """
        # affine_grid_generator has no autocast rule: its kernel's bmm meets autocast from inside (issue 30.1)
        theta = nn.Parameter(torch.eye(2, 3).repeat(2, 1, 1) + 0.05 * torch.randn(2, 2, 3))
        model = nn.ParameterList([theta])
        x = torch.randn(2, 3, 8, 8)
        def forward():
            grid = F.affine_grid(theta, (2, 3, 6, 6), align_corners=False)
            return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False).pow(2).mean()
    """,
    "bilinear": """
        model = nn.Bilinear(5, 6, 4)
        a, b = torch.randn(3, 5), torch.randn(3, 6)
        def forward():
            return model(a, b).pow(2).mean()
    """,
    "rnn_lstm_gru_cells": """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn, self.lstm, self.gru = nn.RNNCell(5, 7), nn.LSTMCell(7, 6), nn.GRUCell(6, 4)
            def forward(self, x):
                h = c = g = None
                for t in range(x.shape[0]):
                    h = self.rnn(x[t], h)
                    hc = self.lstm(h) if c is None else self.lstm(h, c)
                    c = hc
                    g = self.gru(hc[0], g)
                return g
        model = Net()
        x = torch.randn(3, 2, 5)
        def forward():
            return model(x).pow(2).mean()
    """,
    "nested_jagged_tensor": """
        # A jagged nested tensor is a wrapper without storage of its own (issue 30.2: tracing crashed on it)
        model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))
        seqs = [torch.randn(3, 8), torch.randn(5, 8)]
        def forward():
            nt = torch.nested.nested_tensor(seqs, layout=torch.jagged)
            out = model(nt)
            return out.values().float().pow(2).mean() + torch.nested.to_padded_tensor(out, 0.0).float().mean()
    """,
    "qat_fake_quantize": """
        # FakeQuantize observers start at min +inf / max -inf: the user's own constants (issue 30.2)
        import warnings
        import torch.ao.quantization as tq
        warnings.simplefilter("ignore")
        model = nn.Sequential(tq.QuantStub(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2), tq.DeQuantStub())
        model.qconfig = tq.get_default_qat_qconfig("fbgemm")
        tq.prepare_qat(model.train(), inplace=True)
        x = torch.randn(8, 6)
        def forward():
            return model(x).float().pow(2).mean()
    """,
    "pooling_upsampling_pixelshuffle": """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv, self.prelu = nn.Conv2d(2, 8, 3, padding=1), nn.PReLU(8)
                self.pool, self.avg = nn.MaxPool2d(2, return_indices=False), nn.AdaptiveAvgPool2d(3)
                self.shuffle, self.up = nn.PixelShuffle(2), nn.Upsample(scale_factor=2, mode="bilinear")
            def forward(self, x):
                h = self.prelu(self.conv(F.pad(x, (1, 1, 1, 1), mode="reflect")))
                h = self.up(self.shuffle(self.pool(h)))
                u = F.fold(F.unfold(h, 2, stride=2), h.shape[-2:], 2, stride=2)
                return self.avg(h).mean() + F.avg_pool2d(u, 2).pow(2).mean() + F.interpolate(h, size=5).mean()
        model = Net()
        x = torch.randn(2, 2, 8, 8)
        def forward():
            return model(x)
    """,
    "losses_ctc_triplet_cosine": """
        model = nn.Linear(6, 5)
        x = torch.randn(7, 2, 6)
        targets, target_lengths = torch.tensor([[1, 2], [3, 1]]), torch.tensor([2, 2])
        def forward():
            logp = model(x).float().log_softmax(-1)
            ctc = F.ctc_loss(logp, targets, torch.tensor([7, 7]), target_lengths)
            a, p, n = model(x[0]), model(x[1]), model(x[2])
            triplet = F.triplet_margin_loss(a, p, n) + F.cosine_embedding_loss(a, p, torch.tensor([1, -1]))
            return ctc + triplet + F.huber_loss(a, p) + F.cosine_similarity(a, n).mean()
    """,
    "activation_and_dropout_modules": """
        acts = [nn.ELU(), nn.CELU(), nn.SELU(), nn.Mish(), nn.Softplus(), nn.Hardswish(), nn.Hardsigmoid(),
                nn.ReLU6(), nn.LeakyReLU(0.1), nn.RReLU(), nn.Threshold(-0.5, -0.5), nn.Hardtanh(), nn.Hardshrink(0.1),
                nn.Softshrink(0.1), nn.Tanhshrink(), nn.Softsign(), nn.LogSigmoid(), nn.Sigmoid(), nn.SiLU(),
                nn.Tanh(), nn.ReLU(), nn.GELU(approximate="tanh"), nn.Identity()]
        model = nn.ModuleDict({"inp": nn.Linear(6, 16), "acts": nn.ModuleList(acts), "glu_in": nn.Linear(16, 32),
                               "glu": nn.GLU(), "drops": nn.Sequential(nn.AlphaDropout(0.2), nn.Dropout(0.1)),
                               "feat": nn.Sequential(nn.FeatureAlphaDropout(0.2), nn.Dropout1d(0.2))})
        model["scale"] = nn.Linear(16, 16)
        x = torch.randn(5, 6)
        def forward():
            h = model["inp"](x)
            total = 0
            for act in model["acts"]:
                # rrelu has no float16 kernel on CPU: plain torch raises there too
                total = total + act(h.float() if isinstance(act, nn.RReLU) else h).float().mean()
            h = model["glu"](model["glu_in"](torch.tanh(h)))
            h = model["drops"](h) + model["feat"](h.unsqueeze(-1)).squeeze(-1)
            h = model["scale"](h)
            probs = nn.Softmax(-1)(h).float().pow(2).mean() + nn.Softmin(-1)(h).float().mean()
            return total + probs + nn.LogSoftmax(-1)(h).float().mean() + nn.Softmax2d()(h[None, :, :, None]).mean()
    """,
    "loss_modules": """
        model = nn.ModuleList([nn.Linear(6, 5), nn.AdaptiveLogSoftmaxWithLoss(6, 12, cutoffs=[4, 8], div_value=2.0),
                               nn.LinearCrossEntropyLoss(6, 5, bias=True, label_smoothing=0.05)])
        x, labels = torch.randn(8, 6), torch.tensor([0, 1, 2, 3, 4, -100, 1, 2])
        soft = torch.rand(8, 5)
        multi = torch.tensor([[0, 3, -1, 0, 0]]).repeat(8, 1)
        sign = torch.tensor([1.0, -1.0] * 4)
        words = torch.randint(0, 12, (8,))
        ctc_in, targets, lengths = torch.randn(7, 2, 6), torch.tensor([[1, 2], [3, 1]]), torch.tensor([2, 2])
        def forward():
            logits = model[0](x)
            a, p, n = logits[:3], logits[3:6], logits[5:8]
            with torch.autocast("cpu", enabled=False):  # BCELoss refuses autocast; plain torch raises there too
                bce = nn.BCELoss()(torch.sigmoid(logits.float()), soft)
                adaptive = model[1](x, words).loss  # its index_copy_ mixes dtypes under autocast, plainly too
            terms = [
                nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=0.1)(logits, labels),
                nn.NLLLoss()(F.log_softmax(logits, -1), labels.clamp(min=0)),
                bce,
                nn.BCEWithLogitsLoss(pos_weight=torch.full((5,), 2.0))(logits, soft),
                nn.MSELoss()(logits, soft), nn.L1Loss()(logits, soft), nn.SmoothL1Loss(beta=0.5)(logits, soft),
                nn.HuberLoss(delta=0.5)(logits, soft),
                nn.KLDivLoss(reduction="batchmean")(F.log_softmax(logits, -1), F.softmax(soft, -1)),
                nn.PoissonNLLLoss()(logits, soft), nn.GaussianNLLLoss()(logits, soft, torch.ones(8, 5)),
                nn.MarginRankingLoss(0.1)(logits[:, 0], logits[:, 1], sign),
                nn.HingeEmbeddingLoss()(logits.norm(dim=-1), sign), nn.SoftMarginLoss()(logits[:, 0], sign),
                nn.MultiLabelMarginLoss()(logits, multi), nn.MultiMarginLoss()(logits, labels.clamp(min=0)),
                nn.MultiLabelSoftMarginLoss()(logits, (soft > 0.5).float()),
                nn.CosineEmbeddingLoss()(a, p, sign[:3]), nn.TripletMarginLoss()(a, p, n),
                nn.TripletMarginWithDistanceLoss(distance_function=nn.PairwiseDistance())(a, p, n),
                nn.CosineSimilarity()(a, n).mean(), nn.PairwiseDistance()(a, p).mean(),
                nn.CTCLoss()(model[0](ctc_in).float().log_softmax(-1), targets, torch.tensor([7, 7]), lengths),
                adaptive,
                model[2](x, labels.clamp(min=0)),
            ]
            return sum(t.float() for t in terms)
    """,
    "lazy_norm_pool_pad_modules": """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.lazy2 = nn.Sequential(nn.LazyConv2d(4, 3, padding=1), nn.LazyBatchNorm2d(),
                                           nn.LazyInstanceNorm2d(affine=True), nn.LazyConvTranspose2d(4, 2, stride=2))
                self.lazy1 = nn.Sequential(nn.LazyConv1d(3, 3), nn.LazyBatchNorm1d(), nn.LazyInstanceNorm1d(),
                                           nn.LazyConvTranspose1d(2, 3), nn.Flatten(), nn.LazyLinear(4))
                self.lazy3 = nn.Sequential(nn.LazyConv3d(2, 2), nn.LazyBatchNorm3d(), nn.LazyInstanceNorm3d(),
                                           nn.LazyConvTranspose3d(2, 2))
                self.norm3 = nn.Sequential(nn.BatchNorm3d(2), nn.InstanceNorm3d(2, affine=True))
                # Apart from the pools: LPPool's root has an infinite gradient at a channel dropout zeroed (plainly)
                self.drops = nn.ModuleList([nn.Dropout2d(0.2), nn.Dropout3d(0.2)])
                # SyncBatchNorm with no process group is batch norm (what a single-process run of DDP code meets)
                self.norm2 = nn.Sequential(nn.SyncBatchNorm(4), nn.InstanceNorm2d(4, track_running_stats=True),
                                           nn.LocalResponseNorm(2), nn.CrossMapLRN2d(3), nn.ChannelShuffle(2))
                self.pads = nn.ModuleList([
                    nn.ZeroPad1d(1), nn.ConstantPad1d(1, 0.5), nn.ReflectionPad1d(1), nn.ReplicationPad1d(1),
                    nn.CircularPad1d(1)])
                self.pads2 = nn.ModuleList([
                    nn.ZeroPad2d(1), nn.ConstantPad2d(1, 0.5), nn.ReflectionPad2d(1), nn.ReplicationPad2d(1),
                    nn.CircularPad2d(1)])
                self.pads3 = nn.ModuleList([
                    nn.ZeroPad3d(1), nn.ConstantPad3d(1, 0.5), nn.ReflectionPad3d(1), nn.ReplicationPad3d(1),
                    nn.CircularPad3d(1)])
                self.pool1 = nn.ModuleList([nn.AvgPool1d(2), nn.MaxPool1d(2), nn.AdaptiveAvgPool1d(3),
                                            nn.AdaptiveMaxPool1d(3), nn.LPPool1d(2, 2)])
                self.pool2 = nn.ModuleList([nn.AvgPool2d(2), nn.AdaptiveMaxPool2d(3), nn.LPPool2d(2, 2),
                                            nn.FractionalMaxPool2d(2, output_size=3)])
                self.pool3 = nn.ModuleList([nn.AvgPool3d(2), nn.MaxPool3d(2), nn.AdaptiveAvgPool3d(2),
                                            nn.AdaptiveMaxPool3d(2), nn.LPPool3d(2, 2),
                                            nn.FractionalMaxPool3d(2, output_size=2)])
                self.unpool = nn.ModuleList([nn.MaxUnpool1d(2), nn.MaxUnpool2d(2), nn.MaxUnpool3d(2)])
                self.shape = nn.Sequential(nn.PixelUnshuffle(2), nn.PixelShuffle(2),
                                           nn.UpsamplingNearest2d(scale_factor=2),
                                           nn.UpsamplingBilinear2d(size=6), nn.Unfold(2, stride=2),
                                           nn.Fold((6, 6), 2, stride=2), nn.Flatten(1), nn.Unflatten(1, (4, 36)))
                self.params = nn.ParameterDict({"gain": nn.Parameter(torch.ones(4, 1))})
            def forward(self, x2, x1, x3):
                h2 = self.norm2(self.lazy2(x2))
                h1, h3 = self.lazy1(x1), self.norm3(self.lazy3(x3))
                total = h1.float().mean() + sum(p(h1.unsqueeze(1)).float().mean() for p in self.pads)
                total = total + self.drops[0](h2).float().pow(2).mean() + self.drops[1](h3).float().pow(2).mean()
                for group, t in ((self.pads2, h2), (self.pads3, h3), (self.pool1, x1), (self.pool2, h2),
                                 (self.pool3, h3)):
                    total = total + sum(p(t).float().mean() for p in group)
                for unpool, pool, t in zip(self.unpool, (F.max_pool1d, F.max_pool2d, F.max_pool3d), (x1, h2, h3)):
                    out, idx = pool(t, 2, return_indices=True)
                    total = total + unpool(out, idx).float().mean()
                return total + (self.shape(h2) * self.params["gain"]).float().pow(2).mean()
        model = Net()
        x2, x1, x3 = torch.randn(2, 3, 6, 6), torch.randn(2, 3, 8), torch.randn(2, 2, 4, 4, 4)
        with torch.no_grad():
            model(x2, x1, x3)  # the lazy modules take their shapes before the optimizer sees the parameters
        def forward():
            return model(x2, x1, x3)
    """,
    "transformer_and_decoder": """
        model = nn.ModuleDict({
            "full": nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=16,
                                   dropout=0.1, batch_first=True),
            "decoder": nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, dropout=0.1, norm_first=True), 2,
                                             norm=nn.LayerNorm(8)),
        })
        src, tgt = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
        mask = nn.Transformer.generate_square_subsequent_mask(4)
        def forward():
            out = model["full"](src, tgt, tgt_mask=mask, tgt_is_causal=True)
            dec = model["decoder"](tgt.transpose(0, 1), src.transpose(0, 1), tgt_mask=mask)
            return out.float().pow(2).mean() + dec.float().pow(2).mean()
    """,
}

PRECISIONS = ("fp32", "bf16", "fp16")


def _script(nantrace: NanTrace, case: str) -> Path:
    setup = textwrap.dedent(CASES[case]).strip("\n")
    path, _ = nantrace.write(f"{case}.py", HARNESS.format(setup=setup))
    return path


def _plain_run(script: Path, precision: str, out: Path) -> tuple[list[float], str | None]:
    """(losses, None), or ([], "Type: message") when the script itself fails (an op this CPU lacks in fp16)."""
    saved = sys.argv[:]
    sys.argv = [str(script), precision, str(out)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except Exception as exc:  # noqa: BLE001  (the plain run's own outcome, compared with the traced one)
        return [], f"{type(exc).__name__}: {exc}".splitlines()[0]
    finally:
        sys.argv = saved
    return list(json.loads(out.read_text(encoding="utf-8"))), None


def _assert_fails_as_plain(nantrace: NanTrace, script: Path, precision: str, tmp_path: Path, failed: str) -> None:
    """The traced run dies of the plain run's exception: exit 3 with its ``error:`` line, and a dtype mismatch
    explained in the document (its ``dtype_error`` quotes the same exception)."""
    result = nantrace.run(str(script), "--format", "json", "--", precision, str(tmp_path / "traced.json"))
    assert result.exit_code == 3
    last = result.stderr.strip().splitlines()[-1]
    if result.stdout:
        doc = json.loads(result.stdout)
        assert (doc["status"], doc["dtype_error"]["exception"]) == ("error", failed)
        assert last.startswith(f"error: {script.name} died of a dtype mismatch: {failed}; fix: "), last
    else:
        assert last.startswith(f"error: {script.name} raised {failed} (at line "), last


CORPUS = [(c, p) for c in sorted(CASES) for p in PRECISIONS]


@pytest.mark.parametrize(("case", "precision"), CORPUS)
def test_tracing_leaves_the_losses_bit_for_bit(nantrace: NanTrace, tmp_path: Path, case: str, precision: str) -> None:
    script = _script(nantrace, case)
    plain, failed = _plain_run(script, precision, tmp_path / "plain.json")
    if failed is not None:
        # The script fails on its own: under tracing it fails the same way, exit 3 with the same error.
        _assert_fails_as_plain(nantrace, script, precision, tmp_path, failed)
        return
    assert plain, "the harness recorded no loss"
    code, doc, stderr = nantrace.json(str(script), "--", precision, str(tmp_path / "traced.json"))
    assert (code, doc["status"]) == (0, "clean"), (stderr, doc["first"], doc["exception"])
    traced = json.loads((tmp_path / "traced.json").read_text(encoding="utf-8"))
    # JSON floats round-trip exactly: equal lists are equal bits (a NaN loss would fail here too).
    assert traced == plain
    assert doc["steps"] == (0 if "INFERENCE = True" in CASES[case] else 2)
    assert doc["ops"] >= 10  # the run's ops went through the tracer (16 for the smallest, the fused MHA)
    if case == "torch_compile":
        assert doc["notes"] == [
            "torch.compile was called 1 time(s) and ran eagerly under tracing, so that every op could be checked; "
            "compiled kernels may round differently"
        ]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_fused_kernel_keeps_autocast_inside_under_tracing(nantrace: NanTrace, tmp_path: Path, precision: str) -> None:
    """TransformerEncoder's nested-tensor fast path calls its inner ops from inside one kernel: plain torch mixes
    dtypes there under autocast and raises, and so does the traced run now (it used to pass, in float32)."""
    script = _script(nantrace, "transformer_encoder_fast_path")
    plain, failed = _plain_run(script, precision, tmp_path / "plain.json")
    dtype = {"bf16": "BFloat16", "fp16": "Half"}[precision]
    assert (plain, failed) == ([], f"RuntimeError: expected scalar type Float but found {dtype}")
    assert failed is not None
    _assert_fails_as_plain(nantrace, script, precision, tmp_path, failed)


def test_the_corpus_covers_what_the_issue_lists() -> None:
    source = "\n".join(CASES.values())
    for name in (
        "padding_idx",
        "max_norm",
        "EmbeddingBag",
        "BatchNorm",
        "InstanceNorm",
        "GroupNorm",
        "LayerNorm",
        "RMSNorm",
        "nn.RNN",
        "nn.LSTM",
        "nn.GRU",
        "bidirectional",
        "pack_padded_sequence",
        "MultiheadAttention",
        "TransformerEncoderLayer",
        "TransformerDecoderLayer",
        "Conv1d",
        "Conv2d",
        "Conv3d",
        "ConvTranspose1d",
        "ConvTranspose2d",
        "ConvTranspose3d",
        "weight_norm",
        "orthogonal",
        "spectral_norm",
        "inplace=True",
        "checkpoint(",
        "torch.compile",
        "scaled_dot_product_attention",
        "Dropout(",
        "F.affine_grid",
        "F.grid_sample",
        "nn.Bilinear",
        "nn.RNNCell",
        "nn.LSTMCell",
        "nn.GRUCell",
        "layout=torch.jagged",
        "prepare_qat",
        "PixelShuffle",
        "F.ctc_loss",
    ):
        assert name in source, name
    assert (len(CASES), len(PRECISIONS), len(CORPUS)) == (34, 3, 102)


NOT_IN_THE_CORPUS = {
    "Container": "a deprecated base class with no forward",
    "RNNBase": "the base class of RNN, LSTM and GRU (all in the corpus)",
    "RNNCellBase": "the base class of the three cells (all in the corpus)",
    "NLLLoss2d": "a deprecated alias of NLLLoss",
    "DataParallel": "replicates onto several GPUs; the CPU suite has none",
}
"""Every other ``torch.nn`` module class is named in a case: what is left out, and why."""


def test_the_corpus_names_every_torch_nn_module() -> None:
    import inspect
    import re

    from torch import nn

    source = "\n".join(CASES.values())
    modules = sorted(n for n, o in vars(nn).items() if inspect.isclass(o) and issubclass(o, nn.Module))
    missing = [n for n in modules if not re.search(rf"\b{n}\b", source) and n not in NOT_IN_THE_CORPUS]
    assert missing == []
    assert len(modules) >= 160  # the classes torch.nn exported when the corpus was grown (163 in torch 2.13)
