// The AdaComp fast path (docs/algorithm.md, 'Cost'): one streaming pass over the residue
// and the gradient, plus a sparse fix-up once the scale is known. No sort, no sampling.
//
// Out of place: the old residue `in` is only read; the new residue G' = in + g goes to a
// second buffer `out` (SliceState keeps two and swaps them on success). That is what lets the
// pass find a NaN/Inf (in g, or an overflow of in + g) while it runs, instead of a separate
// pre-scan: on failure `in` has never been written, so the residue is bit-for-bit untouched.
//
// The pass works in rounds of whole bins (about kRoundElements elements):
//   A. stream out[a, e) = in + g over the round, with non-temporal stores for the full 64-byte
//      lines of `out` when asked (large slices: the new residue is not re-read soon, and a
//      streaming store skips the read-for-ownership a normal store to a cold line costs);
//   B. per bin, with in and g of the round still in L1: recompute v = in[i] + g[i] (the same
//      float add, so bit-identical to what A stored), take the bin maximum of |v| as an
//      unsigned maximum of the bit patterns (equal to the float maximum for finite values,
//      and any NaN/Inf pattern is larger than every finite one: that is the finiteness check),
//      then select the elements with v != 0 and |v + g| >= max, appending indices and signs
//      without a data-dependent branch (vpcompressd on AVX-512, pext/pdep + permute on AVX2).
// After all rounds: sfence (streaming stores), the scale s as a sequential double sum (shared
// code), and the fix-up out[i] -= sign * s over the selected elements, prefetched ahead.
//
// Three implementations, bit-identical: AVX-512 (F/BW/VL/DQ), AVX2 (+BMI1/BMI2/POPCNT) and
// portable; chosen at run time (__builtin_cpu_supports), or forced for tests and benchmarks.
// The only floating-point operations are one add for G', one for H, comparisons and the
// maximum, none of which depends on the evaluation order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/adacomp_kernel_internal.h"
#include "common/compressor.h"

#if ADAPS_X86
#include <immintrin.h>
#endif

