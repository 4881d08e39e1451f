// The AdaComp pass for AVX-512 (F/BW/VL/DQ): see common/adacomp_kernel.cc for the
// algorithm; bit-identical to the AVX2 and portable passes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/adacomp_kernel_internal.h"

#if ADAPS_X86
#include <immintrin.h>

namespace adaps {
namespace internal {
namespace {
// ---- AVX-512 ----------------------------------------------------------------------------

// GCC 12's AVX-512 headers seed results with _mm512_undefined_*(), which trips
// -Wmaybe-uninitialized in intrinsics that use it; the warning is not about this code.
// Clang has no such warning (and warns about the unknown name), hence GCC only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

ADAPS_TARGET_AVX512 inline uint32_t HMaxU32x16(__m512i v) {
  const __m256i m = _mm256_max_epu32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  __m128i x = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  x = _mm_max_epu32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm_max_epu32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(x));
}

inline __mmask16 FirstLanes16(uint64_t k) { return static_cast<__mmask16>((1u << k) - 1u); }

template <bool kStream>
ADAPS_TARGET_AVX512 void StreamAvx512(const float* g, const float* in, float* out, uint64_t a,
                                      uint64_t e) {
  const uint64_t aligned = std::min(e, AlignUpIndex(out, a));
  if (a < aligned) {
    const __mmask16 m = FirstLanes16(aligned - a);
    _mm512_mask_storeu_ps(out + a, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, in + a),
                                        _mm512_maskz_loadu_ps(m, g + a)));
    a = aligned;
  }
  for (; a + 16 <= e; a += 16) {
    const __m512 v = _mm512_add_ps(_mm512_loadu_ps(in + a), _mm512_loadu_ps(g + a));
    if (kStream) {
      _mm512_stream_ps(out + a, v);
    } else {
      _mm512_store_ps(out + a, v);
    }
  }
  if (a < e) {
    const __mmask16 m = FirstLanes16(e - a);
    _mm512_mask_storeu_ps(out + a, m,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, in + a),
                                        _mm512_maskz_loadu_ps(m, g + a)));
  }
}

}  // namespace

template <bool kStream>
ADAPS_TARGET_AVX512 bool PassAvx512(const float* g, const float* in, float* out, uint32_t n,
                                    uint32_t t, float* gmax, Sink& s) {
  const __m512i abs_mask = _mm512_set1_epi32(static_cast<int>(kAbsBits));
  const __m512i lane_ids =
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 zero = _mm512_setzero_ps();
  const uint64_t round_bins = std::max<uint64_t>(1, kRoundElements / t);
  // Every bin but the last has length t: its tail mask is the same for all of them.
  const uint64_t full_len = t & ~uint64_t{15};
  const __mmask16 full_tail = FirstLanes16(t & 15u);
  uint64_t streamed = 0, lo = 0;
  uint32_t b = 0;
  while (lo < n) {
    const uint64_t round_hi = std::min<uint64_t>(n, lo + round_bins * t);
    const uint64_t target = std::min<uint64_t>(n, AlignUpIndex(out, round_hi));
    if (target > streamed) {
      StreamAvx512<kStream>(g, in, out, streamed, target);
      streamed = target;
    }
    s.Ensure(round_hi - lo + 16);
    for (; lo < round_hi; lo += t, ++b) {
      uint64_t hi = lo + t, full = lo + full_len;
      __mmask16 tail = full_tail;
      if (hi > n) {
        hi = n;
        full = lo + ((hi - lo) & ~uint64_t{15});
        tail = FirstLanes16((hi - lo) & 15u);
      }
      __m512i mx = _mm512_setzero_si512();
      uint64_t i = lo;
      for (; i < full; i += 16) {
        if (kStream && i + kRoundElements < n) {
          _mm_prefetch(reinterpret_cast<const char*>(in + i + kRoundElements), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(g + i + kRoundElements), _MM_HINT_T0);
        }
        const __m512 v = _mm512_add_ps(_mm512_loadu_ps(in + i), _mm512_loadu_ps(g + i));
        mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_castps_si512(v), abs_mask));
      }
      if (tail) {
        const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(tail, in + i),
                                       _mm512_maskz_loadu_ps(tail, g + i));
        mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_castps_si512(v), abs_mask));
      }
      const uint32_t mb = HMaxU32x16(mx);
      if (mb >= kInfBits) return false;
      gmax[b] = BitsToFloat(mb);
      if (mb == 0) continue;
      const __m512 thr = _mm512_set1_ps(BitsToFloat(mb));
      uint32_t* idx = s.idx;
      size_t cnt = s.cnt;
      for (i = lo; i < hi; i += 16) {
        const __mmask16 lanes = i < full ? static_cast<__mmask16>(0xffff) : tail;
        const __m512 gv = _mm512_maskz_loadu_ps(lanes, g + i);
        const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, in + i), gv);
        const __m512 h = _mm512_abs_ps(_mm512_add_ps(v, gv));
        // Masked-off lanes are +0: v != 0 fails, never selected.
        const __mmask16 sel = _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(v, zero, _CMP_NEQ_OQ),
                                                      h, thr, _CMP_GE_OQ);
        const __m512i ids = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(i)), lane_ids);
        _mm512_storeu_si512(idx + cnt, _mm512_maskz_compress_epi32(sel, ids));
        cnt += static_cast<size_t>(_mm_popcnt_u32(sel));
      }
      s.cnt = cnt;
    }
  }
  return true;
}
template bool PassAvx512<true>(const float*, const float*, float*, uint32_t, uint32_t, float*,
                               Sink&);
template bool PassAvx512<false>(const float*, const float*, float*, uint32_t, uint32_t, float*,
                                Sink&);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif


}  // namespace internal
}  // namespace adaps

#endif  // ADAPS_X86
