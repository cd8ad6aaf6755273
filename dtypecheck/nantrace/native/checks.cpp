// Watch mode's per-step checks in one call each: no per-tensor dispatch, no in-place write.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <c10/util/Half.h>
#include <c10/util/BFloat16.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/utils/pybind.h>

#include "tensors.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace {

// Whether every value of a tensor's bytes (``plain_of``) in a format ``tensors.h`` knows is finite. A value is
// non-finite exactly when its magnitude's bits are at or above infinity's (inf and every NaN), so the largest
// magnitude, as a signed integer of the format's width (a magnitude's top bit is clear), answers for all of them: one
// AND and one max a value, which the compiler vectorises, and which is built for AVX2 too where the CPU has it (as
// ``scan`` is; a compare and an OR a value, SSE2 only, cost twice the instructions: watch mode's largest per-step
// cost).
template <typename T>
DTYPECHECK_CLONES bool format_finite_bits(const typename dtypecheck::Format<T>::U* p, int64_t n) {
  using F = dtypecheck::Format<T>;
  using S = typename F::S;
  S most = 0;
  for (int64_t i = 0; i < n; ++i) {
    const S magnitude = static_cast<S>(p[i] & F::kAbs);
    most = magnitude > most ? magnitude : most;
  }
  return most < static_cast<S>(F::kInf);
}

template <typename T>
bool format_finite(const dtypecheck::Plain& p) {
  using U = typename dtypecheck::Format<T>::U;
  return format_finite_bits<T>(reinterpret_cast<const U*>(p.data), static_cast<int64_t>(p.nbytes / sizeof(U)));
}

// 1: every floating value of ``t`` finite; 0: one is not; -1: a tensor this module cannot read (the caller checks
// them all with torch instead). Integer and bool tensors are finite.
int finite_of(const at::Tensor& t) {
  dtypecheck::Plain p;
  if (!dtypecheck::plain_of(t, &p)) return -1;
  if (p.nbytes == 0 || !at::isFloatingType(p.type)) return 1;
  switch (p.type) {
    case at::kFloat: return format_finite<float>(p);
    case at::kDouble: return format_finite<double>(p);
    case at::kHalf: return format_finite<at::Half>(p);
    case at::kBFloat16: return format_finite<at::BFloat16>(p);
    default: return -1;  // float8 formats and the like: torch knows them
  }
}

// ``finite_of`` of them all, in one pass: 0 as soon as one is not finite (that answer holds whatever the rest are),
// -1 as soon as one cannot be read.
int all_finite(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    const int found = finite_of(t);
    if (found != 1) return found;
  }
  return 1;
}

// The full trace's check of one op output (``Tracer._check``) where the per-op path does not take the op: (lowest,
// highest, count) as Python floats and an int, read in one pass (``tensors.h``); None for a tensor this module does
// not read (the caller uses torch). As ``aminmax``: a NaN anywhere makes both extremes NaN. ``count`` counts values
// whose magnitude is below ``tiny`` (zeros included, NaN not), or is 0 when ``tiny`` is 0.
pybind11::object extrema(const at::Tensor& t, double tiny) {
  dtypecheck::Extremes e;
  dtypecheck::Plain p;
  if (!dtypecheck::plain_of(t, &p) || p.nbytes == 0 || !dtypecheck::extremes_of(p, tiny, &e)) return pybind11::none();
  return pybind11::make_tuple(e.lo, e.hi, e.small);
}

// The tensors of a layout that is checked or copied every step (an optimizer's parameters and states), held on
// this side: a call passes no list, where converting ~200 tensors from Python cost as much as reading them.
struct Group {
  std::vector<at::Tensor> tensors;

  explicit Group(std::vector<at::Tensor> held) : tensors(std::move(held)) {}

  int finite() const { return all_finite(tensors); }

  // The gradients of these tensors (parameters) that are there, as ``all_finite`` answers for them.
  int grads_finite() const {
    for (const auto& t : tensors) {
      const auto& grad = t.grad();
      if (!grad.defined()) continue;
      const int found = finite_of(grad);
      if (found != 1) return found;
    }
    return 1;
  }
};

constexpr size_t kLine = 64;

// Copy ``bytes`` to a line-aligned ``out`` whose lines nothing else writes: the whole lines with stores that bypass
// the cache (a line is written whole, so none is read first), the last partial line through it.
void copy_lines(char* out, const char* data, size_t bytes) {
#if defined(__SSE2__)
  const size_t whole = bytes & ~(kLine - 1);
  for (size_t i = 0; i < whole; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + i)));
  }
  std::memcpy(out + whole, data + whole, bytes - whole);
#else
  std::memcpy(out, data, bytes);
#endif
}

// A snapshot of a layout's tensors in one allocation (``flat``, bytes), each tensor at its own line-aligned offset.
// Copied through the cache, the ~160 KiB of benchmarks/bench_watch.py's small model cost 33 us a step inside the
// training loop (7 us alone): each line written was read first, and evicted a line the step was using. Streamed
// into ~200 separate small tensors it cost more (a partial line streamed is slow). Streamed line by line into one
// allocation, what is written is whole lines in order.
struct Snapshot {
  std::vector<at::Tensor> sources;
  at::Tensor flat;
  std::vector<size_t> offsets;
  std::vector<size_t> sizes;
  std::vector<at::ScalarType> types;