namespace adaps {
namespace internal {
namespace {

// ---- portable ---------------------------------------------------------------------------

bool PassPortable(const float* g, const float* in, float* out, uint32_t n, uint32_t t,
                  float* gmax, Sink& s) {
  uint32_t b = 0;
  for (uint64_t lo = 0; lo < n; lo += t, ++b) {
    const uint64_t hi = std::min<uint64_t>(n, lo + t);
    uint32_t mb = 0;
    for (uint64_t i = lo; i < hi; ++i) {
      const float v = in[i] + g[i];
      out[i] = v;
      mb = std::max(mb, FloatBits(v) & kAbsBits);
    }
    if (mb >= kInfBits) return false;
    gmax[b] = BitsToFloat(mb);
    if (mb == 0) continue;
    const float m = BitsToFloat(mb);
    s.Ensure(hi - lo);
    for (uint64_t i = lo; i < hi; ++i) {
      const float v = out[i];
      if (v != 0.0f && std::fabs(v + g[i]) >= m) s.idx[s.cnt++] = static_cast<uint32_t>(i);
    }
  }
  return true;
}

#if ADAPS_X86

// ---- AVX2 -------------------------------------------------------------------------------

#define ADAPS_TARGET_AVX2 __attribute__((target("avx2,bmi,bmi2,popcnt")))

ADAPS_TARGET_AVX2 inline uint32_t HMaxU32(__m256i v) {
  __m128i x = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_max_epu32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm_max_epu32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(x));
}

// Lane mask (all-ones lanes) for the first `k` (0..8) lanes.
ADAPS_TARGET_AVX2 inline __m256i FirstLanes(uint32_t k) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(k)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <bool kStream>
ADAPS_TARGET_AVX2 void StreamAvx2(const float* g, const float* in, float* out, uint64_t a,
                                  uint64_t e) {
  const uint64_t aligned = std::min(e, AlignUpIndex(out, a));
  while (a < aligned) {  // head: up to 15 elements, at most two masked stores
    const uint32_t k = static_cast<uint32_t>(std::min<uint64_t>(8, aligned - a));
    const __m256i m = FirstLanes(k);
    _mm256_maskstore_ps(out + a, m,
                        _mm256_add_ps(_mm256_maskload_ps(in + a, m), _mm256_maskload_ps(g + a, m)));
    a += k;
  }
  for (; a + 16 <= e; a += 16) {
    const __m256 v0 = _mm256_add_ps(_mm256_loadu_ps(in + a), _mm256_loadu_ps(g + a));
    const __m256 v1 = _mm256_add_ps(_mm256_loadu_ps(in + a + 8), _mm256_loadu_ps(g + a + 8));
    if (kStream) {
      _mm256_stream_ps(out + a, v0);
      _mm256_stream_ps(out + a + 8, v1);
    } else {
      _mm256_store_ps(out + a, v0);
      _mm256_store_ps(out + a + 8, v1);
    }
  }
  while (a < e) {
    const uint32_t k = static_cast<uint32_t>(std::min<uint64_t>(8, e - a));
    const __m256i m = FirstLanes(k);
    _mm256_maskstore_ps(out + a, m,
                        _mm256_add_ps(_mm256_maskload_ps(in + a, m), _mm256_maskload_ps(g + a, m)));
    a += k;
  }
}

// Appends lanes of `mask` (8 bits) as indices base+lane; no branch.
ADAPS_TARGET_AVX2 inline size_t Pack8(unsigned mask, uint32_t base, size_t cnt, uint32_t* idx) {
  const uint64_t lanes = _pdep_u64(mask, 0x0101010101010101ull) * 0xff;
  const uint64_t order = _pext_u64(0x0706050403020100ull, lanes);
  const __m256i perm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(order)));
  const __m256i ids = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + cnt),
                      _mm256_permutevar8x32_epi32(ids, perm));
  return cnt + static_cast<size_t>(_mm_popcnt_u32(mask));
}

template <bool kStream>
ADAPS_TARGET_AVX2 bool PassAvx2(const float* g, const float* in, float* out, uint32_t n,
                                uint32_t t, float* gmax, Sink& s) {
  const __m256i abs_mask = _mm256_set1_epi32(static_cast<int>(kAbsBits));
  const __m256 zero = _mm256_setzero_ps();
  const uint64_t round_bins = std::max<uint64_t>(1, kRoundElements / t);
  uint64_t streamed = 0, lo = 0;
  uint32_t b = 0;
  while (lo < n) {
    const uint64_t round_hi = std::min<uint64_t>(n, lo + round_bins * t);
    const uint64_t target = std::min<uint64_t>(n, AlignUpIndex(out, round_hi));
    if (target > streamed) {
      StreamAvx2<kStream>(g, in, out, streamed, target);
      streamed = target;
    }
    s.Ensure(round_hi - lo + 8);
    for (; lo < round_hi; lo += t, ++b) {
      const uint64_t hi = std::min<uint64_t>(n, lo + t);
      const uint64_t full = lo + ((hi - lo) & ~uint64_t{7});
      const uint32_t tail = static_cast<uint32_t>((hi - lo) & 7);
      const __m256i tail_mask = FirstLanes(tail);
      __m256i mx = _mm256_setzero_si256();
      uint64_t i = lo;
      for (; i < full; i += 8) {
        if (kStream && i + kRoundElements < n) {
          _mm_prefetch(reinterpret_cast<const char*>(in + i + kRoundElements), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(g + i + kRoundElements), _MM_HINT_T0);
        }
        const __m256 v = _mm256_add_ps(_mm256_loadu_ps(in + i), _mm256_loadu_ps(g + i));
        mx = _mm256_max_epu32(mx, _mm256_and_si256(_mm256_castps_si256(v), abs_mask));
      }
      if (tail) {
        const __m256 v = _mm256_add_ps(_mm256_maskload_ps(in + i, tail_mask),
                                       _mm256_maskload_ps(g + i, tail_mask));
        mx = _mm256_max_epu32(mx, _mm256_and_si256(_mm256_castps_si256(v), abs_mask));
      }
      const uint32_t mb = HMaxU32(mx);
      if (mb >= kInfBits) return false;
      gmax[b] = BitsToFloat(mb);
      if (mb == 0) continue;
      const __m256 thr = _mm256_set1_ps(BitsToFloat(mb));
      const __m256 fabs_mask = _mm256_castsi256_ps(abs_mask);
      uint32_t* idx = s.idx;
      size_t cnt = s.cnt;
      for (i = lo; i < hi; i += 8) {
        __m256 gv, v;
        if (i < full) {
          gv = _mm256_loadu_ps(g + i);
          v = _mm256_add_ps(_mm256_loadu_ps(in + i), gv);
        } else {  // masked-off lanes are +0: never selected
          gv = _mm256_maskload_ps(g + i, tail_mask);
          v = _mm256_add_ps(_mm256_maskload_ps(in + i, tail_mask), gv);
        }
        const __m256 h = _mm256_and_ps(_mm256_add_ps(v, gv), fabs_mask);
        const __m256 sel = _mm256_and_ps(_mm256_cmp_ps(h, thr, _CMP_GE_OQ),
                                         _mm256_cmp_ps(v, zero, _CMP_NEQ_OQ));
        cnt = Pack8(static_cast<unsigned>(_mm256_movemask_ps(sel)), static_cast<uint32_t>(i), cnt,
                    idx);
      }
      s.cnt = cnt;
    }
  }
  return true;
}

