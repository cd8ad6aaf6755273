// What both C++ modules read of a tensor: whether its memory can be read directly, and one pass over it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>

namespace dtypecheck {

// Whether a CPU tensor is one these modules read directly: dense, contiguous, plain storage (no subclass) that holds
// every element. Zero tensors (autograd's unmaterialised zeros) and nested tensors have no plain buffer to read; FSDP
// frees a parameter's storage (resize to 0) without touching its tensor, and a storage shrunk under a tensor would
// be read past its end.
inline bool readable(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != c10::kStrided || t.is_nested()) return false;
  const auto keys = t.key_set();
  if (keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::ZeroTensor) || !t.has_storage()) return false;
  if (!t.is_contiguous()) return false;
  if (t.numel() == 0) return true;
  const size_t needed = static_cast<size_t>(t.storage_offset() + t.numel()) * t.itemsize();
  return t.const_data_ptr() != nullptr && t.storage().nbytes() >= needed;
}

// A tensor's lowest and highest values as ``aminmax`` gives them (both NaN where one value is NaN) and how many
// magnitudes are below ``tiny`` (zeros included, NaN not).
struct Extremes {
  double lo, hi;
  int64_t small;
};

// One pass, in float for float, half and bfloat16 (float holds each of their values exactly; a plain loop the
// compiler vectorises) and in double for double; the count only where ``Small``.
template <typename T, typename V, bool Small>
Extremes scan(const T* p, int64_t n, V tiny) {
  V lo = static_cast<V>(p[0]);
  V hi = lo;
  bool nan = false;
  int64_t small = 0;
  for (int64_t i = 0; i < n; ++i) {
    const V v = static_cast<V>(p[i]);
    nan |= v != v;
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    if constexpr (Small) small += std::fabs(v) < tiny;
  }
  if (nan) return {NAN, NAN, small};
  return {static_cast<double>(lo), static_cast<double>(hi), small};
}

// ``scan`` of a readable, non-empty floating tensor (false for another dtype: float8 formats and the like); ``tiny``
// 0 counts nothing.
inline bool extremes_of(const at::Tensor& t, double tiny, Extremes* out) {
  const int64_t n = t.numel();
  const float small = static_cast<float>(tiny);
  switch (t.scalar_type()) {
    case at::kFloat:
      *out = tiny > 0 ? scan<float, float, true>(t.const_data_ptr<float>(), n, small)
                      : scan<float, float, false>(t.const_data_ptr<float>(), n, small);
      return true;
    case at::kDouble:
      *out = tiny > 0 ? scan<double, double, true>(t.const_data_ptr<double>(), n, tiny)
                      : scan<double, double, false>(t.const_data_ptr<double>(), n, tiny);
      return true;
    case at::kHalf: *out = scan<at::Half, float, true>(t.const_data_ptr<at::Half>(), n, small); return true;
    case at::kBFloat16: *out = scan<at::BFloat16, float, true>(t.const_data_ptr<at::BFloat16>(), n, small); return true;
    default: return false;
  }
}

}  // namespace dtypecheck