  Snapshot(std::vector<at::Tensor> held, at::Tensor into, std::vector<size_t> at)
      : sources(std::move(held)), flat(std::move(into)), offsets(std::move(at)) {
    TORCH_CHECK(offsets.size() == sources.size(), "a snapshot needs an offset for each tensor");
    for (size_t i = 0; i < sources.size(); ++i) {
      sizes.push_back(sources[i].nbytes());
      types.push_back(sources[i].scalar_type());
      TORCH_CHECK(offsets[i] % kLine == 0 && (i == 0 || offsets[i] >= offsets[i - 1] + sizes[i - 1]),
                  "snapshot offsets must be line-aligned and apart");
    }
    TORCH_CHECK(flat.scalar_type() == at::kByte && flat.dim() == 1 &&
                    (sources.empty() || static_cast<size_t>(flat.numel()) >= offsets.back() + sizes.back()),
                "a snapshot's allocation must be bytes that hold every tensor");
  }

  // Copy every source into its place; false when one can no longer be read (``plain_of``) or changed its dtype or
  // size (some may have been copied: the caller copies them all with torch instead).
  bool take() const {
    dtypecheck::Plain into;
    if (!dtypecheck::plain_of(flat, &into) || (reinterpret_cast<uintptr_t>(into.data) & (kLine - 1)) != 0) return false;
    auto* base = static_cast<char*>(flat.mutable_data_ptr());
    bool streamed = false;
    dtypecheck::Plain p;
    for (size_t i = 0; i < sources.size(); ++i) {
      if (!dtypecheck::plain_of(sources[i], &p) || p.type != types[i] || p.nbytes != sizes[i]) {
#if defined(__SSE2__)
        if (streamed) _mm_sfence();
#endif
        return false;
      }
      if (!sizes[i]) continue;
      copy_lines(base + offsets[i], p.data, sizes[i]);
      streamed = streamed || sizes[i] >= kLine;
    }
#if defined(__SSE2__)
    if (streamed) _mm_sfence();
#endif
    return true;
  }
};

// The gradient backward sends into one output of a node (summed over backward passes), kept for a replay.
struct KeptGrad {
  mutable std::mutex lock;
  at::Tensor grad;

  pybind11::object get() const {
    std::lock_guard<std::mutex> guard(lock);
    if (!grad.defined()) return pybind11::none();
    return pybind11::cast(grad);
  }

  // The kept gradient's bytes (0 before any): asked each step, without a Python tensor made for it.
  int64_t nbytes() const {
    std::lock_guard<std::mutex> guard(lock);
    return grad.defined() ? static_cast<int64_t>(grad.nbytes()) : 0;
  }
};

// A pre-hook of the node that made a model call's output: where watch mode's Python hook made the engine take the
// GIL and wrap the node's gradients in a tuple at every step's backward (with its registration, ~27 us a step on
// benchmarks/bench_watch.py's small model), this one keeps the tensor on the engine's thread.
struct KeepGrad : torch::autograd::FunctionPreHook {
  std::shared_ptr<KeptGrad> kept;
  size_t output_nr;

  KeepGrad(std::shared_ptr<KeptGrad> into, size_t nr) : kept(std::move(into)), output_nr(nr) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (output_nr < grads.size() && grads[output_nr].defined()) {
      std::lock_guard<std::mutex> guard(kept->lock);
      kept->grad = kept->grad.defined() ? at::add(kept->grad, grads[output_nr]) : grads[output_nr];
    }
    return grads;
  }

  // Compiled autograd asks each hook for this; the caller registers this hook only where it is off, and a backward
  // compiled anyway runs without it (no gradient is kept, and the replay runs no backward) instead of failing.
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const override {}
};

// Keep the gradient backward sends into ``tensor`` (made by a node: ``grad_fn`` set): the holder, or None when the
// tensor has no node.
pybind11::object keep_grad(const at::Tensor& tensor) {
  const auto& node = tensor.grad_fn();
  if (!node) return pybind11::none();
  auto kept = std::make_shared<KeptGrad>();
  node->add_pre_hook(std::make_unique<KeepGrad>(kept, static_cast<size_t>(tensor.output_nr())));
  return pybind11::cast(kept);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("all_finite", &all_finite);
  m.def("extrema", &extrema);
  pybind11::class_<Group>(m, "Group")
      .def(pybind11::init<std::vector<at::Tensor>>())
      .def("finite", &Group::finite)
      .def("grads_finite", &Group::grads_finite);
  pybind11::class_<KeptGrad, std::shared_ptr<KeptGrad>>(m, "KeptGrad")
      .def_property_readonly("grad", &KeptGrad::get)
      .def_property_readonly("nbytes", &KeptGrad::nbytes);
  m.def("keep_grad", &keep_grad);
  pybind11::class_<Snapshot>(m, "Snapshot")
      .def(pybind11::init<std::vector<at::Tensor>, at::Tensor, std::vector<size_t>>())
      .def("take", &Snapshot::take);
}
