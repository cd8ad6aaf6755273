"""``dtypecheck estimate-memory`` through the real CLI boundary: every input kind and option."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from tests.memory._fixtures import DECODER, write_decoder_config, write_factories


@pytest.fixture
def factories(tmp_path):
    return write_factories(tmp_path)


@pytest.fixture
def decoder_config(tmp_path):
    return write_decoder_config(tmp_path)


def _decoder_parameters(c: dict[str, Any]) -> int:
    """Hand count: tied embedding, per block two RMSNorms, q/k/v/o without biases and a SwiGLU MLP, final norm."""
    h, i = int(c["hidden_size"]), int(c["intermediate_size"])
    kv = int(c["num_key_value_heads"]) * (h // int(c["num_attention_heads"]))
    block = 2 * h + h * h + 2 * h * kv + h * h + 3 * h * i
    return int(c["vocab_size"]) * h + int(c["num_hidden_layers"]) * block + h


def _row(doc, dtype, mode, precision=None):
    for row in doc["estimates"]:
        if row["dtype"] == dtype and row["mode"] == mode and (precision is None or row["precision"] == precision):
            return row
    raise AssertionError(f"no row {dtype} {mode} {precision}")


def test_factory_default_grid_json(cli, factories):
    result = cli("estimate-memory", f"{factories}:with_inputs", "-f", "json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""  # no progress bar on a non-terminal stderr
    doc = result.json()
    assert doc["schema"] == "dtypecheck.memory/1"
    assert set(doc) >= {"schema", "dtypecheck_version", "model", "estimates", "measured"}
    assert doc["measured"] is None
    params = 100 * 32 + 2 * 32 + 32 * 64 + 64 + 64 * 100 + 100
    model = doc["model"]
    assert model["parameters"] == params
    assert model["trainable_parameters"] == params
    assert (model["buffers"], model["buffer_bytes"]) == (0, 0)
    pairs = [(r["dtype"], r["mode"]) for r in doc["estimates"]]
    assert pairs == [
        ("float32", "inference"),
        ("float32", "training"),
        ("bfloat16", "inference"),
        ("bfloat16", "training"),
        ("float16", "inference"),
        ("float16", "training"),
        ("float8_e4m3fn", "inference"),
        ("int8", "inference"),
        ("int4", "inference"),
    ]
    assert len(doc["skipped"]) == 3
    train = _row(doc, "float32", "training")
    assert train["optimizer"] == "adamw"
    assert train["precision"] == "pure"
    assert train["batch_size"] == 4
    assert train["sharding"] == {"strategy": "none", "world_size": 1}
    b = train["bytes"]
    assert set(b) >= {"parameters", "gradients", "optimizer_states", "master_weights", "activations", "total"}
    assert b["parameters"] == 4 * params
    assert b["gradients"] == 4 * params
    assert b["optimizer_states"] == 8 * params + 4 * 7  # exp_avg, exp_avg_sq, and a float32 step per tensor
    assert b["activations"] > 0
    # The peak of the step, never more than everything at once.
    assert max(b["parameters"] + b["optimizer_states"], b["activations"]) < b["total"]
    assert (
        b["total"]
        <= sum(b[k] for k in ("parameters", "gradients", "optimizer_states", "activations"))
        + b["optimizer_step_transient"]
    )
    assert train["peak_phase"] in ("forward-backward", "optimizer-step")
    assert _row(doc, "float32", "inference")["peak_phase"] == "forward"
    assert _row(doc, "bfloat16", "training")["precision"] == "amp"
    assert _row(doc, "bfloat16", "inference")["optimizer"] is None


def test_factory_table(cli, factories):
    result = cli("estimate-memory", f"{factories}:mlp", "-d", "fp32,bf16")
    assert result.exit_code == 0, result.stderr
    assert "float32" in result.stdout
    assert "train" in result.stdout
    assert "total is the peak of the step" in result.stdout
    assert "error" not in result.stderr


def test_table_golden(cli, golden, decoder_config, monkeypatch):
    # a relative path, so that the header's length does not depend on where pytest puts tmp_path (xdist workers
    # put it deeper) and the line never wraps differently
    monkeypatch.chdir(decoder_config.parent)
    result = cli("estimate-memory", decoder_config.name, "--seq-len", "8", "--context", "32", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    golden("memory_decoder.txt", result.stdout.replace(f"{decoder_config.name}/config.json", "<config>/config.json", 1))


@pytest.mark.parametrize("width", [60, 80, 100, 200])
def test_the_table_is_never_cut_short(cli, factories, monkeypatch, width):
    """At 80 columns every cell was cut with an ellipsis (``32.02 …``, ``tra…``, ``precisi…``): the bar gives way
    first, then the table becomes one block per row."""
    monkeypatch.setenv("COLUMNS", str(width))
    result = cli("estimate-memory", f"{factories}:mlp", "-d", "fp32,bf16,fp16,e4m3,int8,int4")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line for line in lines if "…" in line] == []
    assert max(len(line) for line in lines) <= width
    wide = cli("estimate-memory", f"{factories}:mlp", "-d", "fp32,bf16,fp16,e4m3,int8,int4", "-f", "json").json()
    text = " ".join(result.stdout.split())
    for row in wide["estimates"]:  # each row's dtype and total, whole
        assert row["dtype"] in text
        total = row["bytes"]["total"]
        assert (f"{total / 2**20:.2f} MiB" if total >= 2**20 else f"{total / 2**10:.2f} KiB") in text


def test_factory_without_inputs(cli, factories):
    doc = cli("estimate-memory", f"{factories}:no_inputs", "-f", "json", "-d", "fp32").json()
    assert doc["model"]["parameters"] == 16 * 16 + 16
    assert all(r["bytes"]["activations"] is None for r in doc["estimates"])
    assert any("no example inputs" in n for n in doc["model"]["notes"])


def test_batch_size_rescales_factory_inputs(cli, factories):
    small = cli("estimate-memory", f"{factories}:mlp", "-f", "json", "-d", "fp32", "-m", "inference").json()
    large = cli(
        "estimate-memory", f"{factories}:mlp", "-f", "json", "-d", "fp32", "-m", "inference", "--batch-size", "64"
    ).json()
    assert small["estimates"][0]["batch_size"] == 16
    assert large["estimates"][0]["batch_size"] == 64
    assert large["estimates"][0]["bytes"]["activations"] > 3 * small["estimates"][0]["bytes"]["activations"]


def test_config_with_context_and_kv_cache(cli, decoder_config):
    args = ("estimate-memory", str(decoder_config), "-f", "json", "--seq-len", "16", "--batch-size", "2")
    doc = cli(*args, "--context", "100", "-d", "bf16,fp32").json()
    assert doc["model"]["kind"] == "config"
    assert doc["model"]["parameters"] == _decoder_parameters(DECODER)
    row = _row(doc, "bfloat16", "inference")
    # keys and values, 2 layers, 2 KV heads of 32/4 = 8 dims, 100 tokens, 2 sequences, 2 bytes
    assert row["bytes"]["kv_cache"] == 2 * 2 * 2 * 8 * 100 * 2 * 2
    assert _row(doc, "float32", "inference")["bytes"]["kv_cache"] == 2 * row["bytes"]["kv_cache"]
    assert row["context"] == 100
    assert row["seq_len"] == 16
    assert row["batch_size"] == 2
    assert _row(doc, "bfloat16", "training")["bytes"]["kv_cache"] == 0


def test_config_json_file_directly(cli, decoder_config):
    doc = cli("estimate-memory", str(decoder_config / "config.json"), "-f", "json", "-d", "fp32").json()
    assert doc["model"]["architecture"] == "dtypecheck-decoder"


def test_llama_config_without_transformers_uses_the_builtin_decoder(cli, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    config = dict(DECODER, model_type="llama")
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    doc = cli("estimate-memory", str(tmp_path), "-f", "json", "-d", "fp32", "--seq-len", "8").json()
    assert doc["model"]["parameters"] == _decoder_parameters(DECODER)
    assert any("transformers is not installed" in n for n in doc["model"]["notes"])


def test_huge_config_counts_parameters_exactly_without_allocating(cli, tmp_path):
    """A Llama-2-70B-shaped config on the meta device: the count is Llama's, by hand."""
    config = dict(
        DECODER,
        vocab_size=32000,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    )
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    doc = cli("estimate-memory", str(tmp_path), "-f", "json", "-d", "bf16", "-m", "inference", "--seq-len", "8").json()
    h, i, kv = 8192, 28672, 8 * 128
    block = 2 * h + 2 * h * h + 2 * h * kv + 3 * h * i
    assert doc["model"]["parameters"] == 2 * 32000 * h + 80 * block + h == 68_976_648_192
    assert doc["estimates"][0]["bytes"]["parameters"] == 2 * 68_976_648_192


