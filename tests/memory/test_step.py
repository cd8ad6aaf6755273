"""The user's own training step (issue 12): factory ``loss_fn`` or ``--loss``, the output referenced through
backward, torch's default optimizer implementation, ``--measure`` of every row, oneDNN's LSTM workspace.

Referees: hand-derived byte counts, and PyTorch's MemTracker on a plain training loop written here.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from dtypecheck.dtypes import lookup
from dtypecheck.memory import EstimateOptions, estimate_memory, open_subject
from dtypecheck.memory_words import Mode

LM = """
import torch
import torch.nn.functional as F
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, tied=False):
        super().__init__()
        self.embed = nn.Embedding(500, 32)
        self.body = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.LayerNorm(32))
        self.head = nn.Linear(32, 500, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)))


def ids():
    torch.manual_seed(0)
    return torch.randint(0, 500, (4, 24))


def with_loss():
    return TinyLM(), ids(), lambda logits, ids: F.cross_entropy(logits.flatten(0, 1), ids.flatten())


def tied_with_loss():
    return TinyLM(tied=True), ids(), lambda logits, ids: F.cross_entropy(logits.flatten(0, 1), ids.flatten())


def model_only():
    return TinyLM(), ids()


def one_argument_loss():
    return TinyLM(), ids(), lambda logits: logits.float().pow(2).mean()


def failing_loss():
    def loss_fn(logits, ids):
        raise KeyError("labels")
    return TinyLM(), ids(), loss_fn


def wide():
    torch.manual_seed(0)
    return nn.Linear(256, 256, bias=False), torch.randn(4, 256)


class LSTMLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(200, 32)
        self.lstm = nn.LSTM(32, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 200)

    def forward(self, ids):
        return self.head(self.lstm(self.embed(ids))[0])


def lstm():
    torch.manual_seed(0)
    return LSTMLM(), torch.randint(0, 200, (4, 16)), lambda logits, ids: F.cross_entropy(
        logits.flatten(0, 1), ids.flatten()
    )
