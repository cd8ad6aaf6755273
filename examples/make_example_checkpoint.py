"""Write the small example checkpoint that ``make demo`` scans (deterministic, about 60 KiB).

Each tensor shows one thing ``dtypecheck scan-model`` finds:

- ``embed.weight``, ``layers.0.attn.qkv.weight``: ordinary weights, fine in float16 and bfloat16 (a few of the
  smallest weights become float16 subnormals, and float8 needs scaling);
- ``layers.0.mlp.fc1.weight``: a handful of outliers beyond float16's max (65504): overflow in float16, fine in
  bfloat16;
- ``optimizer.state.0.exp_avg_sq``: Adam's second moment (squared gradients around 1e-7): in float16 a third of
  it flushes to zero and the rest goes subnormal, which is why optimizer state stays in float32 or bfloat16;
- ``layers.1.mlp.fc2.weight``: a NaN that a diverged step left behind;
- ``layers.0.norm.weight`` (bfloat16 ones) and ``position_ids`` (int64): nothing to report.

Usage: ``python examples/make_example_checkpoint.py [--quiet] [PATH]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

DEFAULT_PATH = Path(__file__).with_name("tiny_model.safetensors")


def build() -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(20240607)

    def weights(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    fc1 = weights(128, 32)
    fc1.flat[[5, 700, 3001]] = [70000.0, -123456.0, 65520.0]  # 65520 is the first value float16 rounds up to inf
    fc2 = weights(32, 128)
    fc2[3, 17] = np.nan
    gradients = rng.standard_normal((64, 32)) * 3e-4
    exp_avg_sq = (gradients * gradients).astype(np.float32)  # ~1e-7: around float16's smallest subnormal (6e-8)
    arrays = {
        "embed.weight": weights(64, 32),
        "layers.0.attn.qkv.weight": weights(96, 32),
        "layers.0.mlp.fc1.weight": fc1,
        "layers.1.mlp.fc2.weight": fc2,
        "optimizer.state.0.exp_avg_sq": exp_avg_sq,
        "position_ids": np.arange(128, dtype=np.int64).reshape(1, 128),
    }
    tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
    tensors["layers.0.norm.weight"] = torch.ones(32, dtype=torch.bfloat16)
    return tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--quiet", action="store_true", help="print nothing")
    args = parser.parse_args()
    tensors = build()
    save_file(tensors, str(args.path), metadata={"created_by": "examples/make_example_checkpoint.py"})
    if not args.quiet:
        print(f"wrote {args.path} ({args.path.stat().st_size:,} bytes, {len(tensors)} tensors)")


if __name__ == "__main__":
    main()
