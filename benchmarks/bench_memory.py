"""Accuracy and speed of ``dtypecheck estimate-memory`` (issues 5 and 12).

The user's step (issue 12): for each model of ``memory_models.py`` (GPT-2 LM with cross-entropy, the same with a
tied embedding, a BERT masked LM, a T5 encoder-decoder, a ViT, a CNN, an LSTM LM and a conv autoencoder on MSE),
the estimated peak of one training step with the factory's own ``loss_fn`` against the peak MemTracker measures on
the second iteration of a plain loop written below (``train_step``: output referenced through backward, torch's
default AdamW, which is the for-loop implementation on the CPU). Rows: float32 and bfloat16 autocast. Target:
|error| <= 5%.

Accuracy: for an MLP, a CNN and a transformer (dtypecheck's Llama-style decoder from a config), each at a small
batch (model states dominate) and a large one (activations dominate), the estimated peak of one AdamW training
step against the peak PyTorch's MemTracker measures on a real CPU step (after a warm-up step, so the optimizer
states exist). Rows: float32 and bfloat16 autocast (amp). Target: |error| <= 10%.

Speed: wall and CPU time of estimating a Llama-2-70B-shaped config (default grid, every row), median of --repeats
runs in fresh processes, once as dtypecheck's own decoder (``model_type: dtypecheck-decoder``, issue 23.4's <= 2 s)
and once as the Hub's ``llama`` config that transformers builds; ``--against`` times another checkout alternately
(before and after in one run); ``--full-trace`` also traces the deep model in full instead of extrapolating.

    .venv/bin/python benchmarks/bench_memory.py --repeats 3
    .venv/bin/python benchmarks/bench_memory.py --suite step          # issue 12's models only
    .venv/bin/python benchmarks/bench_memory.py --suite fit           # issue 22's --fit answers and wall times
    git worktree add /tmp/before b2825a2                               # issue 23.4: before and after, one run
    .venv/bin/python benchmarks/bench_memory.py --suite speed --repeats 7 --against /tmp/before
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve()


# --- factories (this file is also the factory file the estimate imports) ----------------------------------


def _mlp(batch: int) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(512, 1024), nn.GELU()]
    for _ in range(3):
        layers += [nn.Linear(1024, 1024), nn.GELU()]
    layers.append(nn.Linear(1024, 10))
    return nn.Sequential(*layers), torch.randn(batch, 512)


def _cnn(batch: int) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)

    def stage(c_in: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )

    model = nn.Sequential(
        stage(3, 64), stage(64, 128), stage(128, 256), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 100)
    )
    return model, torch.randn(batch, 3, 32, 32)


def mlp_small() -> tuple[nn.Module, torch.Tensor]:
    return _mlp(8)


def mlp_large() -> tuple[nn.Module, torch.Tensor]:
    return _mlp(4096)


def cnn_small() -> tuple[nn.Module, torch.Tensor]:
    return _cnn(2)


def cnn_large() -> tuple[nn.Module, torch.Tensor]:
    return _cnn(64)


DECODER = {
    "model_type": "dtypecheck-decoder",
    "vocab_size": 8000,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "tie_word_embeddings": True,
}
LLAMA_70B_HF = {
    # A Llama-2-70B config.json as the Hub has it (the fields the model reads): built as transformers'
    # LlamaForCausalLM, whose import alone takes ~2 s (it imports torch._dynamo itself).
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 32000,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu",
}
LLAMA_70B = {
    "model_type": "dtypecheck-decoder",
    "vocab_size": 32000,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}


def accuracy(folder: Path) -> list[tuple[str, str, int, int, float, str]]:
    from dtypecheck.dtypes import lookup
    from dtypecheck.memory import EstimateOptions, estimate_memory, open_subject
    from dtypecheck.memory.measure import measure_row
    from dtypecheck.memory_words import Mode, Precision

    config = folder / "decoder" / "config.json"
    config.parent.mkdir(exist_ok=True)
    config.write_text(json.dumps(DECODER), encoding="utf-8")
    cases: list[tuple[str, str, str, dict[str, Any]]] = [
        ("MLP 4x1024", "batch 8", f"{HERE}:mlp_small", {}),
        ("MLP 4x1024", "batch 4096", f"{HERE}:mlp_large", {}),
        ("CNN 6 conv+BN", "batch 2", f"{HERE}:cnn_small", {}),
        ("CNN 6 conv+BN", "batch 64", f"{HERE}:cnn_large", {}),
        ("decoder 4x256", "batch 1x64", str(config), {"batch_size": 1, "seq_len": 64}),
        ("decoder 4x256", "batch 16x256", str(config), {"batch_size": 16, "seq_len": 256}),
    ]
    rows = []
    for model, batch, target, kwargs in cases:
        configurations: tuple[tuple[str, Precision], ...] = (("float32", Precision.pure), ("bfloat16", Precision.amp))
        for dtype, precision in configurations:
            subject = open_subject(target, **kwargs)
            options = EstimateOptions(dtypes=(lookup(dtype),), modes=(Mode.training,), precisions=(precision,))
            row = estimate_memory(subject, options).estimates[0]
            measured = measure_row(subject, row, "cpu")
            b = row.bytes
            states = b.parameters + b.gradients + b.optimizer_states
            dominant = "states" if states > (b.activations or 0) else "activations"
            rows.append(
                (
                    f"{model}, {batch}",
                    f"{dtype} {precision}",
                    row.bytes.total,
                    measured.peak_bytes,
                    measured.error,
                    dominant,
                )
            )
            print(f"  {rows[-1][0]:<30} {rows[-1][1]:<14} error {measured.error:+.3%}", file=sys.stderr)
    return rows


def _as_call(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, dict):
        return (), inputs
    return (inputs,), {}


def reference_peak(model: nn.Module, inputs: Any, loss_fn: Any, amp: bool) -> int:
    """MemTracker's peak of the second iteration of a plain training loop (the referee, independent of dtypecheck)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])  # torch's default impl

    def load_batch() -> Any:  # a data loader hands over a fresh batch each step
        return {k: v.clone() for k, v in inputs.items()} if isinstance(inputs, dict) else inputs.clone()

    def train_step(batch: Any) -> None:
        args, kwargs = _as_call(batch)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if amp else contextlib.nullcontext()
        with autocast:
            output = model(*args, **kwargs)
            loss = loss_fn(output, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    train_step(load_batch())
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracker:
            train_step(load_batch())
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def step_accuracy() -> list[tuple[str, str, int, int, float, str]]:
    """Issue 12: each model with its own loss, estimated through the CLI's code path, against ``reference_peak``."""
    from benchmarks import memory_models
    from dtypecheck.dtypes import lookup
    from dtypecheck.memory import EstimateOptions, estimate_memory, open_subject
    from dtypecheck.memory_words import Mode, Precision

    rows = []
    for label, factory in memory_models.MODELS.items():
        configurations: tuple[tuple[str, Precision], ...] = (("float32", Precision.pure), ("bfloat16", Precision.amp))
        for dtype, precision in configurations:
            model, inputs, loss_fn = getattr(memory_models, factory)()
            measured = reference_peak(model, inputs, loss_fn, amp=precision == "amp")
            subject = open_subject(f"{Path(memory_models.__file__).resolve()}:{factory}")
            options = EstimateOptions(dtypes=(lookup(dtype),), modes=(Mode.training,), precisions=(precision,))
            row = estimate_memory(subject, options).estimates[0]
            error = (row.bytes.total - measured) / measured
            rows.append((label, f"{dtype} {precision}", row.bytes.total, measured, error, row.peak_phase))
            print(f"  {label:<28} {dtype} {precision:<5} error {error:+.3%}", file=sys.stderr)
    return rows


def _time_cli(folder: Path, checkout: Path | None = None) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one whole estimate-memory process (of the code in ``checkout``,
    another clone or worktree of the repository, when given)."""
    import os
    import resource

    env = dict(os.environ, PYTHONPATH=str(checkout)) if checkout else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "dtypecheck", "estimate-memory", str(folder), "-f", "json", "-q", "--context", "4096"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=checkout,
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


FULL_TRACE = """
import json, sys, time
from dtypecheck.memory import EstimateOptions, estimate_memory, open_subject
start = time.perf_counter()
subject = open_subject(sys.argv[1])
subject.traceable.with_layers = None
report = estimate_memory(subject, EstimateOptions(context=4096))
print(json.dumps([time.perf_counter() - start, [r.bytes.total for r in report.estimates]]))
"""


def speed(folder: Path, repeats: int, full: bool, against: Path | None = None) -> None:
    big = folder / "llama70b"
    big.mkdir(exist_ok=True)
    (big / "config.json").write_text(json.dumps(LLAMA_70B), encoding="utf-8")
    hub = folder / "llama70b-hf"
    hub.mkdir(exist_ok=True)
    (hub / "config.json").write_text(json.dumps(LLAMA_70B_HF), encoding="utf-8")
    for title, config in (("70B config (dtypecheck-decoder)", big), ("Llama-2-70B config (transformers)", hub)):
        runs: dict[str, list[tuple[float, float]]] = {"this tree": [], str(against): []}
        for _ in range(repeats):  # alternated, so that both see the same load on shared cores
            runs["this tree"].append(_time_cli(config))
            if against is not None:
                runs[str(against)].append(_time_cli(config, against))
        print(f"\n{title}, default grid (9 rows), whole process, medians over {repeats}:")
        medians = {}
        for name, times in runs.items():
            if times:
                medians[name] = (statistics.median(w for w, _ in times), statistics.median(c for _, c in times))
                walls = ", ".join(f"{w:.2f}" for w, _ in times)
                print(f"  {name}: {medians[name][0]:.2f} s wall, {medians[name][1]:.2f} s CPU (walls {walls})")
        if against is not None:
            (wall, cpu), (then_wall, then_cpu) = medians["this tree"], medians[str(against)]
            print(f"  this tree / {against}: {wall / then_wall:.2f}x wall, {cpu / then_cpu:.2f}x CPU")
    if full:
        done = subprocess.run([sys.executable, "-c", FULL_TRACE, str(big)], capture_output=True, text=True, check=True)
        seconds, totals = json.loads(done.stdout)
        from dtypecheck.memory import EstimateOptions, estimate_memory, open_subject

        fast = [r.bytes.total for r in estimate_memory(open_subject(str(big)), EstimateOptions(context=4096)).estimates]
        same = "identical" if fast == totals else "DIFFERENT"
        print(f"70B traced in full (all 80 blocks): {seconds:.1f} s; totals {same} to the extrapolated ones")


FIT_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    # Published sizes; built here, nothing downloaded.
    "Llama-3-8B": (
        "LlamaConfig",
        {
            "vocab_size": 128256,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 8192,
            "rope_theta": 500000.0,
            "architectures": ["LlamaForCausalLM"],
        },
    ),
    "Phi-3-mini-4k": (
        "Phi3Config",
        {
            "vocab_size": 32064,
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "max_position_embeddings": 4096,
            "sliding_window": 2047,
            "architectures": ["Phi3ForCausalLM"],
        },
    ),
    "Whisper-small": (
        "WhisperConfig",
        {
            "vocab_size": 51865,
            "d_model": 768,
            "encoder_layers": 12,
            "decoder_layers": 12,
            "encoder_attention_heads": 12,
            "decoder_attention_heads": 12,
            "encoder_ffn_dim": 3072,
            "decoder_ffn_dim": 3072,
            "num_mel_bins": 80,
            "max_source_positions": 1500,
            "max_target_positions": 448,
            "architectures": ["WhisperForConditionalGeneration"],
        },
    ),
    "Mamba-130m": (
        "MambaConfig",
        {
            "vocab_size": 50280,
            "hidden_size": 768,
            "num_hidden_layers": 24,
            "state_size": 16,
            "expand": 2,
            "conv_kernel": 4,
            "architectures": ["MambaForCausalLM"],
        },
    ),
    # Issue 31.5's configs, from the published config.json fields.
    "T5-base": (
        "T5Config",
        {
            "vocab_size": 32128,
            "d_model": 768,
            "d_kv": 64,
            "d_ff": 3072,
            "num_layers": 12,
            "num_heads": 12,
            "architectures": ["T5ForConditionalGeneration"],
        },
    ),
    "Whisper-large-v3": (
        "WhisperConfig",
        {
            "vocab_size": 51866,
            "d_model": 1280,
            "encoder_layers": 32,
            "decoder_layers": 32,
            "encoder_attention_heads": 20,
            "decoder_attention_heads": 20,
            "encoder_ffn_dim": 5120,
            "decoder_ffn_dim": 5120,
            "num_mel_bins": 128,
            "max_source_positions": 1500,
            "max_target_positions": 448,
            "architectures": ["WhisperForConditionalGeneration"],
        },
    ),
    "Mixtral-8x22B": (
        "MixtralConfig",
        {
            "vocab_size": 32768,
            "hidden_size": 6144,
            "intermediate_size": 16384,
            "num_hidden_layers": 56,
            "num_attention_heads": 48,
            "num_key_value_heads": 8,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 65536,
            "rope_theta": 1000000.0,
            "architectures": ["MixtralForCausalLM"],
        },
    ),
    "Qwen3-30B-A3B": (
        "Qwen3MoeConfig",
        {
            "vocab_size": 151936,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "decoder_sparse_step": 1,
            "norm_topk_prob": True,
            "max_position_embeddings": 40960,
            "rope_theta": 1000000.0,
            "architectures": ["Qwen3MoeForCausalLM"],
        },
    ),
    "Llama-3.1-70B": (
        "LlamaConfig",
        {
            "vocab_size": 128256,
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_hidden_layers": 80,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "architectures": ["LlamaForCausalLM"],
        },
    ),
    "ViT-L": (
        "ViTConfig",
        {
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "intermediate_size": 4096,
            "image_size": 224,
            "patch_size": 16,
            "architectures": ["ViTForImageClassification"],
        },
    ),
}


def _plain_total(target: Path, dtype: str, mode: str, batch: int, seq: int, context: int | None) -> int:
    """The row's total from a plain estimate at this shape (no --fit): the referee of a fit answer."""
    from dtypecheck.dtypes import lookup
    from dtypecheck.memory import EstimateOptions, estimate_memory
    from dtypecheck.memory_words import DeviceKind, Mode

    options = EstimateOptions(dtypes=(lookup(dtype),), modes=(Mode(mode),), context=context, device=DeviceKind.cuda)
    report = estimate_memory(str(target), options, batch_size=batch, seq_len=seq)
    return report.estimates[0].bytes.total


def _exact(target: Path, dtype: str, row: dict[str, Any], along_seq: bool, decoder: bool) -> str:
    """Whether a fit answer is the largest that fits: plain estimates at it and at the next value."""
    fit = row["fit"]
    value, bound = (fit["max_seq_len"], fit["max_seq_len_bound"]) if along_seq else (fit["max_batch_size"], None)
    if not along_seq:
        bound = fit["max_batch_size_bound"]
    if value is None:
        return "n/a"
    if bound in ("timeout", "search-limit", "fixed-batch"):
        return f"no ({bound})"
    usable = fit["usable_bytes"]

    def fits(x: int) -> bool:
        batch, seq = (row["batch_size"], x) if along_seq else (x, row["seq_len"])
        kv = x if along_seq and decoder and row["mode"] == "inference" else None
        return bool(_plain_total(target, dtype, row["mode"], batch, seq, kv) <= usable)

    if value == 0:
        return "yes" if not fits(1) else "NO"
    ok = fits(value) and (bound is not None or not fits(value + 1))
    return "yes" if ok else "NO"


def fit_answers(
    folder: Path, device: str, dtype: str, names: list[str], repeats: int, verify: bool, timeout: float
) -> None:
    """``--fit DEVICE`` of each published config (issues 22.4 and 31.5): the largest batch and sequence, the
    whole process's wall and CPU time (medians of ``repeats``), and whether each answer is exact: a plain estimate
    at the answer fits and one at the answer + 1 does not (``verify``)."""
    import resource

    import transformers

    print(f"| config | mode | max batch (exact) | max seq (exact) | wall s | CPU s |  # --fit {device} -d {dtype}")
    print("|---|---|---:|---:|---:|---:|")
    for name in names:
        kind, fields = FIT_CONFIGS[name]
        target = folder / name
        target.mkdir(exist_ok=True)
        getattr(transformers, kind)(**fields).to_json_file(str(target / "config.json"))
        command = [sys.executable, "-m", "dtypecheck", "estimate-memory", str(target), "-d", dtype, "-f", "json", "-q"]
        walls, cpus = [], []
        for _ in range(repeats):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            fit = ["--fit", device, "--fit-timeout", str(timeout)]
            done = subprocess.run([*command, *fit], capture_output=True, text=True, check=False)
            walls.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        if done.returncode != 0:
            print(f"| {name} | exit {done.returncode}: {done.stderr.strip()[-200:]} | | | {wall:.1f} | {cpu:.1f} |")
            continue
        doc = json.loads(done.stdout)
        decoder = doc["model"].get("model_class", "").endswith("CausalLM")
        for row in doc["estimates"]:
            fit = row["fit"]
            batch_exact = _exact(target, dtype, row, False, decoder) if verify else "-"
            seq_exact = _exact(target, dtype, row, True, decoder) if verify else "-"
            batch = f"{fit['max_batch_size']} {fit['max_batch_size_bound'] or ''} ({batch_exact})"
            seq = f"{fit['max_seq_len']} {fit['max_seq_len_bound'] or ''} ({seq_exact})"
            print(f"| {name} | {row['mode']} | {batch} | {seq} | {wall:.1f} | {cpu:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--suite", choices=("all", "step", "speed", "fit"), default="all")
    parser.add_argument("--fit-device", default="h100-80gb", help="the --fit target of --suite fit")
    parser.add_argument("--configs", default=",".join(FIT_CONFIGS), help="--suite fit: which configs, comma-separated")
    parser.add_argument("--no-verify", action="store_true", help="--suite fit: skip the plain estimates at N, N+1")
    parser.add_argument(
        "--fit-timeout",
        type=float,
        default=600.0,
        help="--suite fit: the --fit-timeout given (wall seconds; a shared machine runs slower than its CPU time)",
    )
    parser.add_argument("--full-trace", action="store_true", help="also trace the 70B model in full (slow)")
    parser.add_argument(
        "--against",
        type=Path,
        help="--suite speed: also time this checkout of the repository (e.g. a `git worktree` of an older commit), "
        "alternating runs with this tree",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent.parent))  # the repository root: ``benchmarks`` and ``dtypecheck``
    if args.suite in ("all", "step"):
        step_rows = step_accuracy()
        print("| model | training step | estimate | measured (MemTracker) | error | peak in |")
        print("|---|---|---:|---:|---:|---|")
        for name, config, estimate, measured, error, phase in step_rows:
            print(f"| {name} | {config} | {estimate:,} | {measured:,} | {error:+.3%} | {phase} |")
        print(f"\nworst |error| {max(abs(r[4]) for r in step_rows):.3%} (target <= 5%)\n")
    if args.suite == "step":
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.suite == "speed":
            speed(folder, args.repeats, args.full_trace, args.against)
            return
        if args.suite == "fit":
            names = [n for n in args.configs.split(",") if n]
            verify = not args.no_verify
            fit_answers(folder, args.fit_device, "bfloat16", names, args.repeats, verify, args.fit_timeout)
            return
        rows = accuracy(folder)
        print("| model, batch | training step | estimate | measured (MemTracker) | error | dominated by |")
        print("|---|---|---:|---:|---:|---|")
        for name, config, estimate, measured, error, dominant in rows:
            print(f"| {name} | {config} | {estimate:,} | {measured:,} | {error:+.3%} | {dominant} |")
        worst = max(abs(r[4]) for r in rows)
        print(f"\nworst |error| {worst:.3%} (target <= 10%)")
        if not args.skip_speed:
            speed(folder, args.repeats, args.full_trace)


if __name__ == "__main__":
    main()
