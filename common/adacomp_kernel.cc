// The AdaComp fast path (DESIGN.md section 1, 'Cost'): one streaming pass over the residue
// and the gradient, bin by bin. For each bin it adds the gradient into the residue and takes
// the bin maximum, then, while the bin is still in L1, selects the elements whose soft
// threshold |G + g| reaches that maximum. Once all bins are done the scale is known and a
// sparse fix-up subtracts it from the selected residues. No sort, no sampling.
//
// The AVX2 version is chosen at run time. Both versions produce bit-identical results: the
// only floating-point operations are one add per element, one more add for H, comparisons
// and maxima, which do not depend on order; the scale is a sequential double sum done by
// shared code.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/compressor.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ADAPS_X86 1
#else
#define ADAPS_X86 0
#endif

namespace adaps {
namespace internal {
namespace {

inline void Select(uint32_t i, float g, CompressedUpdate& out) {
  out.indices.push_back(i);
  out.negative.push_back(g < 0.0f ? 1 : 0);
}

// One bin, portable. Returns the bin maximum.
inline float BinPortable(const float* g, float* r, uint32_t lo, uint32_t hi,
                         CompressedUpdate& out) {
  float m = 0.0f;
  for (uint32_t i = lo; i < hi; ++i) {
    const float v = r[i] + g[i];
    r[i] = v;
    const float a = std::fabs(v);
    m = a > m ? a : m;
  }
  if (m > 0.0f) {
    for (uint32_t i = lo; i < hi; ++i) {
      const float v = r[i];
      if (v != 0.0f && std::fabs(v + g[i]) >= m) Select(i, v, out);
    }
  }
  return m;
}

void PassPortable(const float* g, float* r, uint32_t n, uint32_t t, float* gmax,
                  CompressedUpdate& out) {
  uint32_t b = 0;
  for (uint32_t lo = 0; lo < n; lo += t, ++b) {
    const uint32_t hi = (n - lo > t) ? lo + t : n;
    gmax[b] = BinPortable(g, r, lo, hi, out);
  }
}

#if ADAPS_X86
__attribute__((target("avx2"))) inline float HorizontalMax(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 m = _mm_max_ps(lo, hi);
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

__attribute__((target("avx2,bmi"))) void PassAvx2(const float* g, float* r, uint32_t n,
                                                  uint32_t t, float* gmax,
                                                  CompressedUpdate& out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 zero = _mm256_setzero_ps();
  uint32_t b = 0;
  for (uint32_t lo = 0; lo < n; lo += t, ++b) {
    const uint32_t hi = (n - lo > t) ? lo + t : n;
    const uint32_t vec_end = lo + ((hi - lo) & ~7u);
    __m256 mv = zero;
    uint32_t i = lo;
    for (; i < vec_end; i += 8) {
      const __m256 v = _mm256_add_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(g + i));
      _mm256_storeu_ps(r + i, v);
      mv = _mm256_max_ps(mv, _mm256_and_ps(v, abs_mask));
    }
    float m = HorizontalMax(mv);
    for (; i < hi; ++i) {
      const float v = r[i] + g[i];
      r[i] = v;
      const float a = std::fabs(v);
      m = a > m ? a : m;
    }
    gmax[b] = m;
    if (!(m > 0.0f)) continue;
    const __m256 thr = _mm256_set1_ps(m);
    for (i = lo; i < vec_end; i += 8) {
      const __m256 v = _mm256_loadu_ps(r + i);
      const __m256 h = _mm256_and_ps(_mm256_add_ps(v, _mm256_loadu_ps(g + i)), abs_mask);
      const __m256 sel = _mm256_and_ps(_mm256_cmp_ps(h, thr, _CMP_GE_OQ),
                                       _mm256_cmp_ps(v, zero, _CMP_NEQ_OQ));
      unsigned bits = static_cast<unsigned>(_mm256_movemask_ps(sel));
      while (bits) {
        const unsigned k = static_cast<unsigned>(__builtin_ctz(bits));
        Select(i + k, r[i + k], out);
        bits &= bits - 1;
      }
    }
    for (; i < hi; ++i) {
      const float v = r[i];
      if (v != 0.0f && std::fabs(v + g[i]) >= m) Select(i, v, out);
    }
  }
}

__attribute__((target("avx2"))) bool AllFiniteAvx2(const float* x, size_t n) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  size_t i = 0;
  while (i + 8 <= n) {
    // Check blocks of up to 1024 elements, then stop early if one was bad.
    const size_t block_end = std::min(n & ~size_t{7}, i + 1024);
    __m256i bad = _mm256_setzero_si256();
    for (; i < block_end; i += 8) {
      const __m256i e = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)),
                                         exp_mask);
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, exp_mask));
    }
    if (!_mm256_testz_si256(bad, bad)) return false;
  }
  for (; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

bool CpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi");
  return has;
}
#endif

}  // namespace

bool AdaCompHasAvx2() {
#if ADAPS_X86
  return CpuHasAvx2();
#else
  return false;
#endif
}

void AdaCompCompressFinite(absl::Span<const float> grad, absl::Span<float> residue,
                           uint32_t bin_size, std::vector<float>& gmax_scratch,
                           CompressedUpdate& out, bool force_portable) {
  const uint32_t n = static_cast<uint32_t>(grad.size());
  const uint32_t t = bin_size;
  const uint32_t nb = n == 0 ? 0 : (n - 1) / t + 1;
  out.Clear();
  out.kind = CompressorKind::kAdaComp;
  out.length = n;
  out.bin_size = t;
  if (n == 0) return;
  gmax_scratch.resize(nb);
  // Typical AdaComp density is well under 1%; reserving avoids regrowth in the hot loop.
  out.indices.reserve(n / 64 + 16);
  out.negative.reserve(n / 64 + 16);

#if ADAPS_X86
  if (!force_portable && CpuHasAvx2()) {
    PassAvx2(grad.data(), residue.data(), n, t, gmax_scratch.data(), out);
  } else {
    PassPortable(grad.data(), residue.data(), n, t, gmax_scratch.data(), out);
  }
#else
  (void)force_portable;
  PassPortable(grad.data(), residue.data(), n, t, gmax_scratch.data(), out);
#endif

  double sum = 0.0;
  for (uint32_t b = 0; b < nb; ++b) sum += gmax_scratch[b];
  const float s = static_cast<float>(sum / static_cast<double>(nb));
  out.scale = s;
  if (!std::isfinite(s)) return;  // overflow: the caller reports it; no fix-up, no NaN.
  float* r = residue.data();
  for (size_t j = 0; j < out.indices.size(); ++j) {
    const uint32_t i = out.indices[j];
    r[i] = out.negative[j] ? r[i] + s : r[i] - s;
  }
}

}  // namespace internal

bool AllFinite(absl::Span<const float> values) {
#if ADAPS_X86
  if (internal::CpuHasAvx2()) return internal::AllFiniteAvx2(values.data(), values.size());
#endif
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

}  // namespace adaps
