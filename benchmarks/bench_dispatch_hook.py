"""Issue 30.5's design question, second part: can native code see exactly the ops the full trace's Python dispatch
mode sees, run them exactly as it runs them, and at what cost?

``bench_op_hook.py`` answered the cost of a C++ ``RecordFunction`` observer (1.36x), but that observer sees other
ops than the full trace: ``aten::linear`` at the top where the dispatch mode (below autograd and autocast) sees
``aten::t`` and ``aten::addmm``, so it cannot name the op the full trace names, nor count the same ops. This script
compiles (torch's cpp_extension, ~1 minute, into a temporary folder) a dispatch-level hook: a Python
``TorchDispatchMode`` subclass is pushed as usual (``with mode:``), and torch's Python interpreter's ``dispatch``
entry (the one its Python-key fallback calls for the mode on top of the stack) is wrapped: when the mode on top is
the marker, the op is run in C++ as the Python mode runs ``func(*args)`` (the mode popped while it runs, the
same dispatch keys excluded), and each floating CPU output is read once (non-finite values, the largest
magnitude); any other mode or tensor subclass goes to torch's own entry. No Python runs per op.

It checks, on ``bench_watch.py``'s small model (12 blocks of Linear, LayerNorm and GELU, AdamW):

- the hooked loop computes the same loss to the bit as the plain loop, in float32 and under CPU bf16 autocast;
- it sees the same ops, in the same order, as a Python dispatch mode that only records ``func`` (names compared op
  by op over two steps: forward, backward and the optimizer step);
- an input scaled by 1e38 is first seen non-finite at the same op as the full trace (``dtypecheck.trace``) names;

and times blocks of ``--steps`` steps in one process, plain and hooked alternating ``--repeats`` times (the median of
the blocks' ratios: a process per run varies more than the difference measured on a shared machine), beside an
empty Python dispatch mode (the floor of any per-op Python) and the full trace:

    .venv/bin/python benchmarks/bench_dispatch_hook.py --repeats 15 --steps 50

Only a measurement: nothing here is part of dtypecheck.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HOOK = r"""
#include <ATen/core/PythonFallbackKernel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/PyInterpreter.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/utils/torch_dispatch_mode.h>
#include <torch/extension.h>

#include <cmath>
#include <string>
#include <unordered_map>

namespace {

int64_t ops = 0, checked = 0, first = -1;
std::string first_name;
bool recording = false;
std::vector<std::string> names;

// What naming each op's line would cost: the GIL taken back (the op's Python binding released it) and the Python
// stack walked to the innermost frame outside torch, whose code objects are sorted once each.
bool locating = false;
int64_t located = 0;
std::string torch_root;
std::unordered_map<PyCodeObject*, bool> user_code;
int last_line = 0;

void locate() {
  pybind11::gil_scoped_acquire gil;
  PyFrameObject* frame = PyEval_GetFrame();
  Py_XINCREF(frame);
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    auto found = user_code.find(code);
    bool user;
    if (found == user_code.end()) {
      const char* file = PyUnicode_AsUTF8(code->co_filename);
      user = file != nullptr && std::string(file).rfind(torch_root, 0) != 0;
      Py_INCREF(code);  // kept: the cache's key must not be reused by another code object
      user_code.emplace(code, user);
    } else {
      user = found->second;
    }
    if (user) {
      last_line = PyFrame_GetLineNumber(frame);
      ++located;
      Py_DECREF(code);
      Py_DECREF(frame);
      return;
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(code);
    Py_DECREF(frame);
    frame = back;
  }
}
float largest = 0.0f;
PyObject* marker = nullptr;

void look(const at::Tensor& t, const c10::OperatorHandle& op) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != c10::kStrided || !t.has_storage() ||
      !t.is_contiguous() || t.numel() == 0)
    return;
  float high = 0.0f;
  bool bad = false;
  auto scan = [&](auto* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const float a = std::fabs(static_cast<float>(p[i]));
      bad |= !std::isfinite(a);
      high = a > high ? a : high;
    }
  };
  switch (t.scalar_type()) {
    case at::kFloat: scan(t.const_data_ptr<float>(), t.numel()); break;
    case at::kBFloat16: scan(t.const_data_ptr<at::BFloat16>(), t.numel()); break;
    case at::kHalf: scan(t.const_data_ptr<at::Half>(), t.numel()); break;
    default: return;
  }
  ++checked;
  largest = high > largest ? high : largest;
  if (bad && first < 0) {
    first = ops;
    first_name = op.schema().name() + "." + op.schema().overload_name();
  }
}

