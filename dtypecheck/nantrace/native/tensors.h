// What both C++ modules read of a tensor: whether its memory can be read directly, and one pass over it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace dtypecheck {

// A CPU tensor these modules read directly, as its bytes: dense, contiguous, plain storage (no subclass) that holds
// every element. Zero tensors (autograd's unmaterialised zeros) and nested tensors have no plain buffer to read; FSDP
// frees a parameter's storage (resize to 0) without touching its tensor, and a storage shrunk under a tensor would
// be read past its end; a conjugated or negated view's bits are not its values. Read with the TensorImpl's own
// accessors, where the Tensor's go through out-of-line checks a call: watch mode checks or copies ~650 tensors a
// step (each parameter and optimizer state twice, each gradient once), and those checks and ``const_data_ptr`` were
// a third of its instructions.
struct Plain {
  const char* data = nullptr;
  size_t nbytes = 0;
  at::ScalarType type = at::kByte;
};

inline bool plain_of(const at::Tensor& t, Plain* out) {
  if (!t.defined()) return false;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->is_cpu() || impl->layout() != c10::kStrided || impl->is_nested() || impl->is_conj() || impl->is_neg()) {
    return false;
  }
  const auto keys = impl->key_set();
  if (keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::ZeroTensor) || !impl->has_storage()) {
    return false;
  }
  if (!impl->is_contiguous()) return false;
  const auto& storage = impl->storage();
  const size_t item = impl->itemsize();
  const size_t begin = static_cast<size_t>(impl->storage_offset()) * item;
  const size_t bytes = static_cast<size_t>(impl->numel()) * item;
  if (storage.nbytes() < begin + bytes) return false;
  const char* base = static_cast<const char*>(storage.data());
  if (base == nullptr && bytes != 0) return false;
  out->data = base == nullptr ? nullptr : base + begin;
  out->nbytes = bytes;
  out->type = c10::typeMetaToScalarType(impl->dtype());
  return true;
}

// A tensor's lowest and highest values as ``aminmax`` gives them (both NaN where one value is NaN) and how many
// magnitudes are below ``tiny`` (zeros included, NaN not).
struct Extremes {
  double lo, hi;
  int64_t small;
};

// Each floating format's bits as an unsigned integer of its width (``U``), the signed integer of that width that
// orders them (``S``), the mask of a magnitude's bits and infinity's bits.
template <typename T, typename Unsigned, typename Signed, Unsigned Abs, Unsigned Inf>
struct Bits {
  using U = Unsigned;
  using S = Signed;
  static constexpr U kAbs = Abs, kInf = Inf;
  static double value(U bits) {
    T v;
    std::memcpy(&v, &bits, sizeof v);
    return static_cast<double>(v);
  }
  static U bits(double v) {
    const T t = static_cast<T>(v);
    U b;
    std::memcpy(&b, &t, sizeof b);
    return b;
  }
};
template <typename T>
struct Format;
template <>
struct Format<float> : Bits<float, uint32_t, int32_t, 0x7fffffffu, 0x7f800000u> {};
template <>
struct Format<double> : Bits<double, uint64_t, int64_t, 0x7fffffffffffffffull, 0x7ff0000000000000ull> {};
template <>
struct Format<at::Half> : Bits<at::Half, uint16_t, int16_t, 0x7fff, 0x7c00> {};
template <>
struct Format<at::BFloat16> : Bits<at::BFloat16, uint16_t, int16_t, 0x7fff, 0x7f80> {};

// The smallest magnitude's bits whose value is >= ``tiny`` (> 0): ``|v| < tiny`` exactly where ``|v|``'s bits are
// below it, NaN never (its bits are above infinity's, which is >= every finite ``tiny``).
template <typename T>
typename Format<T>::U below_bits(double tiny) {
  using F = Format<T>;
  typename F::U b = F::bits(tiny) & F::kAbs;
  while (b < F::kInf && F::value(b) < tiny) ++b;
  while (b > 0 && F::value(static_cast<typename F::U>(b - 1)) >= tiny) --b;
  return b;
}

// Where the compiler can, the loop is also built for AVX2 and the CPU picks at load time: its integer min/max are
// one instruction each there, where baseline x86-64 emulates them (about 4x slower on this loop).
#if defined(__x86_64__) && defined(__GLIBC__) && (defined(__GNUC__) || defined(__clang__))
#define DTYPECHECK_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DTYPECHECK_CLONES
#endif

// One pass over the values' bits as integers (no float compare, so the loop vectorises without fast-math):
// the sign-magnitude bits are mapped to integers in the values' order (-inf < ... < -0 < +0 < ... < inf), so
// their min and max are the values' (the sign of a zero extreme may differ from aminmax's: callers take magnitudes);
// a NaN is a magnitude above infinity's; the count only where ``Small``. ``n`` > 0.
template <typename T, bool Small>
DTYPECHECK_CLONES Extremes scan(const T* values, int64_t n, typename Format<T>::U below) {
  using F = Format<T>;
  using U = typename F::U;
  using S = typename F::S;
  const U* p = reinterpret_cast<const U*>(values);
  auto key = [](U b) {
    const S s = static_cast<S>(b);
    return s >= 0 ? s : static_cast<S>(s ^ static_cast<S>(F::kAbs));
  };
  S lo = key(p[0]);
  S hi = lo;
  U nan = 0;
  int64_t small = 0;
  for (int64_t start = 0; start < n; start += 4096) {  // the count in blocks whose sum fits its lanes
    const int64_t end = n - start > 4096 ? start + 4096 : n;
    uint32_t count = 0;
    for (int64_t i = start; i < end; ++i) {
      const U b = p[i];
      const U a = b & F::kAbs;
      nan |= a > F::kInf;
      const S k = key(b);
      lo = k < lo ? k : lo;
      hi = k > hi ? k : hi;
      if constexpr (Small) count += a < below;
    }
    small += count;
  }
  if (nan) return {NAN, NAN, small};
  return {F::value(static_cast<U>(key(static_cast<U>(lo)))), F::value(static_cast<U>(key(static_cast<U>(hi)))), small};
}

template <typename T>
Extremes scan_of(const Plain& t, double tiny) {
  const T* p = reinterpret_cast<const T*>(t.data);
  const auto n = static_cast<int64_t>(t.nbytes / sizeof(T));
  if (tiny > 0) return scan<T, true>(p, n, below_bits<T>(tiny));
  return scan<T, false>(p, n, 0);
}

// ``scan`` of a non-empty floating tensor's bytes (false for another dtype: float8 formats and the like); ``tiny`` 0
// counts nothing.
inline bool extremes_of(const Plain& t, double tiny, Extremes* out) {
  switch (t.type) {
    case at::kFloat: *out = scan_of<float>(t, tiny); return true;
    case at::kDouble: *out = scan_of<double>(t, tiny); return true;
    case at::kHalf: *out = scan_of<at::Half>(t, tiny); return true;
    case at::kBFloat16: *out = scan_of<at::BFloat16>(t, tiny); return true;
    default: return false;
  }
}

}  // namespace dtypecheck