ADAPS_TARGET_AVX2 void Sfence() { _mm_sfence(); }


// ---- NaN/Inf scan (other compressors, worker) -------------------------------------------

__attribute__((target("avx2"))) bool AllFiniteAvx2(const float* x, size_t n) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  size_t i = 0;
  while (i + 8 <= n) {
    // Check blocks of up to 1024 elements, then stop early if one was bad.
    const size_t block_end = std::min(n & ~size_t{7}, i + 1024);
    __m256i bad = _mm256_setzero_si256();
    for (; i < block_end; i += 8) {
      const __m256i e = _mm256_and_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), exp_mask);
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, exp_mask));
    }
    if (!_mm256_testz_si256(bad, bad)) return false;
  }
  for (; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

bool CpuAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

bool CpuAvx2Kernel() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
                          __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
  return has;
}

bool CpuAvx512Kernel() {
  static const bool has = CpuAvx2Kernel() && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512dq");
  return has;
}
#endif  // ADAPS_X86

}  // namespace

bool AdaCompIsaSupported(AdaCompIsa isa) {
  switch (isa) {
    case AdaCompIsa::kAuto:
    case AdaCompIsa::kPortable:
      return true;
#if ADAPS_X86
    case AdaCompIsa::kAvx2:
      return CpuAvx2Kernel();
    case AdaCompIsa::kAvx512:
      return CpuAvx512Kernel();
#else
    default:
      return false;
#endif
  }
  return false;
}

AdaCompIsa AdaCompBestIsa() {
  if (AdaCompIsaSupported(AdaCompIsa::kAvx512)) return AdaCompIsa::kAvx512;
  if (AdaCompIsaSupported(AdaCompIsa::kAvx2)) return AdaCompIsa::kAvx2;
  return AdaCompIsa::kPortable;
}

const char* AdaCompIsaName(AdaCompIsa isa) {
  switch (isa) {
    case AdaCompIsa::kAuto:
      return AdaCompIsaName(AdaCompBestIsa());
    case AdaCompIsa::kPortable:
      return "portable";
    case AdaCompIsa::kAvx2:
      return "AVX2";
    case AdaCompIsa::kAvx512:
      return "AVX-512";
  }
  return "unknown";
}

bool AdaCompHasAvx2() { return AdaCompIsaSupported(AdaCompIsa::kAvx2); }

