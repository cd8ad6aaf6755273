"""``--fit``: device sizes and names, the reserve, and the largest batch / sequence length that fits."""

from __future__ import annotations

import pytest

from dtypecheck.errors import UsageError
from dtypecheck.memory.devices import DEVICES, parse_fit, parse_reserve, parse_size
from dtypecheck.memory.fit import largest_fitting
from tests.memory._fixtures import write_decoder_config

GIB = 2**30


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80GiB", 80 * 2**30), ("24GB", 24 * 10**9), ("1.5TiB", 3 * 2**39), ("4096", 4096), ("512 mib", 512 * 2**20)],
)
def test_sizes(text, expected):
    assert parse_size(text, "fit") == expected


def test_reserve_by_hand():
    assert parse_reserve("1GiB+5%", 80 * GIB) == GIB + 4 * GIB
    assert parse_reserve("10%", 40 * GIB) == 4 * GIB
    assert parse_reserve("0", 40 * GIB) == 0
    budget = parse_fit("a100-40gb", None)  # the default reserve: 1 GiB + 5%
    assert (budget.capacity_bytes, budget.reserve_bytes, budget.usable_bytes) == (40 * GIB, 3 * GIB, 37 * GIB)
    assert budget.accelerator
    assert not parse_fit("24GB", "0").accelerator
    with pytest.raises(UsageError):
        parse_reserve("5%%", GIB)
    with pytest.raises(UsageError):
        parse_reserve("120%", GIB)


def test_device_table_names_are_lowercase_and_sizes_plausible():
    assert {"h100-80gb", "a100-40gb", "a100-80gb", "l4", "rtx4090"} <= set(DEVICES)
    assert all(name == name.lower() and 8 * GIB <= size <= 256 * GIB for name, size in DEVICES.items())


def test_largest_fitting_linear_quadratic_and_edges():
    assert largest_fitting(lambda x: 1000 + 10 * x, 1_000_000) == (99_900, "linear")
    # 100 + x^2: the largest x with x^2 <= 9900 is 99.
    assert largest_fitting(lambda x: 100 + x * x, 10_000) == (99, "quadratic")
    assert largest_fitting(lambda x: 5000 + x, 100) == (0, "direct")
    assert largest_fitting(lambda x: 50, 100) == (None, "constant")
    # A step at x = 40 that the first three points cannot see: found by bisection.
    assert largest_fitting(lambda x: 10 * x + (10_000 if x >= 40 else 0), 1000) == (39, "bisection")


def test_fit_inference_by_hand(cli, wide):
    # Inference of Linear(256, 256) in float32: 262,144 B of weights, then per row of the batch 1 KiB in and 1 KiB
    # out alive at once. In 1 MiB: 262,144 + 2,048 b <= 1,048,576, so b <= 384.
    doc = cli("estimate-memory", wide, "-d", "fp32", "--fit", "1MiB", "--reserve", "0", "-f", "json").json()
    inference, training = doc["estimates"]
    assert inference["bytes"]["total"] == 262_144 + 2_048 * 4
    assert inference["fit"] == {
        "device": "1MiB",
        "capacity_bytes": 2**20,
        "reserve_bytes": 0,
        "usable_bytes": 2**20,
        "fits": True,
        "max_batch_size": 384,
        "max_seq_len": None,
        "search": "linear",
        "max_batch_size_bound": None,
        "max_seq_len_bound": None,
    }
    # Training needs 1,572,868 B before any batch (weights, gradients, AdamW states and step, the transient).
    assert training["fit"]["fits"] is False
    assert training["fit"]["max_batch_size"] == 0
    # With 4 MiB: 1,572,868 + 2,048 b + 4 (the loss) <= 4,194,304 -> b <= 1279.
    # The loss is the sum of the output, which keeps nothing for backward (the default, MSE, would keep more).
    args = ("-d", "fp32", "-m", "training", "--loss", "sum", "--fit", "4MiB", "--reserve", "0", "-f", "json")
    doc = cli("estimate-memory", wide, *args)
    assert doc.json()["estimates"][0]["fit"]["max_batch_size"] == 1279


