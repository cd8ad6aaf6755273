// Watch mode's per-step checks in one call each: no per-tensor dispatch, no in-place write.
#include <ATen/core/Tensor.h>
#include <c10/util/Half.h>
#include <c10/util/BFloat16.h>
#include <torch/csrc/utils/pybind.h>

#include "tensors.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace {

using dtypecheck::readable;

// Whether every value of a readable tensor of a format ``tensors.h`` knows is finite. A value is non-finite exactly
// when its magnitude's bits are at or above infinity's (inf and every NaN), so the largest magnitude, as a signed
// integer of the format's width (a magnitude's top bit is clear), answers for all of them: one AND and one max a
// value, which the compiler vectorises, and which is built for AVX2 too where the CPU has it (as ``scan`` is; a
// compare and an OR a value, SSE2 only, cost twice the instructions: watch mode's largest per-step cost).
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
bool format_finite(const at::Tensor& t) {
  return format_finite_bits<T>(static_cast<const typename dtypecheck::Format<T>::U*>(t.const_data_ptr()), t.numel());
}

// 1: every floating value finite; 0: one is not; -1: a tensor this module cannot read (the caller checks them all
// with torch instead). Integer and bool tensors are finite.
int all_finite(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (!readable(t)) return -1;
  }
  for (const auto& t : tensors) {
    const int64_t n = t.numel();
    if (n == 0 || !at::isFloatingType(t.scalar_type())) continue;
    bool finite;
    switch (t.scalar_type()) {
      case at::kFloat: finite = format_finite<float>(t); break;
      case at::kDouble: finite = format_finite<double>(t); break;
      case at::kHalf: finite = format_finite<at::Half>(t); break;
      case at::kBFloat16: finite = format_finite<at::BFloat16>(t); break;
      default: return -1;  // float8 formats and the like: torch knows them
    }
    if (!finite) return 0;
  }
  return 1;
}

// The full trace's check of one op output (``Tracer._check``) where the per-op path does not take the op: (lowest,
// highest, count) as Python floats and an int, read in one pass (``tensors.h``); None for a tensor this module does
// not read (the caller uses torch). As ``aminmax``: a NaN anywhere makes both extremes NaN. ``count`` counts values
// whose magnitude is below ``tiny`` (zeros included, NaN not), or is 0 when ``tiny`` is 0.
pybind11::object extrema(const at::Tensor& t, double tiny) {
  dtypecheck::Extremes e;
  if (!readable(t) || t.numel() == 0 || !dtypecheck::extremes_of(t, tiny, &e)) return pybind11::none();
  return pybind11::make_tuple(e.lo, e.hi, e.small);
}

// Below this many bytes in all, a snapshot is copied through the cache (``memcpy``): it sits in the caches beside
// the step's own data, and a non-temporal store of a few hundred small tensors ran ~5x slower than ``memcpy`` (45 us
// for the 158 KiB, 200 tensors of benchmarks/bench_watch.py's small model, a sixth of watch mode's cost there).
constexpr size_t kStreamFrom = size_t{1} << 20;

// ``memcpy`` with stores that bypass the cache where the machine has them: a large snapshot is written every step
// and read only by a replay, and writing it through the cache evicted what the training step itself was using.
// The caller fences once after the last copy.
void copy_streaming(void* out, const void* data, size_t bytes) {
#if defined(__SSE2__)
  auto* q = static_cast<char*>(out);
  const auto* p = static_cast<const char*>(data);
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(q) & 15)) & 15;
  if (bytes < 64 || head > bytes) {
    std::memcpy(q, p, bytes);
    return;
  }
  std::memcpy(q, p, head);
  q += head;
  p += head;
  bytes -= head;
  const size_t blocks = bytes / 16;
  for (size_t i = 0; i < blocks; ++i) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(q) + i, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p) + i));
  }
  std::memcpy(q + blocks * 16, p + blocks * 16, bytes - blocks * 16);
#else
  std::memcpy(out, data, bytes);
#endif
}

// Copy each source into its destination (same shape and dtype, both readable); false, copying nothing, when one
// pair is not (the caller copies with torch instead).
bool copy_all(const std::vector<at::Tensor>& destinations, const std::vector<at::Tensor>& sources) {
  if (destinations.size() != sources.size()) return false;
  size_t total = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const auto& d = destinations[i];
    const auto& s = sources[i];
    if (!readable(d) || !readable(s) || d.scalar_type() != s.scalar_type() || d.sizes() != s.sizes()) return false;
    total += s.nbytes();
  }
  const bool stream = total >= kStreamFrom;
  for (size_t i = 0; i < sources.size(); ++i) {
    const size_t bytes = sources[i].nbytes();
    if (!bytes) continue;
    if (stream) {
      copy_streaming(destinations[i].mutable_data_ptr(), sources[i].const_data_ptr(), bytes);
    } else {
      std::memcpy(destinations[i].mutable_data_ptr(), sources[i].const_data_ptr(), bytes);
    }
  }
#if defined(__SSE2__)
  if (stream) _mm_sfence();
#endif
  return true;
}

// The tensors of a layout that is checked or copied every step (an optimizer's parameters and states), held on
// this side: a call passes no list, where converting ~200 tensors from Python cost as much as reading them.
struct Group {
  std::vector<at::Tensor> tensors;

  explicit Group(std::vector<at::Tensor> held) : tensors(std::move(held)) {}

  int finite() const { return all_finite(tensors); }

  // The gradients of these tensors (parameters) that are there, as ``all_finite`` answers for them.
  int grads_finite() const {
    std::vector<at::Tensor> grads;
    grads.reserve(tensors.size());
    for (const auto& t : tensors) {
      const auto& grad = t.grad();
      if (grad.defined()) grads.push_back(grad);
    }
    return all_finite(grads);
  }

  bool copy_from(const Group& sources) { return copy_all(tensors, sources.tensors); }
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("all_finite", &all_finite);
  m.def("extrema", &extrema);
  pybind11::class_<Group>(m, "Group")
      .def(pybind11::init<std::vector<at::Tensor>>())
      .def("finite", &Group::finite)
      .def("grads_finite", &Group::grads_finite)
      .def("copy_from", &Group::copy_from);
}