namespace {

// Pass A/B over one run of whole bins (the ISA switch). `gmax` gets one maximum per bin.
bool RunPass(AdaCompIsa isa, bool stream, const float* g, const float* in, float* r, uint32_t n,
             uint32_t t, float* gmax, Sink& sink) {
  switch (isa) {
#if ADAPS_X86
    case AdaCompIsa::kAvx512:
      return stream ? PassAvx512<true>(g, in, r, n, t, gmax, sink)
                    : PassAvx512<false>(g, in, r, n, t, gmax, sink);
    case AdaCompIsa::kAvx2:
      return stream ? PassAvx2<true>(g, in, r, n, t, gmax, sink)
                    : PassAvx2<false>(g, in, r, n, t, gmax, sink);
#endif
    default:
      return PassPortable(g, in, r, n, t, gmax, sink);
  }
}

// Starts `out` as an empty AdaComp update of n elements; resizes the scratch.
void BeginStep(uint32_t n, uint32_t t, std::vector<float>& gmax_scratch, CompressedUpdate& out) {
  out.Clear();
  out.kind = CompressorKind::kAdaComp;
  out.length = n;
  out.bin_size = t;
  if (n == 0) return;
  gmax_scratch.resize((n - 1) / t + 1);
  // Typical AdaComp density is a few percent at most; the sink grows as needed.
  out.indices.reserve(n / 32 + 64);
  out.negative.reserve(n / 32 + 64);
}

// After the passes: sfence, the scale and the sparse fix-up of the new residue `r`.
bool FinishStep(bool ok, AdaCompIsa isa, const float* gmax, uint32_t nb, float* r, Sink& sink,
                CompressedUpdate& out) {
#if ADAPS_X86
  // Streaming stores are weakly ordered: make them visible before anyone reads the buffer.
  if (isa != AdaCompIsa::kPortable) Sfence();
#else
  (void)isa;
#endif
  if (!ok) {
    out.indices.clear();
    out.negative.clear();
    return false;
  }
  sink.Finish();

  double sum = 0.0;
  for (uint32_t b = 0; b < nb; ++b) sum += gmax[b];
  // The mean of finite maxima: finite, so the fix-up below never makes an Inf.
  const float s = static_cast<float>(sum / static_cast<double>(nb));
  out.scale = s;
  // Fix-up: G[i] -= sign(G[i]) * s, and the sign is what the update sends. (v - (-s) is
  // exactly v + s, so this is the contract's "+ s for negatives, - s otherwise".)
  size_t cnt = out.indices.size();
  out.negative.resize(cnt);

  const uint32_t* idx = out.indices.data();
  uint8_t* neg = out.negative.data();
  constexpr size_t kAhead = 32;
  size_t j = 0;
  const auto fix = [&](size_t k) {
    const uint32_t i = idx[k];
    const float v = r[i];
    neg[k] = std::signbit(v) ? 1 : 0;
    r[i] = v - std::copysign(s, v);
  };
  for (; j + kAhead < cnt; ++j) {
    __builtin_prefetch(r + idx[j + kAhead], 1, 3);
    fix(j);
  }
  for (; j < cnt; ++j) fix(j);
  return true;
}

AdaCompIsa ResolveIsa(AdaCompIsa isa) {
  return isa == AdaCompIsa::kAuto || !AdaCompIsaSupported(isa) ? AdaCompBestIsa() : isa;
}

bool Streaming(AdaCompStores stores, uint32_t n) {
  return stores == AdaCompStores::kStreaming ||
         (stores == AdaCompStores::kAuto && n >= kStreamMinElements);
}

// Elements of the change computed ahead of each pass of AdaCompChangeStep (whole bins):
// 4 KiB, so the change and the residue of the block are still in L1 when the pass reads
// them (1024 measured a little faster than 4096 and 16384 on 8M elements).
constexpr uint64_t kChangeBlockElements = 1024;

// change[i] = (params[i] - published[i]) - residue[i], the same float operations in the same
// order as the scalar expression `params[i] - published[i] - residue[i]` (so the SIMD and
// the scalar loops give the same bits).
void ChangeBlockPortable(const float* __restrict p, const float* __restrict pub,
                         const float* __restrict in, float* __restrict change, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) change[i] = p[i] - pub[i] - in[i];
}

