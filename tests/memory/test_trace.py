"""Activation tracing on fake tensors against PyTorch's MemTracker on real CPU steps of small models.

Both count live tensor storages (MemTracker through weak references to real storages, the tracer to fake ones),
so on the CPU they agree to the byte; the tolerances below only allow for ops whose CPU kernels choose their
layout from the data, which a fake tensor cannot see.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from dtypecheck.dtypes import lookup
from dtypecheck.memory import EstimateOptions, estimate_memory, open_subject
from dtypecheck.memory.fakes import fake_inputs, fakify_module, new_fake_mode
from dtypecheck.memory.measure import measure_row
from dtypecheck.memory.tracing import Traceable, checkpointed, linear_profiles, trace_pass
from dtypecheck.memory_words import Mode, Strategy
from dtypecheck.training_step import model_loss

# Only ops whose CPU kernels pick a layout from the data could make the fake count differ (none of these
# models has one); 1% keeps the test about the method, not about one kernel's internal choice.
TRACE_TOLERANCE = 0.01
# A full step adds the optimizer's transient, which is a formula rather than a trace (exact for foreach AdamW on
# these models); 1% leaves room for the few scalar tensors torch's optimizers create for bias corrections.
STEP_TOLERANCE = 0.01


def mlp() -> tuple[nn.Module, torch.Tensor]:
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8)), torch.randn(
        32, 64
    )


def cnn() -> tuple[nn.Module, torch.Tensor]:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    return model, torch.randn(8, 3, 16, 16)


def transformer() -> tuple[nn.Module, torch.Tensor]:
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(4, 24, 64)


MODELS = {"mlp": mlp, "cnn": cnn, "transformer": transformer}


def _real_peak(model: nn.Module, x: torch.Tensor, *, train: bool, checkpointing: bool = False) -> int:
    """MemTracker's peak of one forward (+ backward), minus the parameters and buffers it also counts."""
    model.train(train)
    tracker = MemTracker()
    tracker.track_external(model)
    blocks = Traceable(None, model, lambda b, s: None, None).blocks() if checkpointing else []  # type: ignore[arg-type]
    with tracker, checkpointed(blocks):
        batch = x.clone()
        if train:
            output = model(batch)
            loss = model_loss(output)
            loss.backward()
            del loss, output
        else:
            with torch.no_grad():
                model(batch)
        del batch
    states = sum(t.nbytes for t in (*model.parameters(), *model.buffers()))
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]) - states


def _traced_peak(model: nn.Module, x: torch.Tensor, *, train: bool, checkpointing: bool = False) -> int:
    mode = new_fake_mode()
    fake_model = fakify_module(copy.deepcopy(model), mode)
    fake_x = fake_inputs(mode, x)
    traceable = Traceable(mode, fake_model, lambda b, s: fake_x.clone(), int(x.shape[0]))
    return trace_pass(traceable, train=train, autocast_dtype=None, checkpointing=checkpointing).peak()


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("train", [True, False], ids=["training", "inference"])
def test_traced_pass_matches_memtracker(name, train):
    torch.manual_seed(0)
    model, x = MODELS[name]()
    real = _real_peak(copy.deepcopy(model), x, train=train)
    traced = _traced_peak(model, x, train=train)
    assert traced == pytest.approx(real, rel=TRACE_TOLERANCE)


def test_checkpointing_matches_memtracker_and_saves_memory():
    torch.manual_seed(0)
    model, x = transformer()
    real = _real_peak(copy.deepcopy(model), x, train=True, checkpointing=True)
    traced = _traced_peak(model, x, train=True, checkpointing=True)
    assert traced == pytest.approx(real, rel=TRACE_TOLERANCE)
    assert traced < _traced_peak(model, x, train=True)


def _factory_file(tmp_path, body: str) -> str:
    path = tmp_path / "models.py"
    path.write_text("import torch\nfrom torch import nn\n" + body, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(("dtype", "precision"), [("float32", "pure"), ("bfloat16", "amp"), ("bfloat16", "pure")])
def test_full_step_estimate_matches_a_measured_cpu_step(tmp_path, dtype, precision):
    path = _factory_file(
        tmp_path,
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    model = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.LayerNorm(512), nn.Linear(512, 64))\n"
        "    return model, torch.randn(64, 128)\n",
    )
    subject = open_subject(f"{path}:make")
    options = EstimateOptions(dtypes=(lookup(dtype),), modes=(Mode.training,), precisions=(precision,))
    report = estimate_memory(subject, options)
    row = report.estimates[0]
    measured = measure_row(subject, row)
    assert measured.device == "cpu"
    assert row.bytes.total == pytest.approx(measured.peak_bytes, rel=STEP_TOLERANCE)


def test_deep_config_is_extrapolated_exactly(tmp_path):
    config = {
        "model_type": "dtypecheck-decoder",
        "vocab_size": 300,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 7,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    for options in (
        EstimateOptions(dtypes=(lookup("float32"),), modes=(Mode.training,), strategy=Strategy.zero2, world_size=4),
        EstimateOptions(context=32),  # the default grid: inference and training passes, four kinds of trace
    ):
        subject = open_subject(str(path), seq_len=16, batch_size=2)
        report = estimate_memory(subject, options)
        assert any("extrapolated" in note for note in report.model.notes)
        # The same model traced in full, all 7 blocks.
        assert subject.traceable is not None
        subject.traceable.with_layers = None
        full = estimate_memory(subject, options)
        assert not any("extrapolated" in note for note in full.model.notes)
        assert report.estimates == full.estimates


def test_a_config_whose_first_block_differs_is_extrapolated_from_the_second_exactly(tmp_path):
    # A Llama whose first block peaks lower than the others (as a 70B Llama's inference pass does): the bytes
    # grow from 1 to 2 blocks and not from 2 to 3, so 1 and 2 blocks cannot be extrapolated from; 2 and 3 can,
    # checked at 4. The estimates must equal those of the model traced in full, all 6 blocks.
    config = {
        "model_type": "llama",
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 224,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    options = EstimateOptions(dtypes=(lookup("float32"), lookup("bfloat16")))
    subject = open_subject(str(path), seq_len=16, batch_size=1)
    report = estimate_memory(subject, options)
    (note,) = [note for note in report.model.notes if "extrapolated" in note]
    assert "from traces with 2 and 3 blocks (their growth per block checked equal at 4, the first block" in note
    assert subject.traceable is not None
    subject.traceable.with_layers = None
    full = estimate_memory(subject, options)
    assert not any("extrapolated" in note for note in full.model.notes)
    assert report.estimates == full.estimates


def test_linear_profiles_rejects_uneven_growth():
    from dtypecheck.memory.tracing import ActivationProfile

    even = [ActivationProfile(10 * k, ((10 * k, k),), 1) for k in (2, 3, 4)]
    uneven = [ActivationProfile(v, ((v, 0),), 1) for v in (20, 30, 45)]
    assert linear_profiles(even)
    assert not linear_profiles(uneven)


def test_an_ops_tensor_arguments_are_found_in_pytree_order():
    from torch.utils._pytree import tree_flatten

    from dtypecheck.memory.routing import tensors_in

    a, b, c, d, e = (torch.full((1,), float(i)) for i in range(5))
    args = (a, [b, (c, 2), None], 1.5, (), [[d]])
    kwargs = {"out": e, "dim": 0}
    found = tensors_in(args, kwargs, torch.Tensor)
    assert [float(t) for t in found] == [0.0, 1.0, 2.0, 3.0, 4.0]  # a, b, c, d, e: depth first, kwargs last
    expected = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    assert all(x is y for x, y in zip(found, expected, strict=True))
