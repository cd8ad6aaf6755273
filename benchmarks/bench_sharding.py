"""``estimate-memory --strategy zero1|zero2|zero3|fsdp --world-size N`` against its anchors (issue 28.4).

1. DeepSpeed's own estimators, ``estimate_zero2_model_states_mem_needs`` and ``estimate_zero3_model_states_mem_needs``
   (no offload), called from the installed ``deepspeed`` when it imports, else the same formulas as DeepSpeed
   documents them (``docs/code-docs/source/memory.rst`` and ``runtime/zero/stage_1_and_2.py``, ``stage3.py``),
   written out below (checked equal to the package's where it imports). Both count mixed-precision training with
   Adam: 16-bit weights and gradients and 12 bytes of fp32 states (master copy, momentum, variance) per parameter,
   plus 4 bytes for an fp32 gradient partition.
   dtypecheck's matching row is ``-d bf16 --precision master``.
2. A measured FSDP2 step: ``fully_shard`` on every block and the root, 2 CPU ranks on gloo, one AdamW step in
   float32 after a warm-up step, with ``FSDPMemTracker`` (PyTorch's MemTracker for FSDP2) on each rank; the model
   states per rank are also read off the local shards. dtypecheck's row is ``-d fp32 --strategy fsdp --world-size 2``.

    .venv/bin/python benchmarks/bench_sharding.py                 # both tables
    .venv/bin/python benchmarks/bench_sharding.py --skip-fsdp     # the DeepSpeed table only
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve()
WIDTH, HIDDEN, BLOCKS, BATCH = 256, 1024, 8, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.relu(self.up(x)))
        return out


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def _loss(output: torch.Tensor, _inputs: Any) -> torch.Tensor:
    loss: torch.Tensor = output.float().pow(2).mean()
    return loss


def stack() -> tuple[nn.Module, torch.Tensor, Any]:
    """The factory dtypecheck estimates (this file is also the factory file)."""
    torch.manual_seed(0)
    return Stack(), torch.randn(BATCH, WIDTH), _loss


# --- DeepSpeed's estimators --------------------------------------------------------------------------------


def zero2_gpu_bytes(params: int, gpus: int) -> int:
    """DeepSpeed ZeRO-2, no offload: 16-bit weights whole (2 B/param); 16-bit gradients, the fp32 master,
    momentum, variance and gradient partition (18 B/param) split over the GPUs."""
    return 2 * params + int(18 * params / gpus)


def zero3_gpu_bytes(params: int, largest_layer: int, gpus: int) -> int:
    """DeepSpeed ZeRO-3, no offload: the largest layer's 16-bit weights and gradients whole, and 18 B/param (16-bit
    weights, fp32 master, momentum, variance and gradient) split over the GPUs."""
    return 4 * largest_layer + int(18 * params / gpus)


def deepspeed_estimates(params: int, largest_layer: int, gpus: int) -> tuple[int, int, str]:
    """(ZeRO-2, ZeRO-3) GPU bytes per device, and where they came from."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # by name: deepspeed is optional (not in requirements-dev.txt) and has no type information
            stage3 = importlib.import_module("deepspeed.runtime.zero.stage3")
            stage12 = importlib.import_module("deepspeed.runtime.zero.stage_1_and_2")
            estimate_zero3_model_states_mem_needs = stage3.estimate_zero3_model_states_mem_needs
            estimate_zero2_model_states_mem_needs = stage12.estimate_zero2_model_states_mem_needs
    except Exception:  # noqa: BLE001  (deepspeed is optional and may fail to import in many ways)
        return zero2_gpu_bytes(params, gpus), zero3_gpu_bytes(params, largest_layer, gpus), "formulas"
    _, zero2 = estimate_zero2_model_states_mem_needs(params, num_gpus_per_node=gpus, cpu_offload=False)
    zero3 = estimate_zero3_model_states_mem_needs(params, largest_layer, num_gpus_per_node=gpus, cpu_offload=False)
    # The formulas are re-derived above; check they agree with the installed package.
    assert zero2 == zero2_gpu_bytes(params, gpus), (zero2, zero2_gpu_bytes(params, gpus))
    ours = zero3_gpu_bytes(params, largest_layer, gpus)
    assert zero3[1] == ours, (zero3, ours)
    return int(zero2), int(zero3[1]), "deepspeed"