#if ADAPS_X86
ADAPS_TARGET_AVX2 void ChangeBlockAvx2(const float* __restrict p, const float* __restrict pub,
                                       const float* __restrict in, float* __restrict change,
                                       uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(p + i), _mm256_loadu_ps(pub + i));
    _mm256_storeu_ps(change + i, _mm256_sub_ps(d, _mm256_loadu_ps(in + i)));
  }
  for (; i < n; ++i) change[i] = p[i] - pub[i] - in[i];
}
#endif

void ChangeBlock(AdaCompIsa isa, const float* p, const float* pub, const float* in,
                 float* change, uint64_t n) {
#if ADAPS_X86
  if (isa != AdaCompIsa::kPortable) return ChangeBlockAvx2(p, pub, in, change, n);
#endif
  (void)isa;
  ChangeBlockPortable(p, pub, in, change, n);
}

}  // namespace

bool AdaCompStep(absl::Span<const float> grad, absl::Span<const float> residue_in,
                 absl::Span<float> residue_out, uint32_t bin_size,
                 std::vector<float>& gmax_scratch, CompressedUpdate& out, AdaCompIsa isa,
                 AdaCompStores stores) {
  const uint32_t n = static_cast<uint32_t>(grad.size());
  const uint32_t t = bin_size;
  BeginStep(n, t, gmax_scratch, out);
  if (n == 0) return true;
  Sink sink(out);
  isa = ResolveIsa(isa);
  float* r = residue_out.data();
  const bool ok = RunPass(isa, Streaming(stores, n), grad.data(), residue_in.data(), r, n, t,
                          gmax_scratch.data(), sink);
  return FinishStep(ok, isa, gmax_scratch.data(), static_cast<uint32_t>(gmax_scratch.size()), r,
                    sink, out);
}

bool AdaCompChangeStep(absl::Span<const float> params, absl::Span<const float> published,
                       absl::Span<const float> residue_in, absl::Span<float> residue_out,
                       uint32_t bin_size, std::vector<float>& gmax_scratch,
                       std::vector<float>& change_scratch, CompressedUpdate& out,
                       AdaCompIsa isa, AdaCompStores stores) {
  const uint32_t n = static_cast<uint32_t>(params.size());
  const uint32_t t = bin_size;
  BeginStep(n, t, gmax_scratch, out);
  if (n == 0) return true;
  Sink sink(out);
  isa = ResolveIsa(isa);
  const bool stream = Streaming(stores, n);
  const uint64_t block = std::max<uint64_t>(1, kChangeBlockElements / t) * t;
  if (change_scratch.size() < std::min<uint64_t>(block, n)) {
    change_scratch.resize(std::min<uint64_t>(block, n));
  }
  const float* in = residue_in.data();
  float* r = residue_out.data();
  float* change = change_scratch.data();
  bool ok = true;
  for (uint64_t a = 0; a < n && ok; a += block) {
    const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(block, n - a));
    ChangeBlock(isa, params.data() + a, published.data() + a, in + a, change, len);
    const size_t before = sink.cnt;
    ok = RunPass(isa, stream, change, in + a, r + a, len, t, gmax_scratch.data() + a / t, sink);
    // The pass numbers elements from the start of the block.
    for (size_t k = before; k < sink.cnt; ++k) sink.idx[k] += static_cast<uint32_t>(a);
  }
  return FinishStep(ok, isa, gmax_scratch.data(), static_cast<uint32_t>(gmax_scratch.size()), r,
                    sink, out);
}

}  // namespace internal

bool AllFinite(absl::Span<const float> values) {
#if ADAPS_X86
  if (internal::CpuAvx2()) return internal::AllFiniteAvx2(values.data(), values.size());
#endif
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

}  // namespace adaps
