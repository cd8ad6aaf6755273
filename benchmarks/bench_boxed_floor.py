"""What any per-op interception that boxes each op costs before it does anything (issue 30.5's floor).

Both ways the full trace can see every op below autograd, torch's Python-key fallback and a boxed C++ fallback of
a dispatch key (what ``native/dispatch.cpp`` now uses), turn each op's typed call into a stack of ``IValue``s and
back: the integer lists of ``layer_norm`` or ``sum`` become heap lists, and the kernel is found again. This script
measures that alone. It compiles (torch's cpp_extension, ~1 minute, into a temporary folder) a fallback on
``Fake`` (the key just below ``Python``, which no tensor of this workload carries; not ``CustomRNGKeyId``, which
the dispatcher counts as a backend: composite ops' decompositions run there instead, and ``layer_norm`` gave other
bits) that only counts the op and re-dispatches it below itself, switches it on through the thread's included
keys, and times ``bench_watch.py``'s small model in one process: blocks of ``--steps`` steps, plain and with the
fallback on, alternating ``--repeats`` times, and prints the median of the blocks' ratios. It also times one small
op (``torch.add`` of two 8x32 tensors) both ways.

    .venv/bin/python benchmarks/bench_boxed_floor.py --repeats 30 --steps 20

Only a measurement: nothing here is part of dtypecheck. It checks that the boxed run computes the same loss to the
bit. ``bench_watch.py blocks --full`` times the full trace the same way.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository root too
from benchmarks.bench_watch import SMALL

FALLBACK = r"""
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/extension.h>
#include <torch/library.h>

namespace {
int64_t ops = 0;

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  ++ops;
  // What the kernel calls in turn does not come back here (as under a dispatch mode, whose keys are excluded).
  c10::impl::ExcludeDispatchKeyGuard below(c10::DispatchKey::Fake);
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake),
                     stack);
}
}  // namespace

TORCH_LIBRARY_IMPL(_, Fake, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }

void on(bool value) { c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, value); }

int64_t count() { return ops; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("on", &on);
  m.def("count", &count);
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    import torch
    from torch.utils.cpp_extension import load_inline

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        print("compiling the fallback (~1 minute)", file=sys.stderr)
        boxed = load_inline("boxed_floor", FALLBACK, build_directory=folder, extra_cflags=["-O2"], verbose=False)
        namespace: dict[str, object] = {}
        argv, sys.argv = sys.argv, [sys.argv[0], "0", "0"]
        try:
            exec(SMALL[: SMALL.index("start = time.process_time()")], namespace)  # our own workload text
        finally:
            sys.argv = argv
        model: torch.nn.Module = namespace["model"]  # type: ignore[assignment]
        optimizer: torch.optim.Optimizer = namespace["optimizer"]  # type: ignore[assignment]

        def block(steps: int) -> tuple[float, torch.Tensor]:
            start = time.process_time()
            loss = torch.zeros(())
            for _ in range(steps):
                loss = model(torch.randn(8, 32)).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            return time.process_time() - start, loss

        block(5)  # warm-up
        before = boxed.count()
        boxed.on(True)
        block(1)
        boxed.on(False)
        print(f"{boxed.count() - before} ops a step went through the fallback")
        # The same steps from the same state, plain then boxed: the same loss to the bit.
        torch.manual_seed(1)
        state = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
        _, plain_loss = block(3)
        model.load_state_dict(state[0])
        optimizer.load_state_dict(state[1])
        torch.manual_seed(1)
        boxed.on(True)
        _, boxed_loss = block(3)
        boxed.on(False)
        if not torch.equal(plain_loss, boxed_loss):
            sys.exit(f"the boxed run computed another loss: {boxed_loss.item()!r} vs {plain_loss.item()!r}")
        ratios = []
        for _ in range(args.repeats):
            plain, _ = block(args.steps)
            boxed.on(True)
            seconds, _ = block(args.steps)
            boxed.on(False)
            ratios.append(seconds / plain)
        print(f"{args.repeats} blocks of {args.steps} steps, boxed / plain: median {statistics.median(ratios):.3f}x")
        a, b = torch.randn(8, 32), torch.randn(8, 32)
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(7):
            for on in (False, True):
                boxed.on(on)
                start = time.perf_counter()
                for _ in range(20000):
                    torch.add(a, b)
                times[on].append((time.perf_counter() - start) / 20000 * 1e9)
                boxed.on(False)
        plain_ns, boxed_ns = statistics.median(times[False]), statistics.median(times[True])
        print(f"torch.add of 8x32: plain {plain_ns:.0f} ns, boxed {boxed_ns:.0f} ns (+{boxed_ns - plain_ns:.0f} ns)")


if __name__ == "__main__":
    main()