def _estimate(dtype: str, precision: str, strategy: str, world: int) -> dict[str, Any]:
    from dtypecheck.dtypes import lookup
    from dtypecheck.memory import EstimateOptions, estimate_memory
    from dtypecheck.memory_words import Mode, OptimizerImpl, Precision, Strategy

    options = EstimateOptions(
        dtypes=(lookup(dtype),),
        modes=(Mode.training,),
        precisions=(Precision(precision),),
        strategy=Strategy(strategy),
        world_size=world,
        optimizer_impl=OptimizerImpl.for_loop,
    )
    row = estimate_memory(f"{HERE}:stack", options).estimates[0]
    b = row.bytes
    return {
        "weights": b.parameters,
        "gradients": b.gradients,
        "optimizer": b.optimizer_states + b.master_weights,
        "gathered": b.gathered_parameters,
        "total": b.total,
    }


def deepspeed_table() -> None:
    model = Stack()
    params = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in block.parameters()) for block in (*model.blocks, model.head))
    # DeepSpeed's "largest layer" (as its ``..._all_live(model)`` wrapper counts it): a module's own parameters.
    largest_layer = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    print(f"\nmodel: {params:,} parameters; largest block {largest:,}, largest layer {largest_layer:,}")
    print("| strategy | N | dtypecheck states/device | (weights + grads + optim + gathered) | DeepSpeed |", end="")
    print(" source | diff |")
    print("|---|---:|---:|---|---:|---|---:|")
    for world in (2, 4, 8):
        for strategy in ("zero1", "zero2", "zero3"):
            est = _estimate("bfloat16", "master", strategy, world)
            states = est["weights"] + est["gradients"] + est["optimizer"] + est["gathered"]
            parts = f"{est['weights']:,} + {est['gradients']:,} + {est['optimizer']:,} + {est['gathered']:,}"
            if strategy == "zero1":
                print(f"| {strategy} | {world} | {states:,} | {parts} | (no estimator) | | |")
                continue
            zero2, zero3, source = deepspeed_estimates(params, largest_layer, world)
            anchor = zero2 if strategy == "zero2" else zero3
            diff = f"{states / anchor - 1:+.1%}"
            print(f"| {strategy} | {world} | {states:,} | {parts} | {anchor:,} | {source} | {diff} |")


# --- a measured FSDP2 step ----------------------------------------------------------------------------------


def _rank(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model, inputs, loss_fn = stack()
        assert isinstance(model, Stack)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), foreach=False)

        def step() -> None:
            loss = loss_fn(model(inputs.clone()), None)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()
        tracker = FSDPMemTracker(model, optimizer)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with tracker:
                step()
        peak = tracker.get_tracker_snapshot("peak")
        device = next(iter(peak))
        local = [p.to_local() for p in model.parameters()]  # type: ignore[attr-defined]
        weights = sum(t.numel() * t.element_size() for t in local)
        shards = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
        shards = [v.to_local() if hasattr(v, "to_local") else v for v in shards]  # a DTensor's own shard
        states = sum(t.numel() * t.element_size() for t in shards)
        Path(f"{out}.{rank}").write_text(
            json.dumps({"peak": peak[device], "weights": weights, "optimizer": states}), encoding="utf-8"
        )
    finally:
        dist.destroy_process_group()


def fsdp_table(world: int) -> None:
    from torch.multiprocessing.spawn import spawn

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rank")
        spawn(_rank, args=(world, str(Path(tmp) / "init"), out), nprocs=world, join=True)
        ranks = [json.loads(Path(f"{out}.{r}").read_text(encoding="utf-8")) for r in range(world)]
    est = _estimate("float32", "pure", "fsdp", world)
    print(f"\nFSDP2 on gloo, {world} CPU ranks, float32 AdamW (for-loop), batch {BATCH}; FSDPMemTracker per rank")
    print("| per rank | dtypecheck | " + " | ".join(f"rank {r}" for r in range(world)) + " |")
    print("|---|---:|" + "---:|" * world)
    rows = [
        ("sharded weights", est["weights"], [r["weights"] for r in ranks]),
        ("optimizer states", est["optimizer"], [r["optimizer"] for r in ranks]),
        ("peak (MemTracker Total)", est["total"], [r["peak"]["Total"] for r in ranks]),
    ]
    for label, ours, theirs in rows:
        print(f"| {label} | {ours:,} | " + " | ".join(f"{t:,} ({ours / t - 1:+.1%})" for t in theirs) + " |")
    print("MemTracker peak by category, rank 0: " + ", ".join(f"{k} {v:,}" for k, v in ranks[0]["peak"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-fsdp", action="store_true")
    parser.add_argument("--world-size", type=int, default=2, help="ranks of the measured FSDP2 run")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent.parent))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    deepspeed_table()
    if not args.skip_fsdp:
        fsdp_table(args.world_size)


if __name__ == "__main__":
    main()