bool uninitialised(const c10::OperatorHandle& op) {
  const auto& name = op.schema().name();
  return name.rfind("aten::empty", 0) == 0 || name == "aten::new_empty" || name == "aten::new_empty_strided";
}

// The ops the marker mode would have been given: run as the Python mode runs func(*args) (torch's Python-key
// fallback has already excluded every key above Python), with the mode popped while it runs.
void run_hooked(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  {
    torch::torch_dispatch_mode::StashTorchDispatchModeGuard popped;
    op.callBoxed(stack);
  }
  ++ops;
  if (recording) names.push_back(op.schema().name() + "." + op.schema().overload_name());
  if (locating) locate();
  if (uninitialised(op)) return;
  const auto returns = op.schema().returns().size();
  for (const auto& value : torch::jit::last(*stack, returns)) {
    if (value.isTensor()) {
      look(value.toTensor(), op);
    } else if (value.isTensorList()) {
      for (const auto& t : value.toTensorVector()) look(t, op);
    }
  }
}

// torch's own interpreter entry, forwarded everywhere; ``dispatch`` takes the marker mode's ops.
struct Wrapped final : c10::impl::PyInterpreterVTable {
  const c10::impl::PyInterpreterVTable* base;
  explicit Wrapped(const c10::impl::PyInterpreterVTable* b) : base(b) {}

  std::string name() const override { return base->name(); }
  void incref(PyObject* o) const override { base->incref(o); }
  void decref(PyObject* o) const override { base->decref(o); }
  bool try_incref(const c10::impl::PyObjectSlot& s) const override { return base->try_incref(s); }
  size_t refcnt(PyObject* o) const override { return base->refcnt(o); }
  c10::intrusive_ptr<c10::TensorImpl> detach(const c10::TensorImpl* s) const override { return base->detach(s); }
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) const override {
    const auto n = c10::impl::TorchDispatchModeTLS::stack_len();
    if (marker != nullptr && n > 0 &&
        c10::impl::TorchDispatchModeTLS::get_stack_at(n - 1)->ptr(getPyInterpreter()) == marker) {
      run_hooked(op, stack);
      return;
    }
    base->dispatch(op, stack);
  }
  void reportErrorCallback(PyObject* c, c10::DispatchKey k) const override { base->reportErrorCallback(c, k); }
  void python_op_registration_trampoline(const c10::OperatorHandle& op, c10::DispatchKey k, c10::DispatchKeySet ks,
                                         torch::jit::Stack* s, bool with_keyset, bool with_op) const override {
    base->python_op_registration_trampoline(op, k, ks, s, with_keyset, with_op);
  }
  void throw_abstract_impl_not_imported_error(std::string opname, const char* pymodule,
                                              const char* context) const override {
    base->throw_abstract_impl_not_imported_error(std::move(opname), pymodule, context);
  }
  void python_dispatcher(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* s) const override {
    base->python_dispatcher(op, ks, s);
  }
  bool is_contiguous(const c10::TensorImpl* s, at::MemoryFormat f) const override { return base->is_contiguous(s, f); }
  c10::SymBool sym_is_contiguous(const c10::TensorImpl* s, at::MemoryFormat f) const override {
    return base->sym_is_contiguous(s, f);
  }
  bool is_strides_like(const c10::TensorImpl* s, at::MemoryFormat f) const override {
    return base->is_strides_like(s, f);
  }
  bool is_non_overlapping_and_dense(const c10::TensorImpl* s) const override {
    return base->is_non_overlapping_and_dense(s);
  }
  c10::Device device(const c10::TensorImpl* s) const override { return base->device(s); }
  int64_t dim(const c10::TensorImpl* s) const override { return base->dim(s); }
  c10::IntArrayRef strides(const c10::TensorImpl* s) const override { return base->strides(s); }
  c10::IntArrayRef sizes(const c10::TensorImpl* s) const override { return base->sizes(s); }
  c10::SymIntArrayRef sym_sizes(const c10::TensorImpl* s) const override { return base->sym_sizes(s); }
  c10::Layout layout(const c10::TensorImpl* s) const override { return base->layout(s); }
  int64_t numel(const c10::TensorImpl* s) const override { return base->numel(s); }
  c10::SymInt sym_numel(const c10::TensorImpl* s) const override { return base->sym_numel(s); }
  c10::SymIntArrayRef sym_strides(const c10::TensorImpl* s) const override { return base->sym_strides(s); }
  c10::SymInt sym_storage_offset(const c10::TensorImpl* s) const override { return base->sym_storage_offset(s); }
  void trace_gpu_event_creation(c10::DeviceType d, uintptr_t e) const override {
    base->trace_gpu_event_creation(d, e);
  }
  void trace_gpu_event_deletion(c10::DeviceType d, uintptr_t e) const override {
    base->trace_gpu_event_deletion(d, e);
  }
  void trace_gpu_event_record(c10::DeviceType d, uintptr_t e, uintptr_t s) const override {
    base->trace_gpu_event_record(d, e, s);
  }
  void trace_gpu_event_wait(c10::DeviceType d, uintptr_t e, uintptr_t s) const override {
    base->trace_gpu_event_wait(d, e, s);
  }
  void trace_gpu_memory_allocation(c10::DeviceType d, uintptr_t p) const override {
    base->trace_gpu_memory_allocation(d, p);
  }
  void trace_gpu_memory_deallocation(c10::DeviceType d, uintptr_t p) const override {
    base->trace_gpu_memory_deallocation(d, p);
  }
  void trace_gpu_stream_creation(c10::DeviceType d, uintptr_t s) const override {
    base->trace_gpu_stream_creation(d, s);
  }
  void trace_gpu_device_synchronization(c10::DeviceType d) const override { base->trace_gpu_device_synchronization(d); }
  void trace_gpu_stream_synchronization(c10::DeviceType d, uintptr_t s) const override {
    base->trace_gpu_stream_synchronization(d, s);
  }
  void trace_gpu_event_synchronization(c10::DeviceType d, uintptr_t e) const override {
    base->trace_gpu_event_synchronization(d, e);
  }
  void reset_backward_hooks(const c10::TensorImpl* s) const override { base->reset_backward_hooks(s); }
};