def test_fit_of_a_config_brackets_the_limits(cli, tmp_path):
    config = write_decoder_config(tmp_path)
    base = ("estimate-memory", str(config), "-d", "bf16", "-f", "json", "--fit", "64MiB", "--reserve", "1MiB+5%")
    # A wall-clock bound well above the search's ~10 s CPU: a loaded shared machine runs it several times slower.
    doc = cli(*base, "--seq-len", "64", "--fit-timeout", "900").json()
    usable = 64 * 2**20 - (2**20 + int(64 * 2**20 * 0.05))
    for row in doc["estimates"]:
        fit = row["fit"]
        assert fit["usable_bytes"] == usable
        batch, seq = fit["max_batch_size"], fit["max_seq_len"]
        assert batch > 1
        assert seq > 64
        mode = ("-m", row["mode"])

        def total(*shape: str, mode=mode) -> int:
            return int(cli(*base[:4], *mode, "-f", "json", *shape).json()["estimates"][0]["bytes"]["total"])

        # Re-estimated independently at the limit and one past it.
        assert total("--seq-len", "64", "--batch-size", str(batch)) <= usable
        assert total("--seq-len", "64", "--batch-size", str(batch + 1)) > usable
        # An inference pass of a decoder generating seq tokens holds their KV cache too.
        kv = (lambda s: ("--context", str(s))) if row["mode"] == "inference" else (lambda s: ())
        assert total("--seq-len", str(seq), *kv(seq)) <= usable
        assert total("--seq-len", str(seq + 1), *kv(seq + 1)) > usable


def test_fit_table_and_named_gpu_uses_foreach(cli, wide):
    result = cli("estimate-memory", wide, "-d", "fp32", "--fit", "l4")
    assert result.exit_code == 0, result.stderr
    assert "fit l4: 24.00 GiB - reserve 2.20 GiB = 21.80 GiB usable" in result.stdout
    assert "max batch" in result.stdout
    doc = cli("estimate-memory", wide, "-d", "fp32", "-m", "training", "--fit", "l4", "-f", "json").json()
    assert doc["estimates"][0]["optimizer_impl"] == "foreach"  # a named GPU runs on CUDA: torch's foreach default


def test_fit_of_a_checkpoint_says_only_whether_it_fits(cli, tmp_path):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(1024, 1024)}, str(path))
    base = ("estimate-memory", str(path), "-d", "fp32", "-m", "inference", "--fit", "8MiB", "-f", "json")
    tight = cli(*base, "--reserve", "5MiB").json()["estimates"][0]["fit"]
    assert (tight["usable_bytes"], tight["fits"], tight["max_batch_size"]) == (3 * 2**20, False, None)
    roomy = cli(*base, "--reserve", "1MiB").json()["estimates"][0]["fit"]
    assert (roomy["usable_bytes"], roomy["fits"], roomy["search"]) == (7 * 2**20, True, "direct")


def test_fit_reserve_and_loss_from_the_project_config(cli, wide, tmp_path):
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.dtypecheck.estimate-memory]\nfit = "1MiB"\nreserve = "0"\nloss = "mse"\n')
    doc = cli("estimate-memory", wide, "-d", "fp32", "--config", str(config), "-f", "json").json()
    assert doc["model"]["loss"] == "mse"
    assert doc["estimates"][0]["fit"]["max_batch_size"] == 384  # as test_fit_inference_by_hand
    config.write_text('[tool.dtypecheck.estimate-memory]\nloss = "hinge"\n')
    result = cli("estimate-memory", wide, "--config", str(config))
    assert result.exit_code == 2
    assert "loss" in result.stderr


def _limited_config(tmp_path, positions: int):
    import json

    from tests.memory._fixtures import DECODER

    folder = tmp_path / "limited"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**DECODER, "max_position_embeddings": positions}), "utf-8")
    return str(folder)


def test_max_seq_len_stops_at_the_models_own_limit_and_names_it(cli, tmp_path):
    config = _limited_config(tmp_path, 1024)
    doc = cli("estimate-memory", config, "-d", "bf16", "--seq-len", "64", "--fit", "80GiB", "-f", "json").json()
    for row in doc["estimates"]:
        assert (row["fit"]["max_seq_len"], row["fit"]["max_seq_len_bound"]) == (1024, "max_position_embeddings")
    table = cli("estimate-memory", config, "-d", "bf16", "--seq-len", "64", "--fit", "80GiB").stdout
    assert "1,024 (limit)" in table
    assert "max seq (limit): the model's own max_position_embeddings" in table


