// Internals of the AdaComp pass (common/adacomp_kernel.cc): the constants, bit helpers and
// the index sink shared by its per-ISA implementations, and the AVX-512 pass, which lives in
// its own file (adacomp_kernel_avx512.cc). Not part of the public interface.
#ifndef ADAPS_COMMON_ADACOMP_KERNEL_INTERNAL_H_
#define ADAPS_COMMON_ADACOMP_KERNEL_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/compressor.h"

#if defined(__x86_64__) || defined(__i386__)
#define ADAPS_X86 1
#else
#define ADAPS_X86 0
#endif

namespace adaps {
namespace internal {

inline constexpr uint32_t kAbsBits = 0x7fffffffu;
inline constexpr uint32_t kInfBits = 0x7f800000u;  // |x| bits >= this: NaN or Inf
// Elements per round (16 KiB of in + g): whole bins, at least one.
inline constexpr uint64_t kRoundElements = 2048;
// Streaming (non-temporal) stores from this slice length on (kAuto). Measured on 25M floats
// cut into 250k-element slices (1 MB per buffer): streaming 1.4x faster than normal stores,
// as for one 25M slice. Below 64k elements (256 KB per buffer) the three arrays fit in L2 and
// a normal store keeps the new residue cached for the fix-up and the next step.
inline constexpr size_t kStreamMinElements = size_t{1} << 16;

inline float BitsToFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline uint32_t FloatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The selected indices, written through a raw pointer into `out.indices` (grown ahead of
// each round by the most a round can select, plus a vector's worth of slack for the
// full-width stores of the SIMD paths). The signs are not collected here: the fix-up reads
// every selected residue anyway, and sign(G[i]) is the sign of that value.
struct Sink {
  explicit Sink(CompressedUpdate& o) : out(o) {}
  void Ensure(size_t room) {
    if (out.indices.size() < cnt + room) {
      out.indices.resize(cnt + room);
      idx = out.indices.data();
    }
  }
  void Finish() { out.indices.resize(cnt); }
  CompressedUpdate& out;
  size_t cnt = 0;
  uint32_t* idx = nullptr;
};

// Index of the first element at or after `i` whose address in `p` is 64-byte aligned.
inline uint64_t AlignUpIndex(const float* p, uint64_t i) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p + i);
  return i + ((64 - (a & 63)) & 63) / sizeof(float);
}

#if ADAPS_X86
#define ADAPS_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,bmi,bmi2,popcnt")))
// The AVX-512 pass (adacomp_kernel_avx512.cc), instantiated for both store modes.
template <bool kStream>
ADAPS_TARGET_AVX512 bool PassAvx512(const float* g, const float* in, float* out, uint32_t n, uint32_t t,
                float* gmax, Sink& s);
#endif

}  // namespace internal
}  // namespace adaps

#endif  // ADAPS_COMMON_ADACOMP_KERNEL_INTERNAL_H_
