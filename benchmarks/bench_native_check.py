"""Nanoseconds per value of the full trace's C++ check of one output (``extrema``: lowest, highest, and in half
precision the count below the smallest normal), the pass ``native/tensors.h`` makes over every floating output the
per-op path runs (AdamW's updates of a 1,024-value weight on ``bench_watch.py``'s small model, for one); then
microseconds per call of watch mode's per-step check (``Group.finite``: is every value finite) of 300 tensors, half
of 1,024 values and half of 32 (about what that model's parameters and AdamW states make).

    .venv/bin/python benchmarks/bench_native_check.py [--repeats 7]

To compare with another checkout (the commit before a change; its build must be in the cache, ``make native``
there), run it with that checkout first on the path: ``PYTHONPATH=/tmp/base .venv/bin/python ...``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dtypecheck.nantrace import native


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    module = native.load(build_in_background=False)
    if module is None:
        raise SystemExit("the C++ checks are not built: make native")
    print(f"module: {module.__file__}")
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        tiny = torch.finfo(dtype).smallest_normal if dtype in (torch.float16, torch.bfloat16) else 0.0
        for n in (1024, 1 << 20):
            tensor = torch.randn(n, generator=generator).to(dtype)
            calls = max(1, (1 << 24) // n)
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                for _ in range(calls):
                    module.extrema(tensor, tiny)
                times.append((time.perf_counter() - start) / (calls * n) * 1e9)
            print(f"{dtype!s:15} {n:>9,} values: median {statistics.median(times):.3f} ns per value")
    sizes = [1024] * 150 + [32] * 150
    for dtype in (torch.float32, torch.bfloat16):
        group = module.Group([torch.randn(n, generator=generator).to(dtype) for n in sizes])
        times = []
        for _ in range(args.repeats * 2):
            start = time.perf_counter()
            for _ in range(200):
                group.finite()
            times.append((time.perf_counter() - start) / 200 * 1e6)
        print(f"{dtype!s:15} watch check of {len(sizes)} tensors: median {statistics.median(times):.1f} us per call")


if __name__ == "__main__":
    main()