def test_default_sequence_respects_the_limit_and_a_longer_one_is_refused(cli, tmp_path):
    config = _limited_config(tmp_path, 256)
    doc = cli("estimate-memory", config, "-d", "bf16", "-f", "json").json()
    assert doc["estimates"][0]["seq_len"] == 256
    assert "default sequence length 512 capped at the model's max_position_embeddings (256)" in doc["model"]["notes"]
    refused = cli("estimate-memory", config, "--seq-len", "300")
    assert refused.exit_code == 2
    assert refused.stderr == "error: --seq-len 300 is beyond this model's max_position_embeddings (256)\n"


def test_a_search_cap_is_marked_as_a_lower_bound(cli, wide):
    # Linear(256, 256) inference: 2 KiB per row, so 2**24 rows (32 GiB) still fit in 80 GiB: the search stops there.
    doc = cli("estimate-memory", wide, "-d", "fp32", "-m", "inference", "--fit", "80GiB", "-f", "json").json()
    fit = doc["estimates"][0]["fit"]
    assert (fit["max_batch_size"], fit["max_batch_size_bound"]) == (2**24, "search-limit")
    table = cli("estimate-memory", wide, "-d", "fp32", "-m", "inference", "--fit", "80GiB").stdout
    assert ">= 16,777,216" in table


FIXED = """
import torch
from torch import nn


class PerRow(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_buffer("row_bias", torch.zeros(4, 16))  # one bias per row of a batch of 4

    def forward(self, x):
        return self.proj(x) + self.row_bias


def fixed():
    return PerRow(), torch.randn(4, 16)
"""