def test_hf_config_with_transformers(cli, tmp_path):
    pytest.importorskip("transformers")
    config = {
        "model_type": "llama",
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    doc = cli("estimate-memory", str(tmp_path), "-f", "json", "-d", "fp32", "--seq-len", "8").json()
    h = 32
    block = 2 * h + 2 * h * h + 2 * h * 16 + 3 * h * 64
    assert doc["model"]["parameters"] == 2 * 128 * h + 2 * block + h
    assert _row(doc, "float32", "training")["bytes"]["activations"] > 0
    # An encoder is built with its masked-LM head and has no KV cache.
    bert = {"model_type": "bert", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps(bert | {"num_attention_heads": 2, "intermediate_size": 32}))
    doc = cli("estimate-memory", str(tmp_path), "-f", "json", "-d", "fp32", "--seq-len", "8").json()
    assert doc["model"]["architecture"] == "bert"
    assert _row(doc, "float32", "training")["bytes"]["activations"] > 0
    assert cli("estimate-memory", str(tmp_path), "--context", "8").exit_code == 2


def test_checkpoint_from_headers(cli, tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(
        {
            "embed.weight": torch.zeros(50, 8, dtype=torch.bfloat16),
            "fc.weight": torch.zeros(16, 8),
            "step": torch.zeros(1, dtype=torch.int64),
        },
        str(path),
    )
    doc = cli("estimate-memory", str(path), "-f", "json", "-d", "fp32,int8", "--keep-unquantized").json()
    model = doc["model"]
    assert model["kind"] == "checkpoint"
    assert model["parameters"] == 50 * 8 + 16 * 8
    assert model["parameter_bytes"] == 2 * 50 * 8 + 4 * 16 * 8
    assert (model["buffers"], model["buffer_bytes"]) == (1, 8)
    assert _row(doc, "float32", "training")["bytes"]["activations"] is None
    # int8 keeps the embedding at its own dtype (bfloat16): fc gets 1 byte per element and a scale per row.
    assert _row(doc, "int8", "inference")["bytes"]["parameters"] == 2 * 50 * 8 + 16 * 8 + 16 * 4
    without = cli("estimate-memory", str(path), "-f", "json", "-d", "int8", "-m", "inference").json()
    assert without["estimates"][0]["bytes"]["parameters"] == 50 * 8 + 50 * 4 + 16 * 8 + 16 * 4


def test_training_checkpoint_leaves_out_the_optimizer_state(cli, tmp_path):
    model = torch.nn.Linear(4, 8)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    path = tmp_path / "train.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    doc = cli("estimate-memory", str(path), "-f", "json", "-d", "fp32").json()
    assert doc["model"]["parameters"] == 4 * 8 + 8


@pytest.mark.parametrize(
    ("optimizer", "per_param"),
    [("adamw", 8), ("adam", 8), ("sgd", 4), ("lion", 4)],
)
def test_optimizer_option(cli, factories, optimizer, per_param):
    doc = cli(
        "estimate-memory", f"{factories}:mlp", "-f", "json", "-d", "fp32", "-m", "training", "--optimizer", optimizer
    ).json()
    n = 32 * 128 + 128 + 128 * 8 + 8
    steps = 4 * 4 if optimizer.startswith("adam") else 0
    assert doc["estimates"][0]["optimizer"] == optimizer
    assert doc["estimates"][0]["bytes"]["optimizer_states"] == per_param * n + steps


@pytest.mark.parametrize("optimizer", ["adafactor", "adam8bit"])
def test_factored_and_8bit_optimizers_use_less(cli, factories, optimizer):
    base = ("estimate-memory", f"{factories}:mlp", "-f", "json", "-d", "fp32", "-m", "training")
    adamw = cli(*base).json()["estimates"][0]["bytes"]["optimizer_states"]
    other = cli(*base, "--optimizer", optimizer).json()["estimates"][0]["bytes"]["optimizer_states"]
    assert 0 < other < adamw


def test_precision_master(cli, factories):
    doc = cli(
        "estimate-memory",
        f"{factories}:mlp",
        "-f",
        "json",
        "-d",
        "bf16",
        "-m",
        "training",
        "--precision",
        "master",
        "--precision",
        "pure",
    ).json()
    n = 32 * 128 + 128 + 128 * 8 + 8
    master = _row(doc, "bfloat16", "training", "master")["bytes"]
    pure = _row(doc, "bfloat16", "training", "pure")["bytes"]
    assert master["master_weights"] == 4 * n
    assert master["parameters"] == pure["parameters"] == 2 * n
    assert master["optimizer_states"] == 8 * n + 16
    assert pure["optimizer_states"] == 4 * n + 16
    assert pure["master_weights"] == 0


def test_checkpointing_option(cli, factories):
    base = ("estimate-memory", f"{factories}:with_inputs", "-f", "json", "-d", "fp32", "-m", "training")
    plain = cli(*base).json()["estimates"][0]
    checkpointed = cli(*base, "--checkpointing").json()["estimates"][0]
    assert checkpointed["checkpointing"] is True
    assert checkpointed["bytes"]["activations"] < plain["bytes"]["activations"]


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp"])
def test_strategy_option(cli, factories, strategy):
    base = ("estimate-memory", f"{factories}:mlp", "-f", "json", "-d", "fp32", "-m", "training")
    single = cli(*base).json()["estimates"][0]["bytes"]
    row = cli(*base, "--strategy", strategy, "--world-size", "4").json()["estimates"][0]
    assert row["sharding"] == {"strategy": strategy, "world_size": 4}
    expected_states = math.ceil(single["optimizer_states"] / 4) if strategy != "ddp" else single["optimizer_states"]
    assert row["bytes"]["optimizer_states"] == expected_states


def test_group_size_and_impl_options(cli, factories):
    base = ("estimate-memory", f"{factories}:mlp", "-f", "json")
    g128 = cli(*base, "-d", "int4", "-m", "inference").json()["estimates"][0]["bytes"]["quantization_overhead"]
    g16 = cli(*base, "-d", "int4", "-m", "inference", "--group-size", "16").json()["estimates"][0]["bytes"]
    # Linear(32->128): 128 rows x 1 group of 32 (or 2 of 16); Linear(128->8): 8 rows x 1 group (or 8 of 16).
    assert g128 == 4 * (128 * 1 + 8 * 1)
    assert g16["quantization_overhead"] == 4 * (128 * 2 + 8 * 8)
    fused = cli(*base, "-d", "fp32", "-m", "training", "--optimizer-impl", "fused").json()["estimates"][0]["bytes"]
    assert fused["optimizer_step_transient"] == 0
    loop = cli(*base, "-d", "fp32", "-m", "training", "--optimizer-impl", "for-loop").json()["estimates"][0]["bytes"]
    # The square root and quotient of the largest tensor (the first), while no earlier tensor's denom exists.
    assert loop["optimizer_step_transient"] == 2 * 4 * 32 * 128


def test_measure_on_cpu(cli, factories):
    doc = cli("estimate-memory", f"{factories}:mlp", "-f", "json", "-d", "fp32", "--measure").json()
    measured = doc["measured"]
    assert measured["device"] in ("cpu", "cuda:0")
    assert measured["mode"] == "training"
    assert measured["peak_bytes"] > 0
    assert abs(measured["error"]) < 0.02
    assert measured["estimate_bytes"] == _row(doc, "float32", "training")["bytes"]["total"]


@pytest.mark.parametrize("factory", ["on_meta_with_kwargs", "tuple_inputs"])
def test_meta_modules_keyword_and_tuple_inputs(cli, factories, factory):
    doc = cli("estimate-memory", f"{factories}:{factory}", "-f", "json", "-d", "fp32", "--measure").json()
    assert doc["model"]["parameters"] == 100 * 16 + 64 * 16 + 16 * 4 + 4
    assert doc["estimates"][0]["batch_size"] == 2
    assert abs(doc["measured"]["error"]) < 0.02


def test_output_file(cli, factories, tmp_path):
    out = tmp_path / "memory.json"
    result = cli("estimate-memory", f"{factories}:mlp", "-f", "json", "-d", "fp32", "-o", str(out), "-q")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert json.loads(out.read_text())["schema"] == "dtypecheck.memory/1"


FROZEN = """
import torch


def _model(trainable_last):
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    if trainable_last:
        model[2].weight.requires_grad_(True)
    return model, torch.randn(8, 16)


def frozen():
    return _model(False)


def last_weight_trains():
    return _model(True)
"""


def test_a_frozen_model_gets_its_inference_and_says_why_no_training(cli, tmp_path):
    """Every parameter with requires_grad=False: no backward can be traced. The default grid gives the inference
    rows and a skipped note; --mode training asked for is one error line, exit 3."""
    factory = tmp_path / "frozen.py"
    factory.write_text(FROZEN, encoding="utf-8")
    params = 16 * 16 + 16 + 16 * 4 + 4  # two Linear layers, by hand: 340
    result = cli("estimate-memory", f"{factory}:frozen", "-d", "fp32,bf16", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert (doc["model"]["parameters"], doc["model"]["trainable_parameters"]) == (params, 0)
    assert [(r["dtype"], r["mode"]) for r in doc["estimates"]] == [("float32", "inference"), ("bfloat16", "inference")]
    assert [r["bytes"]["parameters"] for r in doc["estimates"]] == [4 * params, 2 * params]
    assert doc["skipped"] == [
        f"training: the model has no trainable parameter (requires_grad is False on all {params}), "
        "so a training step has nothing to update"
    ]
    asked = cli("estimate-memory", f"{factory}:frozen", "-m", "training")
    assert asked.exit_code == 3
    assert asked.stdout == ""
    assert asked.stderr.splitlines() == [
        f"error: cannot estimate training: the model has no trainable parameter (requires_grad is False on all "
        f"{params}), so a training step has nothing to update; estimate its inference with --mode inference"
    ]
    # One trainable weight is enough for a training step: its rows are there, and nothing is skipped for it.
    partly = cli("estimate-memory", f"{factory}:last_weight_trains", "-d", "fp32", "-f", "json").json()
    assert [r["mode"] for r in partly["estimates"]] == ["inference", "training"]
    assert partly["model"]["trainable_parameters"] == 16 * 4
    assert partly["skipped"] == []