"""


@pytest.fixture
def lm(tmp_path):
    path = tmp_path / "lm.py"
    path.write_text(LM, encoding="utf-8")
    return str(path)


def _namespace(path: str) -> dict[str, Any]:
    import runpy

    return runpy.run_path(path)


def _loop_peak(model: nn.Module, inputs: torch.Tensor, loss_fn, *, amp: bool = False) -> int:
    """MemTracker's peak of the second iteration of a plain loop: torch's default AdamW, output referenced."""
    optimizer = torch.optim.AdamW(model.parameters())

    def step(batch: torch.Tensor) -> None:
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if amp else contextlib.nullcontext()
        with autocast:
            logits = model(batch)
            loss = loss_fn(logits, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(inputs.clone())
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracker:
            step(inputs.clone())
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def _training_total(target: str, dtype: str = "float32", precision: str = "pure", **kwargs) -> int:
    subject = open_subject(target, **kwargs)
    options = EstimateOptions(dtypes=(lookup(dtype),), modes=("training",), precisions=(precision,))  # type: ignore[arg-type]
    return estimate_memory(subject, options).estimates[0].bytes.total


def _cpu_runs_a_bf16_lstm() -> bool:
    """Whether this CPU's oneDNN has a bf16 LSTM kernel (some x86 CPUs without AVX-512 BF16 have none: the real
    step raises "could not create a primitive descriptor" there, in torch, before anything is measured)."""
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            nn.LSTM(4, 4, batch_first=True)(torch.ones(1, 2, 4))
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("factory", ["with_loss", "tied_with_loss", "lstm"])
@pytest.mark.parametrize("amp", [False, True], ids=["float32", "bf16-amp"])
def test_estimate_equals_memtracker_on_the_users_loop(lm, factory, amp):
    if factory == "lstm" and amp and not _cpu_runs_a_bf16_lstm():
        pytest.skip("this CPU's oneDNN has no bf16 LSTM kernel: torch itself cannot run the measured step")
    model, inputs, loss_fn = _namespace(lm)[factory]()
    measured = _loop_peak(model, inputs, loss_fn, amp=amp)
    estimate = _training_total(f"{lm}:{factory}", "bfloat16" if amp else "float32", "amp" if amp else "pure")
    # Both count live storages; only scalar bookkeeping tensors of autocast could differ.
    assert estimate == pytest.approx(measured, rel=0.001)


def test_named_loss_is_the_same_step_as_the_factory_loss(lm):
    # --loss cross-entropy takes the batch's own token ids as targets: the same ops as with_loss's loss_fn.
    assert _training_total(f"{lm}:model_only", loss="cross-entropy") == _training_total(f"{lm}:with_loss")


def _ids_cross_entropy(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), (ids % 500).flatten())


def _zeros_mse(out: torch.Tensor, _x: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, torch.zeros_like(out))


@pytest.mark.parametrize(
    ("factory", "chosen", "loss_fn", "exact"),
    [
        # Integer inputs and float logits: cross-entropy over the last dimension, the batch's ids as labels.
        ("model_only", "cross-entropy", _ids_cross_entropy, True),
        # Float inputs: MSE against a target of the output's shape, which the trace holds with the batch for the
        # whole step; this loop's loss_fn makes its target at the loss and drops it there (4 x 256 float32 less).
        ("wide", "mse", _zeros_mse, False),
    ],
)
def test_default_loss_is_chosen_from_the_output_and_named(cli, lm, factory, chosen, loss_fn, exact):
    model, inputs = _namespace(lm)[factory]()
    measured = _loop_peak(model, inputs, loss_fn)
    estimate = _training_total(f"{lm}:{factory}")
    if exact:
        assert estimate == pytest.approx(measured, rel=0.001)
    else:
        assert measured - estimate == -(4 * 256 * 4)
    doc = cli("estimate-memory", f"{lm}:{factory}", "-d", "fp32", "-m", "training", "-f", "json").json()
    assert doc["model"]["loss"] == chosen
    named = "cross-entropy over the last dimension" if chosen == "cross-entropy" else "MSE against a target"
    assert f"no loss given: assumed {named}" in " ".join(doc["model"]["notes"])


def test_logits_kept_alive_cost_more_than_the_old_dropped_output(lm):
    # The sum of the logits holds nothing for backward; cross-entropy saves its log-softmax (logits-sized).
    assert _training_total(f"{lm}:model_only", loss="cross-entropy") > _training_total(f"{lm}:model_only", loss="sum")


def test_optimizer_step_phase_by_hand(cli, lm):
    doc = cli("estimate-memory", f"{lm}:wide", "-d", "fp32", "-m", "training", "-f", "json").json()
    row = doc["estimates"][0]
    weights = 256 * 256 * 4
    states = 2 * weights + 4  # exp_avg, exp_avg_sq and the float32 step
    transient = 2 * weights  # for-loop AdamW: sqrt and quotient of the one tensor
    # The batch, the output, the MSE's target (loaded with the batch) and the loss, still referenced: the CPU
    # kernel's mean is a 0-dim view of its elementwise buffer, which the scalar keeps (4 x 256 float32).
    retained = 4 * 256 * 4 + 4 * 256 * 4 + 4 * 256 * 4 + 4 * 256 * 4
    assert row["optimizer_impl"] == "for-loop"
    assert row["peak_phase"] == "optimizer-step"
    assert row["bytes"]["optimizer_step_transient"] == transient
    assert row["bytes"]["total"] == weights + states + weights + transient + retained == 1_589_252
    cuda = cli("estimate-memory", f"{lm}:wide", "-d", "fp32", "-m", "training", "--device", "cuda", "-f", "json")
    row = cuda.json()["estimates"][0]
    assert row["optimizer_impl"] == "foreach"
    assert row["bytes"]["optimizer_step_transient"] == weights  # one sqrt of every exp_avg_sq at once


def test_one_argument_loss_fn(cli, lm):
    doc = cli("estimate-memory", f"{lm}:one_argument_loss", "-d", "fp32", "-f", "json").json()
    assert doc["model"]["loss"] == "loss_fn"


def test_measure_runs_every_float_row(cli, lm):
    result = cli("estimate-memory", f"{lm}:with_loss", "-d", "fp32,bf16,int8", "--measure", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    rows = [(m["dtype"], m["mode"], m["precision"]) for m in doc["measurements"]]
    assert rows == [
        ("float32", "inference", "pure"),
        ("float32", "training", "pure"),
        ("bfloat16", "inference", "pure"),
        ("bfloat16", "training", "amp"),
    ]
    assert doc["measured"] == doc["measurements"][1]
    assert all(abs(m["error"]) < 0.001 for m in doc["measurements"])
    assert any("measuring int8 inference" in line for line in doc["skipped"])
    table = cli("estimate-memory", f"{lm}:with_loss", "-d", "fp32", "--measure").stdout
    assert "measured" in table
    assert "+0.0%" in table


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("{lm}:with_loss", "--loss", "mse"), 2, "returns its own loss_fn; leave out --loss"),
        (("{lm}:model_only", "--loss", "hinge"), 2, "hinge"),
        (("{lm}:failing_loss", "-m", "training"), 3, "raised KeyError: 'labels'"),
        (("{lm}:wide", "--fit", "h100"), 2, "did you mean 'h100-94gb' or 'h100-80gb'?"),
        (("{lm}:wide", "--fit", "80GiB", "--reserve", "90GiB"), 2, "leaves nothing"),
        (("{lm}:wide", "--fit", "80 parsecs"), 2, "expected a size"),
    ],
)
def test_bad_step_options(cli, lm, args, code, message):
    result = cli("estimate-memory", *[a.format(lm=lm) for a in args])
    assert result.exit_code == code, result.stderr
    assert result.stdout == ""
    assert message in result.stderr.strip().splitlines()[-1]


def test_loss_fn_error_shows_the_users_frame(cli, lm):
    line = next(n for n, text in enumerate(LM.splitlines(), 1) if 'raise KeyError("labels")' in text)
    result = cli("estimate-memory", f"{lm}:failing_loss", "-m", "training")
    assert result.exit_code == 3
    # One line that says where (the contract: no traceback unless asked for)...
    assert result.stderr == (
        f"error: loss_fn(output, inputs) raised KeyError: 'labels' (at line {line} in loss_fn; "
        "--traceback shows the traceback)\n"
    )
    # ...and the user's own frames with --traceback.
    result = cli("estimate-memory", f"{lm}:failing_loss", "-m", "training", "--traceback")
    assert result.exit_code == 3
    assert 'raise KeyError("labels")' in result.stderr
    assert "dtypecheck/memory" not in result.stderr


def test_large_lstm_workspace_is_extended_from_small_probes(monkeypatch):
    from dtypecheck.memory import workspaces

    rnn = torch.ops.aten.mkldnn_rnn_layer.default

    def args(batch: int) -> tuple[Any, ...]:
        weights = (torch.zeros(256, 64), torch.zeros(256, 64), torch.zeros(256), torch.zeros(256))
        states = (torch.zeros(batch, 64), torch.zeros(batch, 64))
        return (torch.zeros(32, batch, 64), *weights, *states, False, [], 2, 64, 1, True, False, False, True)

    exact = int(rnn(*args(48))[3].untyped_storage().nbytes())  # the real kernel at batch 48
    real_bytes = sum(a.nbytes for a in args(48) if isinstance(a, torch.Tensor))
    # As for a --fit search at a batch too big to allocate: probes at batch 8 and 16, extended to 48.
    monkeypatch.setattr(workspaces, "PROBE_LIMIT", real_bytes // 3)
    extended = workspaces.real_workspace_bytes(rnn, 3, args(48), {})
    assert extended == pytest.approx(exact, rel=0.005)


def _accumulation_peak(model: nn.Module, ids: torch.Tensor, loss_fn, micro_batches: int) -> int:
    """MemTracker's peak of a plain accumulation loop (after a warm-up step): every micro-batch's backward, then
    one AdamW step; each micro-batch is loaded as the previous one is let go."""
    optimizer = torch.optim.AdamW(model.parameters())

    def step(between=None) -> None:
        for i in range(micro_batches):
            if i and between is not None:
                between()
            batch = ids.clone()
            logits = model(batch)
            loss = loss_fn(logits, batch)
            loss.backward()
            del logits, loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracker:
            step(tracker.reset_mod_stats)
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def test_gradient_accumulation_equals_a_measured_accumulation_loop(lm):
    model, ids, loss_fn = _namespace(lm)["with_loss"]()
    measured = _accumulation_peak(model, ids, loss_fn, 2)
    subject = open_subject(f"{lm}:with_loss")
    options = EstimateOptions(dtypes=(lookup("float32"),), modes=(Mode.training,), grad_accum=2)
    row = estimate_memory(subject, options).estimates[0]
    assert row.grad_accum == 2
    assert row.bytes.total == pytest.approx(measured, rel=0.001)
    # Without accumulation the second micro-batch's gradients are not held: the single step is smaller.
    single = _training_total(f"{lm}:with_loss")
    assert single < measured
    # From the second micro-batch on, the whole set of float32 gradients is held beside the activations.
    params = sum(p.numel() for p in model.parameters())
    assert row.bytes.activations is not None
    assert row.bytes.total - row.bytes.activations - row.bytes.parameters - row.bytes.optimizer_states == 4 * params


def test_grad_accum_option_and_config_key(cli, lm, tmp_path):
    args = ("estimate-memory", f"{lm}:with_loss", "-d", "fp32", "-m", "training", "-f", "json")
    flagged = cli(*args, "--grad-accum", "2").json()["estimates"][0]
    config = tmp_path / "dtypecheck.toml"
    config.write_text("[estimate-memory]\ngrad-accum = 2\n", encoding="utf-8")
    configured = cli(*args, "--config", str(config)).json()["estimates"][0]
    assert flagged["grad_accum"] == configured["grad_accum"] == 2
    assert flagged["bytes"] == configured["bytes"]
    assert cli(*args, "--grad-accum", "0").exit_code == 2