def test_a_fixed_batch_model_degrades_to_its_batch_with_a_note(cli, tmp_path):
    path = tmp_path / "fixed.py"
    path.write_text(FIXED, encoding="utf-8")
    result = cli("estimate-memory", f"{path}:fixed", "-d", "fp32", "--fit", "2GiB", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    for row in doc["estimates"]:
        fit = row["fit"]
        assert (fit["max_batch_size"], fit["max_batch_size_bound"], fit["search"]) == (4, "fixed-batch", "fixed")
    assert any(note.startswith("the model does not run at other batch sizes than 4") for note in doc["model"]["notes"])


def test_fit_timeout_reports_the_bounds_found_so_far(cli, tmp_path):
    config = write_decoder_config(tmp_path)
    args = ("estimate-memory", str(config), "-d", "bf16", "-m", "training", "--fit", "80GiB", "-f", "json")
    doc = cli(*args, "--fit-timeout", "0.000001").json()
    fit = doc["estimates"][0]["fit"]
    assert fit["max_batch_size_bound"] == "timeout"
    assert fit["search"].startswith("timeout")
    assert any("the fit search stopped after 1e-06 s" in note for note in doc["model"]["notes"])
    assert cli(*args, "--fit-timeout", "0").exit_code == 2


def test_a_timed_out_sequence_search_keeps_the_rows_own_sequence(cli, tmp_path):
    # Inference at batch 1 x 256 tokens fits 80 GiB (with the KV cache of 256 tokens), so a search stopped before it
    # got anywhere still knows 256 fits: not ">= 1" (nor 0).
    config = write_decoder_config(tmp_path)
    args = ("estimate-memory", str(config), "-d", "bf16", "--seq-len", "256", "--fit", "80GiB", "-f", "json")
    doc = cli(*args, "--fit-timeout", "0.000001").json()
    for row in doc["estimates"]:
        fit = row["fit"]
        assert fit["max_seq_len_bound"] == "timeout", row["mode"]
        assert fit["max_seq_len"] == 256, row["mode"]
        assert fit["max_batch_size"] == 1, row["mode"]


HUGE_BATCH = """
import torch
from torch import nn


def huge():
    # 2**26 rows on the meta device: nothing is allocated, the estimate only needs the shapes.
    return nn.Linear(4, 4, bias=False), torch.empty(2**26, 4, device="meta")
"""


def test_the_batch_cap_is_above_the_batch_given_and_the_answer_exact(cli, tmp_path):
    path = tmp_path / "huge.py"
    path.write_text(HUGE_BATCH, encoding="utf-8")
    args = ("estimate-memory", f"{path}:huge", "-d", "fp32", "-m", "inference", "--reserve", "0", "-f", "json")
    doc = cli(*args, "--fit", "16GiB").json()
    fit = doc["estimates"][0]["fit"]
    # 64 B of weights, then 16 B in and 16 B out per row: 64 + 32 b <= 2**34 -> b <= 2**29 - 2, far above 2**24.
    assert doc["estimates"][0]["bytes"]["total"] == 64 + 32 * 2**26
    assert (fit["max_batch_size"], fit["max_batch_size_bound"], fit["search"]) == (2**29 - 2, None, "linear")


STEPPED = """
import torch
from torch import nn


class Stepped(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64, bias=False)

    def forward(self, x):
        y = self.proj(x)
        if x.shape[0] > 40:  # the graph changes with the batch: one more temporary of the output's size
            y = y * 2
        return y


def stepped():
    return Stepped(), torch.randn(4, 64)
"""


def test_a_graph_that_changes_with_the_batch_is_refitted_near_the_answer(cli, tmp_path):
    path = tmp_path / "stepped.py"
    path.write_text(STEPPED, encoding="utf-8")
    args = ("estimate-memory", f"{path}:stepped", "-d", "fp32", "-m", "inference", "--reserve", "0", "-f", "json")
    # 16,384 B of weights; up to 40 rows the input and the output (256 B each per row) are alive at once, from 41
    # on also the product: 16,384 + 512 b, then 16,384 + 768 b. In 67,584 B the first piece would allow 100 rows,
    # the second allows 66 (67,072 B; 67 rows need 67,840 B).
    doc = cli(*args, "--fit", "67584").json()
    assert doc["estimates"][0]["bytes"]["total"] == 16_384 + 512 * 4
    fit = doc["estimates"][0]["fit"]
    assert (fit["max_batch_size"], fit["max_batch_size_bound"], fit["search"]) == (66, None, "linear")
    # 36,864 B: exactly 40 rows, on the first piece.
    assert cli(*args, "--fit", "36864").json()["estimates"][0]["fit"]["max_batch_size"] == 40


# --- the referee: each --fit answer equals an independent bisection by plain estimates -----------------------

REFEREED = """
import torch
from torch import nn


class BatchAttention(nn.Module):
    # Every row attends to every row: a batch x batch score matrix, so the bytes grow with the square of the batch.
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32, bias=False)

    def forward(self, x):
        h = self.proj(x)
        return torch.softmax(h @ h.T, dim=-1) @ h


class Padded(nn.Module):
    # The batch is padded to a multiple of 8 rows before the projection: the bytes are a staircase in the batch.
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64, bias=False)

    def forward(self, x):
        pad = -x.shape[0] % 8
        return self.proj(torch.cat([x, x.new_zeros(pad, x.shape[1])]))


class Stepped(nn.Module):
    # The graph changes with the batch: one more temporary of the output's size from 41 rows on.
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64, bias=False)

    def forward(self, x):
        y = self.proj(x)
        return y * 2 if x.shape[0] > 40 else y


def batch_attention():
    return BatchAttention(), torch.randn(2, 32)


def padded():
    return Padded(), torch.randn(3, 64)


def stepped():
    return Stepped(), torch.randn(4, 64)
"""


def _referee(total, usable: int, low: int) -> int:
    """The largest x with ``total(x) <= usable``, by doubling from ``low`` (which fits) and then bisecting: plain
    estimates only, no model."""
    assert total(low) <= usable
    high = 2 * low
    while total(high) <= usable:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if total(middle) <= usable else (low, middle)
    return low


def _options(mode: str):
    from dtypecheck.dtypes import lookup
    from dtypecheck.memory import EstimateOptions
    from dtypecheck.memory_words import Mode

    return EstimateOptions(dtypes=(lookup("fp32"),), modes=(Mode(mode),))


@pytest.mark.parametrize(
    ("factory", "mode", "budget"),
    [
        ("batch_attention", "inference", 2**20),  # quadratic in the batch: no straight line through two traces holds
        ("padded", "training", 300_000),  # a staircase: the bytes grow 8 rows at a time
        ("stepped", "inference", 100_000),  # the graph changes past the batch the first traces saw
    ],
)
def test_the_batch_answer_equals_a_bisection_by_plain_estimates(tmp_path, factory, mode, budget):
    from dtypecheck.memory import estimate_memory

    path = tmp_path / "refereed.py"
    path.write_text(REFEREED, encoding="utf-8")
    target = f"{path}:{factory}"
    options = _options(mode)
    fit = estimate_memory(target, options, fit=str(budget), reserve="0", fit_timeout=None).estimates[0].fit
    assert fit is not None
    assert fit.max_batch_size_bound is None

    def total(batch: int) -> int:
        return estimate_memory(target, options, batch_size=batch).estimates[0].bytes.total

    assert fit.max_batch_size == _referee(total, budget, 1)
    assert fit.max_batch_size > 8  # far enough from the traced batch for a model to have been needed


def test_the_sequence_answer_equals_a_bisection_by_plain_estimates(tmp_path):
    import dataclasses

    from dtypecheck.memory import estimate_memory

    # The decoder's attention makes a sequence x sequence score matrix per head: quadratic in the sequence. Its
    # inference at a sequence holds the KV cache of that many tokens, as the plain estimate with --context counts it.
    config = str(write_decoder_config(tmp_path))
    options = _options("inference")
    budget = 2**20
    report = estimate_memory(config, options, seq_len=32, fit=str(budget), reserve="0", fit_timeout=None)
    fit = report.estimates[0].fit
    assert fit is not None
    assert (fit.max_seq_len_bound, fit.search.split("/")[1]) == (None, "quadratic")

    def total(seq: int) -> int:
        held = dataclasses.replace(options, context=seq)
        return estimate_memory(config, held, seq_len=seq).estimates[0].bytes.total

    assert fit.max_seq_len == _referee(total, budget, 32)


def test_the_search_traces_each_block_count_at_each_shape_once(tmp_path, monkeypatch):
    import json

    from dtypecheck.memory import estimate_memory
    from dtypecheck.memory.estimate import TraceCache
    from tests.memory._fixtures import DECODER

    # Six blocks: extrapolated from shallow copies (1, 2 and the check at 3 blocks). The search models the batch
    # from the row's own shape and a probe at batch 2 (1 and 2 blocks), the sequence from probes at 33 and 34
    # tokens, and checks each answer with plain estimates at N and N + 1 (3 block counts each): nothing more, and
    # nothing twice.
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**DECODER, "num_hidden_layers": 6}), "utf-8")
    traced: list[tuple[object, ...]] = []
    trace_once = TraceCache._trace_once

    def counted(self, traceable, row, compute, amp):
        traced.append((id(traceable.module), traceable.batch_size, traceable.seq_len, row.mode))
        return trace_once(self, traceable, row, compute, amp)

    monkeypatch.setattr(TraceCache, "_trace_once", counted)
    # One process: the protocol itself, without the speculative check at N + 1 that workers take side by side.
    report = estimate_memory(
        str(folder), _options("training"), seq_len=32, fit="16MiB", reserve="0", fit_timeout=None, fit_workers=1
    )
    fit = report.estimates[0].fit
    assert fit is not None
    assert fit.max_batch_size_bound is None
    assert fit.max_seq_len_bound is None
    assert len(traced) == len(set(traced))
    assert len(traced) == 3 + (2 + 3 + 3) + (2 + 2 + 3 + 3)


def test_traces_shared_among_forked_workers_give_the_same_report_as_one_process(tmp_path):
    import json

    from dtypecheck.dtypes import lookup
    from dtypecheck.memory import EstimateOptions, MemoryReport, estimate_memory
    from tests.memory._fixtures import DECODER

    # Six blocks, both modes: every kind of check (probes, plain estimates at N and N + 1, a fourth block count)
    # is taken side by side with two workers; the answers and every byte must be the one process's.
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**DECODER, "num_hidden_layers": 6}), "utf-8")
    options = EstimateOptions(dtypes=(lookup("fp32"),))

    def report(workers: int) -> MemoryReport:
        return estimate_memory(
            str(folder), options, seq_len=32, fit="16MiB", reserve="0", fit_timeout=None, fit_workers=workers
        )

    alone, shared = report(1), report(2)
    assert [e.fit.max_batch_size for e in alone.estimates if e.fit] == [
        e.fit.max_batch_size for e in shared.estimates if e.fit
    ]
    assert shared == alone