Wrapped* wrapped = nullptr;

}  // namespace

// The wrapper stays installed for the process (a pointer swap is atomic enough for a benchmark, and the wrapper
// forwards every other call); ``mark`` names the mode object whose ops run here (None: none does).
void install() {
  auto* interpreter = getPyInterpreter();
  if (wrapped == nullptr) {
    wrapped = new Wrapped(interpreter->vtable_);
    interpreter->vtable_ = wrapped;
  }
}

void mark(pybind11::object mode) {
  marker = mode.is_none() ? nullptr : mode.ptr();
}

void reset(bool record) {
  recording = record;
  names.clear();
  ops = checked = 0;
  first = -1;
  first_name.clear();
  largest = 0.0f;
}

pybind11::tuple seen() { return pybind11::make_tuple(ops, checked, first, first_name, largest); }

std::vector<std::string> recorded() { return names; }

void locate_lines(bool on, std::string root) {
  locating = on;
  torch_root = std::move(root);
  located = 0;
}

pybind11::tuple lines_located() { return pybind11::make_tuple(located, last_line); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install);
  m.def("mark", &mark);
  m.def("reset", &reset);
  m.def("seen", &seen);
  m.def("recorded", &recorded);
  m.def("locate_lines", &locate_lines);
  m.def("lines_located", &lines_located);
}
"""


def _build(folder: Path) -> Any:
    from torch.utils.cpp_extension import load_inline

    return load_inline("dispatch_hook", HOOK, build_directory=str(folder), extra_cflags=["-O3"], verbose=False)


def _small() -> tuple[Any, Any]:
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(32, 32)
            self.norm = torch.nn.LayerNorm(32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.nn.functional.gelu(self.norm(self.fc(x)))

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(Block() for _ in range(12)), torch.nn.Linear(32, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _steps(model: Any, optimizer: Any, steps: int, *, bad: int = 0, autocast: bool = False) -> float:
    import torch

    loss = torch.zeros(())
    for step in range(1, steps + 1):
        x = torch.randn(8, 32)
        if step == bad:
            x = x * 1e38
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return float(loss.item())


def _modes(hook: Any) -> tuple[Any, Any, Any]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Marker(TorchDispatchMode):  # its ops never reach this method while it is marked
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    class Empty(Marker):
        pass

    class Names(Marker):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.names.append(f"{func._schema.name}.{func._schema.overload_name}")
            return func(*args, **(kwargs or {}))

    marker = Marker()
    hook.mark(marker)
    return marker, Empty(), Names()


def _same_bits(hook: Any, marker: Any, autocast: bool) -> tuple[str, str]:
    import torch

    torch.manual_seed(1)
    model, optimizer = _small()
    plain = _steps(model, optimizer, 20, autocast=autocast)
    torch.manual_seed(1)
    model, optimizer = _small()
    with marker:
        hooked = _steps(model, optimizer, 20, autocast=autocast)
    return plain.hex(), hooked.hex()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--full-repeats", type=int, default=3, help="blocks timed under the full trace (slow)")
    args = parser.parse_args()
    import torch

    import dtypecheck

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        print("compiling the hook (~1 minute)", file=sys.stderr)
        hook = _build(Path(tmp))
        hook.install()
        marker, empty, names = _modes(hook)
        for autocast in (False, True):
            plain, hooked = _same_bits(hook, marker, autocast)
            label = "bf16 autocast" if autocast else "float32"
            verdict = "same" if plain == hooked else "DIFFERENT"
            print(f"{label}: loss after 20 steps plain {plain}, hooked {hooked}: {verdict}")
        # The same ops in the same order as a Python dispatch mode is given (two steps of a fresh model each).
        torch.manual_seed(2)
        model, optimizer = _small()
        with names:
            _steps(model, optimizer, 2)
        torch.manual_seed(2)
        model, optimizer = _small()
        hook.reset(True)
        with marker:
            _steps(model, optimizer, 2)
        hooked_names = list(hook.recorded())
        same = "the same, in the same order" if hooked_names == names.names else "DIFFERENT"
        print(f"ops over 2 steps: Python mode {len(names.names)}, hooked {len(hooked_names)}: {same}")
        # Each op's line: every op (forward, backward, optimizer) finds a frame outside torch.
        hook.reset(False)
        hook.locate_lines(True, str(Path(torch.__file__).parent))
        with marker:
            _steps(model, optimizer, 1)
        located, last = hook.lines_located()
        hook.locate_lines(False, "")
        print(f"lines found for {located} of {hook.seen()[0]} ops of a step (the last at line {last} of this script)")
        # A planted overflow: the first non-finite output, against the full trace's first producer.
        torch.manual_seed(3)
        model, optimizer = _small()
        hook.reset(False)
        with marker:
            _steps(model, optimizer, 3, bad=3)
        _ops, _checked, first, first_name, _largest = hook.seen()
        torch.manual_seed(3)
        model, optimizer = _small()
        with dtypecheck.trace(model) as traced:
            _steps(model, optimizer, 3, bad=3)
        event = traced.report.first
        print(
            f"input x 1e38 at step 3: hooked first non-finite output at op {first} ({first_name}); "
            f"full trace: {event.op if event else None} at op {event.op_index if event else None}"
        )
        # Timing: blocks of steps, plain against each, alternating in this process.
        model, optimizer = _small()
        _steps(model, optimizer, 10)
        ratios: dict[str, list[float]] = {
            "hooked": [],
            "hooked, each op's line found": [],
            "empty Python mode": [],
            "full trace": [],
        }
        root = str(Path(torch.__file__).parent)
        for repeat in range(args.repeats):
            start = time.process_time()
            _steps(model, optimizer, args.steps)
            plain_s = time.process_time() - start
            for name, mode in (
                ("hooked", marker),
                ("hooked, each op's line found", marker),
                ("empty Python mode", empty),
            ):
                hook.locate_lines(name.startswith("hooked,"), root)
                start = time.process_time()
                with mode:
                    _steps(model, optimizer, args.steps)
                ratios[name].append((time.process_time() - start) / plain_s)
            hook.locate_lines(False, root)
            if repeat < args.full_repeats:
                start = time.process_time()
                with dtypecheck.trace(model):
                    _steps(model, optimizer, args.steps)
                ratios["full trace"].append((time.process_time() - start) / plain_s)
        for name, values in ratios.items():
            print(f"{name}: median {statistics.median(values):.3f}x over {len(values)} blocks of {args.steps} steps")


if __name__ == "__main__":
    main()
