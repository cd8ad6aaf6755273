"""What a native per-op check would cost the full trace (issue 30.5's design question, measured before building it).

The full trace's cheap pass is a Python dispatch mode: ~4 us of Python per op before any check, so on
``bench_watch.py``'s model of ~2 us ops it cannot come near the 1.5x target. The candidate is a C++ observer of every
op that the dispatcher already supports, ``at::addGlobalCallback`` with a ``RecordFunctionCallback`` that asks for
the ops' outputs: it sees every op at every depth (forward, backward, optimizer), changes no numbers (autocast and
decompositions run as without it) and calls no Python. This script compiles such an observer (torch's cpp_extension,
~1 minute, into a temporary folder), which reads every floating CPU output once (non-finite values and the largest
magnitude, what the cheap pass's ``aminmax`` gives) of every op not nested in another (a composite's parts may
return memory their caller has not written yet: read, a view of an ``empty`` looked non-finite), and counts what it
saw, then times ``bench_watch.py``'s small
model loop (the loop's own CPU seconds, start-up left out) plain and observed, alternating, and prints the medians:

    .venv/bin/python benchmarks/bench_op_hook.py --repeats 7 --steps 300

Only a measurement: nothing here is part of dtypecheck. It also checks that the observed run computes the same loss
to the bit, and that a value planted at ``--bad`` is seen (at which op, counted in the order the ops ended).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository root too
from benchmarks.bench_watch import SMALL

OBSERVER = r"""
#include <ATen/record_function.h>
#include <torch/extension.h>

#include <cmath>
#include <string>

namespace {
int64_t ops = 0, checked = 0, first = -1;
std::string first_name;
float largest = 0.0f;
at::CallbackHandle handle = 0;

// Ops whose output is memory nobody has written yet: its bits say nothing.
bool uninitialised(const char* name) {
  const std::string op(name);
  return op.rfind("aten::empty", 0) == 0 || op == "aten::new_empty" || op == "aten::new_empty_strided" ||
         op == "aten::resize_";
}

void look(const at::Tensor& t, const at::RecordFunction& fn) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != c10::kStrided || !t.has_storage() ||
      !t.is_contiguous() || t.scalar_type() != at::kFloat || t.numel() == 0)
    return;
  const float* p = t.const_data_ptr<float>();
  float high = 0.0f;
  bool bad = false;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {
    const float a = std::fabs(p[i]);
    bad |= !std::isfinite(a);
    high = a > high ? a : high;
  }
  ++checked;
  largest = high > largest ? high : largest;
  if (bad && first < 0) {
    first = ops;
    first_name = fn.name();
  }
}

// Ops nested in another op (a composite's parts) are not read: their outputs may be memory the outer op has not
// written yet (a view of an ``empty`` that an ``out=`` kernel fills later). Backward's ops run at depth 0 inside
// their node's BACKWARD_FUNCTION record, which is not counted.
thread_local int depth = 0;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (fn.scope() == at::RecordScope::FUNCTION) ++depth;
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (fn.scope() != at::RecordScope::FUNCTION) return;
  ++ops;
  if (--depth != 0 || uninitialised(fn.name())) return;
  for (const auto& value : fn.outputs()) {
    if (value.isTensor()) look(value.toTensor(), fn);
  }
}
}  // namespace

void install() {
  handle = at::addGlobalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
}

pybind11::tuple seen() { return pybind11::make_tuple(ops, checked, first, first_name, largest); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install);
  m.def("seen", &seen);
}
"""

RUN = """
import sys
observed = sys.argv.pop(1) == "observed"
if observed:
    sys.path.insert(0, sys.argv.pop(1))
    import time, torch, op_observer
    # Observe from the loop's start (its first process_time call): a module's constructor makes parameters of
    # memory not yet written (torch.empty, then an init), and their views would read as non-finite.
    _clock = time.process_time
    def _start():
        time.process_time = _clock
        op_observer.install()
        return _clock()
    time.process_time = _start
else:
    sys.argv.pop(1)
import atexit
atexit.register(lambda: print("bits", globals()["loss"].item().hex(), file=sys.stderr))
if observed:
    atexit.register(lambda: print("seen", *op_observer.seen(), file=sys.stderr))
"""


def _build(folder: Path) -> None:
    from torch.utils.cpp_extension import load_inline

    load_inline("op_observer", OBSERVER, build_directory=str(folder), extra_cflags=["-O3"], verbose=False)


def _loop(folder: Path, script: Path, observed: bool, steps: int, bad: int) -> tuple[float, str, str]:
    argv = [sys.executable, str(script), "observed" if observed else "plain", str(folder), str(steps), str(bad)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env={"OMP_NUM_THREADS": "1"})
    loop = next(line for line in done.stderr.splitlines() if line.startswith("loop "))
    seen = next((line for line in done.stderr.splitlines() if line.startswith("seen ")), "")
    bits = next(line for line in done.stderr.splitlines() if line.startswith("bits "))
    return float(loop.split()[1]), bits, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--bad", type=int, default=200, help="the step whose input is scaled by 1e38 (one run)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print("compiling the observer (~1 minute)", file=sys.stderr)
        _build(folder)
        script = folder / "loop.py"
        script.write_text(RUN + SMALL, encoding="utf-8")
        plain, observed = [], []
        for _ in range(args.repeats):
            seconds, plain_loss, _ = _loop(folder, script, False, args.steps, 0)
            plain.append(seconds)
            seconds, observed_loss, seen = _loop(folder, script, True, args.steps, 0)
            observed.append(seconds)
            if observed_loss != plain_loss:
                sys.exit(f"the observed run computed another loss: {observed_loss!r} vs {plain_loss!r}")
        ops, checked = seen.split()[1:3]
        print(f"clean run: {ops} ops observed, {checked} outputs read, the same loss to the bit")
        print(f"loop CPU seconds: plain {plain}, observed {observed}")
        ratio = statistics.median(observed) / statistics.median(plain)
        print(
            f"median plain {statistics.median(plain):.3f} s, observed {statistics.median(observed):.3f} s: {ratio:.3f}x"
        )
        _, _, seen = _loop(folder, script, True, args.steps, args.bad)
        fields = seen.split()
        print(f"input scaled by 1e38 at step {args.bad}: first non-finite output at op {fields[3]} ({fields[4]})")


if __name__ == "__main__":
    main()
