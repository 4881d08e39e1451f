// adaps-codec-bench: speed of the AdaComp codec against the memory-bandwidth limit.
//
// All figures use one core (the benchmarks are single-threaded) and CPU time. Every compress
// variant is reported both in elements/s and as a ratio to a plain pass over the same bytes
// (r[i] += g[i]: read 8 B, write 4 B per element, the DESIGN.md section 1 'Cost'), measured
// in the same run, so the ratio survives a noisy, shared machine better than the raw rate.
//
// Input: the bench/gradient_stream.h stream with default options (Gaussian background,
// heavy log-normal coordinates, AR(1) rho=0.9 between steps), on which AdaComp sends about
// 1% of the elements at T=500 and about 4% at T=50. kSteps consecutive steps are generated
// up front and cycled; residues are warmed up before timing so the density is the steady one.
//
// Also measured: the library kernel per instruction set and store mode (adacomp_step_*: AVX-512
// / AVX2 with streaming "nt" or normal "st" stores, portable), the NaN/Inf scan alone (which
// Compress no longer runs: its double-buffered pass finds NaN/Inf itself), exact Top-k at 0.1%,
// the wire encodings (encode, DecodeAdd, bits per sent element), and the earlier prototype
// kernels (namespace proto below: in-place, with a separate NaN scan, kept for comparison and
// checked bit for bit against the library kernel).
//
// After Google Benchmark's own output, a summary table with the targets of issue 2.
// Extra flags (mixed freely with --benchmark_* flags):
//   --elements=N    slice length (default 25000000)
//   --diagnostics   also the one-change-at-a-time prototype variants (attribution)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gradient_stream.h"
#include "benchmark/benchmark.h"
#include "common/compressor.h"
#include "common/wire_codec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace adaps {
namespace {

constexpr int kSteps = 4;
constexpr int kWarmupSteps = 4 * kSteps;  // a multiple of kSteps
constexpr uint32_t kBinSizes[] = {50, 500};
constexpr double kTopKFraction = 0.001;
constexpr uint32_t kProtoPrefetch = 2048;  // elements ahead (8 KiB)

size_t g_elements = 25'000'000;
bool g_diagnostics = false;  // --diagnostics: also the one-change-at-a-time prototype variants

// Everything the benchmarks share, built once, outside any timed region.
struct Data {
  size_t n = 0;
  std::vector<std::vector<float>> grads;  // kSteps consecutive steps of the stream
  // Per bin size: a steady-state residue and a representative update with its encodings.
  struct PerBin {
    std::vector<float> snapshot;  // residue after the warm-up steps
    CompressedUpdate update;
    std::vector<uint8_t> rice;
    std::vector<uint8_t> plain;
  };
  std::map<uint32_t, PerBin> per_bin;
  std::vector<float> topk_snapshot;  // Top-k residue after kSteps warm-up steps
};

Data& GetData() {
  static Data* data = [] {
    auto* d = new Data;
    d->n = g_elements;
    bench::GradientStream stream(bench::GradientStream::Tuned1Percent(d->n, 42));
    d->grads.assign(kSteps, std::vector<float>(d->n));
    for (auto& g : d->grads) stream.Next(absl::MakeSpan(g));
    for (uint32_t t : kBinSizes) {
      Data::PerBin& pb = d->per_bin[t];
      SliceState state(d->n);
      CompressorOptions o;
      o.bin_size = t;
      auto c = MakeCompressor(o);
      for (int s = 0; s < kWarmupSteps; ++s) {
        if (!c.ok() || !(*c)->Compress(d->grads[s % kSteps], state, pb.update).ok()) {
          std::fprintf(stderr, "warm-up compress failed\n");
          std::exit(1);
        }
      }
      pb.snapshot.assign(state.residue().begin(), state.residue().end());
      if (!EncodeUpdate(pb.update, IndexCoding::kRice, &pb.rice).ok() ||
          !EncodeUpdate(pb.update, IndexCoding::kPlain32, &pb.plain).ok()) {
        std::fprintf(stderr, "warm-up encode failed\n");
        std::exit(1);
      }
    }
    CompressorOptions o;
    o.kind = CompressorKind::kTopK;
    o.topk_fraction = kTopKFraction;
    auto c = MakeCompressor(o);
    SliceState state(d->n);
    CompressedUpdate u;
    for (int s = 0; s < kSteps; ++s) {
      if (!c.ok() || !(*c)->Compress(d->grads[s], state, u).ok()) std::exit(1);
    }
    d->topk_snapshot.assign(state.residue().begin(), state.residue().end());
    return d;
  }();
  return *data;
}


// ---------------------------------------------------------------------------------------
// Prototype kernels (not used by the library): candidate replacements for
// common/adacomp_kernel.cc, kept here so their speed is measured in the same run as the real
// kernel and their output checked bit for bit against it (CheckPrototypes()).
//
// One-pass (same structure as the library): the selection is written branch-free with a
// left-pack (pext/pdep + permute) into raw buffers instead of push_back per element, so the
// selection loop has no data-dependent branch and no call that spills the vector constants;
// the sparse fix-up prefetches ahead.
//
// Two-pass: pass 1 reads r and g (no write) to get every bin maximum and check g for NaN/Inf;
// the scale is then known, so pass 2 adds, selects and subtracts the scale in one streaming
// read-modify-write, with no sparse fix-up and no separate NaN pre-scan. 20 B per element,
// all sequential, against 4 (scan) + 12 + a fix-up that touches up to half the cache lines.
namespace proto {

#if defined(__x86_64__)
bool Supported() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
         __builtin_cpu_supports("popcnt");
}

// Reusable raw output buffers (never value-initialised; only touched pages are faulted).
// For the deferred variant it also holds the previous step's selection, whose scale has
// not yet been subtracted from the residue (pidx/pneg/pcnt/pscale).
struct Scratch {
  size_t capacity = 0;
  std::unique_ptr<uint32_t[]> idx, pidx;
  std::unique_ptr<uint8_t[]> neg, pneg;
  size_t pcnt = 0;
  float pscale = 0.0f;
  std::vector<float> gmax;
  void Reserve(size_t n) {
    if (capacity >= n + 8) return;
    capacity = n + 8;
    idx.reset(new uint32_t[capacity]);
    neg.reset(new uint8_t[capacity]);
    std::unique_ptr<uint32_t[]> pi(new uint32_t[capacity]);
    std::unique_ptr<uint8_t[]> pn(new uint8_t[capacity]);
    if (pcnt) {
      std::memcpy(pi.get(), pidx.get(), pcnt * sizeof(uint32_t));
      std::memcpy(pn.get(), pneg.get(), pcnt);
    }
    pidx = std::move(pi);
    pneg = std::move(pn);
  }
  // Applies the pending subtraction: afterwards `r` is exactly the library's residue.
  void Flush(float* r) {
    for (size_t j = 0; j < pcnt; ++j) {
      const uint32_t i = pidx[j];
      r[i] = pneg[j] ? r[i] + pscale : r[i] - pscale;
    }
    pcnt = 0;
  }
};

__attribute__((target("avx2"))) inline float HMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// Appends the lanes of `mask` (8 bits) as indices base+lane and their sign bytes.
__attribute__((target("avx2,bmi,bmi2,popcnt"))) inline size_t Pack(unsigned mask,
                                                                    unsigned neg_bits,
                                                                    uint32_t base, size_t cnt,
                                                                    uint32_t* idx, uint8_t* neg) {
  const uint64_t lanes = _pdep_u64(mask, 0x0101010101010101ull) * 0xff;
  const uint64_t order = _pext_u64(0x0706050403020100ull, lanes);
  const __m256i perm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(order)));
  const __m256i ids = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + cnt),
                      _mm256_permutevar8x32_epi32(ids, perm));
  const uint64_t signs = _pdep_u64(_pext_u32(neg_bits, mask), 0x0101010101010101ull);
  std::memcpy(neg + cnt, &signs, 8);
  return cnt + static_cast<size_t>(_mm_popcnt_u32(mask));
}

inline void SelectScalar(uint32_t i, float v, float h, float m, size_t& cnt, uint32_t* idx,
                         uint8_t* neg) {
  if (v != 0.0f && std::fabs(h) >= m) {
    idx[cnt] = i;
    neg[cnt] = v < 0.0f ? 1 : 0;
    ++cnt;
  }
}

void Emit(const Scratch& s, size_t cnt, uint32_t n, uint32_t t, float scale,
          CompressedUpdate& out) {
  out.Clear();
  out.kind = CompressorKind::kAdaComp;
  out.length = n;
  out.bin_size = t;
  out.scale = scale;
  out.indices.assign(s.idx.get(), s.idx.get() + cnt);
  out.negative.assign(s.neg.get(), s.neg.get() + cnt);
}

float Scale(const std::vector<float>& gmax, uint32_t nb) {
  double sum = 0.0;
  for (uint32_t b = 0; b < nb; ++b) sum += gmax[b];
  return static_cast<float>(sum / static_cast<double>(nb));
}

// `prefetch`: elements ahead to prefetch r and g in the first loop (0: none).
// `deferred`: instead of the sparse fix-up at the end, the scale is subtracted from the
//   selected elements at the start of the next call, bin by bin, just before the bin is
//   streamed (the same float operations in the same order, so bit-identical once flushed);
//   a residue whose Scratch has pcnt > 0 must be read through Scratch::Flush.
// `branchless`: pack every 8-lane group, selected or not, instead of branching on it.
// `fixup` false and `select` false are for diagnosis only (wrong results).
__attribute__((target("avx2,bmi,bmi2,popcnt"))) void OnePass(const float* g, float* r,
                                                             uint32_t n, uint32_t t,
                                                             Scratch& s,
                                                             CompressedUpdate& out,
                                                             uint32_t prefetch = 0,
                                                             bool fixup = true,
                                                             bool select = true,
                                                             bool deferred = false,
                                                             bool branchless = false) {
  const uint32_t nb = (n - 1) / t + 1;
  s.Reserve(n);
  s.gmax.resize(nb);
  uint32_t* idx = s.idx.get();
  uint8_t* neg = s.neg.get();
  size_t cnt = 0;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 zero = _mm256_setzero_ps();
  const uint32_t* pidx = s.pidx.get();
  const uint8_t* pneg = s.pneg.get();
  const size_t pcnt = deferred ? s.pcnt : 0;
  const float ps = s.pscale;
  const __m256i lane_ids = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  // Pending fix-ups and prefetches are issued per chunk of about 2048 elements, so their
  // data-dependent loops cost one mispredicted exit per chunk rather than per bin.
  const uint32_t chunk_bins = std::max(1u, 2048u / t);
  size_t pp = 0;
  uint32_t b = 0;
  for (uint32_t lo = 0; lo < n; lo += t, ++b) {
    const uint32_t hi = (n - lo > t) ? lo + t : n;
    const uint32_t vec_end = lo + ((hi - lo) & ~7u);
    const uint32_t tail = (hi - lo) & 7u;
    if (b % chunk_bins == 0) {
      const uint32_t chunk_hi =
          static_cast<uint32_t>(std::min<uint64_t>(n, uint64_t{lo} + uint64_t{chunk_bins} * t));
      for (; pp < pcnt && pidx[pp] < chunk_hi; ++pp) {
        const uint32_t i = pidx[pp];
        r[i] = pneg[pp] ? r[i] + ps : r[i] - ps;
      }
      if (prefetch) {
        // One prefetch per 64-byte line of each array, `prefetch` elements ahead.
        const uint64_t end = std::min<uint64_t>(n, uint64_t{chunk_hi} + prefetch);
        for (uint64_t q = (uint64_t{lo} + prefetch) & ~uint64_t{15}; q < end; q += 16) {
          _mm_prefetch(reinterpret_cast<const char*>(g + q), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(r + q), _MM_HINT_T0);
        }
      }
    }
    const __m256i tail_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(tail)),
                                                 lane_ids);
    __m256 mv = zero;
    uint32_t i = lo;
    for (; i < vec_end; i += 8) {
      const __m256 v = _mm256_add_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(g + i));
      _mm256_storeu_ps(r + i, v);
      mv = _mm256_max_ps(mv, _mm256_and_ps(v, abs_mask));
    }
    if (tail) {
      // Masked-off lanes load as +0 and so neither raise the maximum nor get selected.
      const __m256 v = _mm256_add_ps(_mm256_maskload_ps(r + i, tail_mask),
                                     _mm256_maskload_ps(g + i, tail_mask));
      _mm256_maskstore_ps(r + i, tail_mask, v);
      mv = _mm256_max_ps(mv, _mm256_and_ps(v, abs_mask));
    }
    const float m = HMax(mv);
    s.gmax[b] = m;
    if (!(m > 0.0f) || !select) continue;
    const __m256 thr = _mm256_set1_ps(m);
    for (i = lo; i < hi; i += 8) {
      const bool part = i == vec_end;
      const __m256 v = part ? _mm256_maskload_ps(r + i, tail_mask) : _mm256_loadu_ps(r + i);
      const __m256 gv = part ? _mm256_maskload_ps(g + i, tail_mask) : _mm256_loadu_ps(g + i);
      const __m256 h = _mm256_and_ps(_mm256_add_ps(v, gv), abs_mask);
      const __m256 sel = _mm256_and_ps(_mm256_cmp_ps(h, thr, _CMP_GE_OQ),
                                       _mm256_cmp_ps(v, zero, _CMP_NEQ_OQ));
      const unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(sel));
      if (branchless || mask) {
        cnt = Pack(mask, static_cast<unsigned>(_mm256_movemask_ps(v)), i, cnt, idx, neg);
      }
    }
  }
  const float scale = Scale(s.gmax, nb);
  if (deferred) {
    Emit(s, cnt, n, t, scale, out);
    s.pcnt = std::isfinite(scale) ? cnt : 0;
    s.pscale = scale;
    std::swap(s.idx, s.pidx);
    std::swap(s.neg, s.pneg);
    return;
  }
  if (std::isfinite(scale) && fixup) {
    constexpr size_t kAhead = 32;
    for (size_t j = 0; j < cnt; ++j) {
      if (j + kAhead < cnt) __builtin_prefetch(r + idx[j + kAhead], 1, 3);
      const uint32_t i = idx[j];
      r[i] = neg[j] ? r[i] + scale : r[i] - scale;
    }
  }
  Emit(s, cnt, n, t, scale, out);
}

bool SupportedAvx512() {
  return Supported() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// GCC 12's AVX-512 headers seed results with _mm512_undefined_ps(), which trips
// -Wmaybe-uninitialized in every intrinsic that uses it; the warning is not about our code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// AVX-512 one-pass with the deferred fix-up: 16 lanes, mask registers for the bin tails, and
// a register compress (vpcompressd) to append the selected indices without a branch per
// element or a shuffle table.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,bmi,bmi2,popcnt"))) void OnePass512(
    const float* g, float* r, uint32_t n, uint32_t t, Scratch& s, CompressedUpdate& out) {
  const uint32_t nb = (n - 1) / t + 1;
  s.Reserve(n + 8);
  s.gmax.resize(nb);
  uint32_t* idx = s.idx.get();
  uint8_t* neg = s.neg.get();
  size_t cnt = 0;
  const uint32_t* pidx = s.pidx.get();
  const uint8_t* pneg = s.pneg.get();
  const size_t pcnt = s.pcnt;
  const float ps = s.pscale;
  const __m512i lane_ids = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 zero = _mm512_setzero_ps();
  const uint32_t chunk_bins = std::max(1u, 2048u / t);
  size_t pp = 0;
  uint32_t b = 0;
  for (uint32_t lo = 0; lo < n; lo += t, ++b) {
    const uint32_t hi = (n - lo > t) ? lo + t : n;
    const uint32_t vec_end = lo + ((hi - lo) & ~15u);
    const __mmask16 tail = static_cast<__mmask16>((1u << ((hi - lo) & 15u)) - 1u);
    if (b % chunk_bins == 0) {
      const uint32_t chunk_hi =
          static_cast<uint32_t>(std::min<uint64_t>(n, uint64_t{lo} + uint64_t{chunk_bins} * t));
      for (; pp < pcnt && pidx[pp] < chunk_hi; ++pp) {
        const uint32_t i = pidx[pp];
        r[i] = pneg[pp] ? r[i] + ps : r[i] - ps;
      }
    }
    __m512 mv = zero;
    uint32_t i = lo;
    for (; i < vec_end; i += 16) {
      const __m512 v = _mm512_add_ps(_mm512_loadu_ps(r + i), _mm512_loadu_ps(g + i));
      _mm512_storeu_ps(r + i, v);
      mv = _mm512_max_ps(mv, _mm512_abs_ps(v));
    }
    if (tail) {
      const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(tail, r + i),
                                     _mm512_maskz_loadu_ps(tail, g + i));
      _mm512_mask_storeu_ps(r + i, tail, v);
      mv = _mm512_max_ps(mv, _mm512_abs_ps(v));
    }
    // (_mm512_reduce_max_ps trips -Wmaybe-uninitialized in GCC 12's header.)
    const float m =
        HMax(_mm256_max_ps(_mm512_castps512_ps256(mv), _mm512_extractf32x8_ps(mv, 1)));
    s.gmax[b] = m;
    if (!(m > 0.0f)) continue;
    const __m512 thr = _mm512_set1_ps(m);
    for (i = lo; i < hi; i += 16) {
      const __mmask16 lanes = i == vec_end ? tail : static_cast<__mmask16>(0xffff);
      const __m512 v = _mm512_maskz_loadu_ps(lanes, r + i);
      const __m512 h = _mm512_abs_ps(_mm512_add_ps(v, _mm512_maskz_loadu_ps(lanes, g + i)));
      const __mmask16 sel = _mm512_mask_cmp_ps_mask(
          _mm512_cmp_ps_mask(v, zero, _CMP_NEQ_OQ), h, thr, _CMP_GE_OQ);
      if (sel) {
        const __m512i ids = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(i)), lane_ids);
        _mm512_storeu_si512(idx + cnt, _mm512_maskz_compress_epi32(sel, ids));
        const unsigned negs = _pext_u32(_mm512_movepi32_mask(_mm512_castps_si512(v)), sel);
        const uint64_t lo8 = _pdep_u64(negs & 0xff, 0x0101010101010101ull);
        const uint64_t hi8 = _pdep_u64(negs >> 8, 0x0101010101010101ull);
        std::memcpy(neg + cnt, &lo8, 8);
        std::memcpy(neg + cnt + 8, &hi8, 8);
        cnt += static_cast<size_t>(_mm_popcnt_u32(sel));
      }
    }
  }
  const float scale = Scale(s.gmax, nb);
  Emit(s, cnt, n, t, scale, out);
  s.pcnt = std::isfinite(scale) ? cnt : 0;
  s.pscale = scale;
  std::swap(s.idx, s.pidx);
  std::swap(s.neg, s.pneg);
}
#pragma GCC diagnostic pop

// Returns false (residue untouched) when g holds NaN or Inf.
__attribute__((target("avx2,bmi,bmi2,popcnt"))) bool TwoPass(const float* g, float* r,
                                                             uint32_t n, uint32_t t,
                                                             Scratch& s,
                                                             CompressedUpdate& out) {
  const uint32_t nb = (n - 1) / t + 1;
  s.Reserve(n);
  s.gmax.resize(nb);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  const __m256 zero = _mm256_setzero_ps();
  __m256i bad = _mm256_setzero_si256();
  bool bad_tail = false;
  uint32_t b = 0;
  for (uint32_t lo = 0; lo < n; lo += t, ++b) {
    const uint32_t hi = (n - lo > t) ? lo + t : n;
    const uint32_t vec_end = lo + ((hi - lo) & ~7u);
    __m256 mv = zero;
    uint32_t i = lo;
    for (; i < vec_end; i += 8) {
      const __m256 gv = _mm256_loadu_ps(g + i);
      const __m256i e = _mm256_and_si256(_mm256_castps_si256(gv), exp_mask);
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, exp_mask));
      const __m256 v = _mm256_add_ps(_mm256_loadu_ps(r + i), gv);
      mv = _mm256_max_ps(mv, _mm256_and_ps(v, abs_mask));
    }
    float m = HMax(mv);
    for (; i < hi; ++i) {
      bad_tail |= !std::isfinite(g[i]);
      m = std::max(m, std::fabs(r[i] + g[i]));
    }
    s.gmax[b] = m;
  }
  if (bad_tail || !_mm256_testz_si256(bad, bad)) return false;

  const float scale = Scale(s.gmax, nb);
  const float sub = std::isfinite(scale) ? scale : 0.0f;
  const __m256 sv = _mm256_set1_ps(sub);
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN));
  uint32_t* idx = s.idx.get();
  uint8_t* neg = s.neg.get();
  size_t cnt = 0;
  b = 0;
  for (uint32_t lo = 0; lo < n; lo += t, ++b) {
    const uint32_t hi = (n - lo > t) ? lo + t : n;
    const uint32_t vec_end = lo + ((hi - lo) & ~7u);
    const float m = s.gmax[b];
    uint32_t i = lo;
    if (!(m > 0.0f)) {
      // All of r + g is zero in this bin: nothing to select, residue becomes r + g.
      for (; i < hi; ++i) r[i] += g[i];
      continue;
    }
    const __m256 thr = _mm256_set1_ps(m);
    for (; i < vec_end; i += 8) {
      const __m256 gv = _mm256_loadu_ps(g + i);
      const __m256 v = _mm256_add_ps(_mm256_loadu_ps(r + i), gv);
      const __m256 h = _mm256_and_ps(_mm256_add_ps(v, gv), abs_mask);
      const __m256 sel = _mm256_and_ps(_mm256_cmp_ps(h, thr, _CMP_GE_OQ),
                                       _mm256_cmp_ps(v, zero, _CMP_NEQ_OQ));
      // v - sign(v) * s, exactly the library's r - s / r + s.
      const __m256 fixed = _mm256_sub_ps(v, _mm256_or_ps(sv, _mm256_and_ps(v, sign_mask)));
      _mm256_storeu_ps(r + i, _mm256_blendv_ps(v, fixed, sel));
      const unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(sel));
      if (mask) {
        cnt = Pack(mask, static_cast<unsigned>(_mm256_movemask_ps(v)), i, cnt, idx, neg);
      }
    }
    for (; i < hi; ++i) {
      const float v = r[i] + g[i];
      const size_t before = cnt;
      SelectScalar(i, v, v + g[i], m, cnt, idx, neg);
      r[i] = cnt == before ? v : (v < 0.0f ? v + sub : v - sub);
    }
  }
  Emit(s, cnt, n, t, scale, out);
  return true;
}
#endif  // __x86_64__

// A faster DecodeAdd for AdaComp updates in the Rice coding (the server's hot path), same
// format and same checks as common/wire_codec.cc: a 64-bit bit buffer refilled 8 bytes at a
// time, the unary part counted with one ctz instead of bit by bit, and one decoding pass
// into a scratch index list (validated) followed by the apply, instead of decoding twice
// through virtual calls. Returns false on any damage; dst is then unchanged.
class FastRiceDecoder {
 public:
  bool DecodeAdd(absl::Span<const uint8_t> bytes, float factor, absl::Span<float> dst) {
    const uint8_t* p = bytes.data();
    const size_t size = bytes.size();
    size_t pos = 0;
    auto u8 = [&](uint32_t* v) {
      if (pos >= size) return false;
      *v = p[pos++];
      return true;
    };
    auto varint = [&](uint32_t* v) {
      uint64_t r = 0;
      for (int shift = 0; shift < 35; shift += 7) {
        uint32_t byte;
        if (!u8(&byte)) return false;
        r |= uint64_t{byte & 0x7f} << shift;
        if (!(byte & 0x80)) {
          if (r > 0xffffffffull) return false;
          *v = static_cast<uint32_t>(r);
          return true;
        }
      }
      return false;
    };
    uint32_t magic, version, kind, coding, length, bin, count, k;
    if (!u8(&magic) || !u8(&version) || !u8(&kind) || !u8(&coding)) return false;
    if (magic != kWireMagic || version != kWireFormatVersion ||
        kind != static_cast<uint32_t>(CompressorKind::kAdaComp) ||
        coding != static_cast<uint32_t>(IndexCoding::kRice)) {
      return false;
    }
    if (!varint(&length) || !varint(&bin) || !varint(&count)) return false;
    if (length != dst.size() || bin == 0 || count > length || size - pos < 5) return false;
    float scale;
    std::memcpy(&scale, p + pos, 4);
    pos += 4;
    if (!std::isfinite(scale)) return false;
    if (!u8(&k)) return false;
    const uint32_t pad = k >> 5;  // format 2: the padding bits of the stream's last byte
    k &= 31;
    if (uint64_t{count} * (k + 2) > uint64_t{size - pos} * 8) return false;

    idx_.resize(count);
    neg_.resize(count);
    const uint8_t* data = p + pos;
    const size_t nbytes = size - pos;
    size_t byte = 0;      // next byte to load into the buffer
    uint64_t buf = 0;     // unread bits, LSB first
    unsigned have = 0;    // number of valid bits in buf
    auto refill = [&] {
      if (byte + 8 <= nbytes) {
        uint64_t w;
        std::memcpy(&w, data + byte, 8);
        const unsigned take = (63 - have) >> 3;  // whole bytes that fit, at most 7
        buf |= (w & ((uint64_t{1} << (8 * take)) - 1)) << have;  // bits above `have` stay 0
        byte += take;
        have += take * 8;
      } else {
        while (have <= 56 && byte < nbytes) {
          buf |= uint64_t{data[byte++]} << have;
          have += 8;
        }
      }
    };
    auto take = [&](unsigned n) {  // n <= have, n < 64
      const uint64_t v = buf & ((uint64_t{1} << n) - 1);
      buf >>= n;
      have -= n;
      return v;
    };
    int64_t prev = -1;
    for (uint32_t j = 0; j < count; ++j) {
      refill();
      const unsigned q = static_cast<unsigned>(__builtin_ctzll(~buf));  // ones in a row
      uint64_t gap;
      if (q >= 32) {
        if (have < 32) return false;
        take(32);
        refill();
        if (have < 32) return false;
        gap = take(32);
      } else {
        if (q + 1 + k > have) return false;
        if (k && (q >> (32 - k)) != 0) return false;
        take(q + 1);
        gap = (uint64_t{q} << k) | take(k);
      }
      refill();
      if (have < 1) return false;
      const int64_t i = prev + 1 + static_cast<int64_t>(gap);
      if (i >= static_cast<int64_t>(length)) return false;
      idx_[j] = static_cast<uint32_t>(i);
      neg_[j] = static_cast<uint8_t>(take(1));
      prev = i;
    }
    // The stream must end exactly at its bit length (nbytes * 8 - pad); what is left in the
    // buffer then is the padding, which must be zero.
    if (uint64_t{byte} * 8 - have != uint64_t{nbytes} * 8 - pad) return false;
    if (buf != 0) return false;
    const float pos_v = factor * scale;
    float* d = dst.data();
    for (uint32_t j = 0; j < count; ++j) d[idx_[j]] += neg_[j] ? -pos_v : pos_v;
    return true;
  }

 private:
  std::vector<uint32_t> idx_;
  std::vector<uint8_t> neg_;
};

#if defined(__x86_64__)
#else
bool Supported() { return false; }
bool SupportedAvx512() { return false; }
#endif

}  // namespace proto

void SetElementCounters(benchmark::State& state, size_t n) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n) *
                          12);
}

// The bandwidth reference: what AdaComp's one pass must at least move.
__attribute__((noinline)) void PlainPass(const float* g, float* r, size_t n) {
  for (size_t i = 0; i < n; ++i) r[i] += g[i];
}

// One compression step of some variant; false means it failed.
using StepFn = std::function<bool(const std::vector<float>& grad, SliceState& residue,
                                  CompressedUpdate& out)>;

// Times `step` over the kSteps stored gradients in turn, on a private copy of `snapshot`
// that is reset (untimed) every kSteps iterations: every variant sees exactly the same
// inputs, and a diagnostic variant cannot disturb the residue another one starts from.
void RunSteps(benchmark::State& state, const std::vector<float>& snapshot, const StepFn& step,
              const std::function<void()>& on_reset = nullptr) {
  Data& d = GetData();
  SliceState residue(d.n);
  // Allocate (and fault in) the second residue buffer before timing, as a training run's
  // first step does once: the steady state is what is measured.
  residue.spare_residue();
  CompressedUpdate u;
  size_t k = 0;
  double sent = 0;
  for (auto _ : state) {
    if (k % kSteps == 0) {
      state.PauseTiming();
      std::copy(snapshot.begin(), snapshot.end(), residue.residue().begin());
      if (on_reset) on_reset();
      state.ResumeTiming();
    }
    if (!step(d.grads[k++ % kSteps], residue, u)) {
      state.SkipWithError("compression step failed");
      return;
    }
    sent += static_cast<double>(u.SentElements());
  }
  SetElementCounters(state, d.n);
  state.counters["density"] =
      sent / (static_cast<double>(state.iterations()) * static_cast<double>(d.n));
}

void BM_PlainPass(benchmark::State& state) {
  RunSteps(state, GetData().per_bin[500].snapshot,
           [](const std::vector<float>& g, SliceState& r, CompressedUpdate& u) {
             PlainPass(g.data(), r.residue().data(), g.size());
             u.Clear();
             return true;
           });
}

// The NaN/Inf pre-scan of Compress on its own (reads 4 B per element).
void BM_AllFinite(benchmark::State& state) {
  Data& d = GetData();
  size_t k = 0;
  for (auto _ : state) {
    if (!AllFinite(d.grads[k++ % kSteps])) {
      state.SkipWithError("unexpected NaN");
      return;
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(d.n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(d.n) *
                          4);
}

void BM_AdaCompCompress(benchmark::State& state, uint32_t t) {
  CompressorOptions o;
  o.bin_size = t;
  std::unique_ptr<Compressor> c = *MakeCompressor(o);
  RunSteps(state, GetData().per_bin[t].snapshot,
           [&](const std::vector<float>& g, SliceState& r, CompressedUpdate& u) {
             return c->Compress(g, r, u).ok();
           });
}

// Compress with the library, but the 25M-element tensor cut into slices of `slice` elements
// (a multiple of T, as DESIGN.md section 1 allows: same bins, one scale per slice), each with
// its own SliceState.
void BM_AdaCompCompressSliced(benchmark::State& state, uint32_t t, size_t slice) {
  Data& d = GetData();
  const std::vector<float>& snapshot = d.per_bin[t].snapshot;
  CompressorOptions o;
  o.bin_size = t;
  std::unique_ptr<Compressor> c = *MakeCompressor(o);
  std::vector<SliceState> states;
  for (size_t lo = 0; lo < d.n; lo += slice) states.emplace_back(std::min(slice, d.n - lo));
  for (SliceState& st : states) st.spare_residue();  // allocated before timing, see RunSteps
  CompressedUpdate u;
  size_t k = 0;
  double sent = 0;
  for (auto _ : state) {
    if (k % kSteps == 0) {
      state.PauseTiming();
      for (size_t j = 0; j < states.size(); ++j) {
        std::copy_n(snapshot.begin() + static_cast<std::ptrdiff_t>(j * slice),
                    states[j].size(), states[j].residue().begin());
      }
      state.ResumeTiming();
    }
    const std::vector<float>& g = d.grads[k++ % kSteps];
    for (size_t j = 0; j < states.size(); ++j) {
      const absl::Span<const float> part(g.data() + j * slice, states[j].size());
      if (!c->Compress(part, states[j], u).ok()) {
        state.SkipWithError("compress failed");
        return;
      }
      sent += static_cast<double>(u.SentElements());
    }
  }
  SetElementCounters(state, d.n);
  state.counters["density"] =
      sent / (static_cast<double>(state.iterations()) * static_cast<double>(d.n));
}

// The library kernel alone (what Compress runs, without its length checks), for one ISA and
// store mode, double-buffered as SliceState is.
void BM_AdaCompStep(benchmark::State& state, uint32_t t, internal::AdaCompIsa isa,
                    internal::AdaCompStores stores) {
  if (!internal::AdaCompIsaSupported(isa)) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  std::vector<float> gmax;
  RunSteps(state, GetData().per_bin[t].snapshot,
           [&](const std::vector<float>& g, SliceState& r, CompressedUpdate& u) {
             if (!internal::AdaCompStep(g, r.residue(), r.spare_residue(), t, gmax, u, isa,
                                        stores)) {
               return false;
             }
             r.swap_residue();
             return true;
           });
}

void BM_TopK(benchmark::State& state) {
  CompressorOptions o;
  o.kind = CompressorKind::kTopK;
  o.topk_fraction = kTopKFraction;
  std::unique_ptr<Compressor> c = *MakeCompressor(o);
  RunSteps(state, GetData().topk_snapshot,
           [&](const std::vector<float>& g, SliceState& r, CompressedUpdate& u) {
             return c->Compress(g, r, u).ok();
           });
}

void SetCodecCounters(benchmark::State& state, const Data& d, const Data::PerBin& pb,
                      size_t encoded_bytes) {
  const auto iters = static_cast<double>(state.iterations());
  const auto sent = static_cast<double>(pb.update.indices.size());
  state.SetItemsProcessed(static_cast<int64_t>(iters * sent));
  state.counters["dense_el/s"] =
      benchmark::Counter(iters * static_cast<double>(d.n), benchmark::Counter::kIsRate);
  state.counters["bits/el"] = BitsPerSentElement(pb.update, encoded_bytes);
  state.counters["density"] = sent / static_cast<double>(d.n);
}

void BM_Encode(benchmark::State& state, uint32_t t, IndexCoding coding) {
  Data& d = GetData();
  const Data::PerBin& pb = d.per_bin[t];
  std::vector<uint8_t> bytes;
  for (auto _ : state) {
    const absl::Status s = EncodeUpdate(pb.update, coding, &bytes);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(bytes.data());
  }
  SetCodecCounters(state, d, pb, bytes.size());
}

void BM_DecodeAdd(benchmark::State& state, uint32_t t, IndexCoding coding) {
  Data& d = GetData();
  const Data::PerBin& pb = d.per_bin[t];
  const std::vector<uint8_t>& bytes = coding == IndexCoding::kRice ? pb.rice : pb.plain;
  std::vector<float> dst(d.n, 0.0f);
  for (auto _ : state) {
    const absl::Status s = DecodeAdd(bytes, 0.5f, absl::MakeSpan(dst));
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    benchmark::ClobberMemory();
  }
  SetCodecCounters(state, d, pb, bytes.size());
}


struct ProtoVariant {
  uint32_t prefetch = kProtoPrefetch;
  bool scan = false;  // run AllFinite first, as the library's Compress does
  bool deferred = true;
  bool branchless = false;
  bool fixup = true;   // diagnosis only
  bool select = true;  // diagnosis only
};

void BM_ProtoOnePass(benchmark::State& state, uint32_t t, ProtoVariant v) {
  if (!proto::Supported()) {
    state.SkipWithError("this CPU has no AVX2/BMI2");
    return;
  }
  proto::Scratch scratch;
  RunSteps(
      state, GetData().per_bin[t].snapshot,
      [&](const std::vector<float>& g, SliceState& r, CompressedUpdate& u) {
        if (v.scan && !AllFinite(g)) return false;
        proto::OnePass(g.data(), r.residue().data(), static_cast<uint32_t>(g.size()), t,
                       scratch, u, v.prefetch, v.fixup, v.select, v.deferred, v.branchless);
        return true;
      },
      [&] { scratch.pcnt = 0; });
}

void BM_ProtoAvx512(benchmark::State& state, uint32_t t, bool scan) {
  if (!proto::SupportedAvx512()) {
    state.SkipWithError("this CPU has no AVX-512");
    return;
  }
  proto::Scratch scratch;
  RunSteps(
      state, GetData().per_bin[t].snapshot,
      [&](const std::vector<float>& g, SliceState& r, CompressedUpdate& u) {
        if (scan && !AllFinite(g)) return false;
        proto::OnePass512(g.data(), r.residue().data(), static_cast<uint32_t>(g.size()), t,
                          scratch, u);
        return true;
      },
      [&] { scratch.pcnt = 0; });
}

void BM_ProtoTwoPass(benchmark::State& state, uint32_t t) {
  if (!proto::Supported()) {
    state.SkipWithError("this CPU has no AVX2/BMI2");
    return;
  }
  proto::Scratch scratch;
  RunSteps(state, GetData().per_bin[t].snapshot,
           [&](const std::vector<float>& g, SliceState& r, CompressedUpdate& u) {
             return proto::TwoPass(g.data(), r.residue().data(),
                                   static_cast<uint32_t>(g.size()), t, scratch, u);
           });
}

bool SameUpdate(const CompressedUpdate& a, const CompressedUpdate& b) {
  return a.indices == b.indices && a.negative == b.negative &&
         std::memcmp(&a.scale, &b.scale, sizeof(float)) == 0;
}

bool SameResidue(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Both prototypes must equal the library kernel bit for bit (indices, signs, scale, residue)
// over several steps of odd-length slices, and the two-pass must refuse a NaN untouched.
// Returns a one-line verdict for the summary.
std::string CheckPrototypes() {
  if (!proto::Supported()) return "skipped (no AVX2/BMI2)";
  for (size_t n : {size_t{1}, size_t{7}, size_t{49}, size_t{501}, size_t{100'003}}) {
    for (uint32_t t : kBinSizes) {
      bench::GradientStream stream(bench::GradientStream::Tuned1Percent(n, 7 + n));
      std::vector<float> g(n), ra(n, 0.0f), rb(n, 0.0f), rc(n, 0.0f), rd(n, 0.0f),
          re(n, 0.0f), gmax;
      CompressedUpdate ua, ub, uc, ud, ue;
      proto::Scratch sb, sc, sd, se;
      for (int step = 0; step < 6; ++step) {
        stream.Next(absl::MakeSpan(g));
        std::vector<float> next(n);
        if (!internal::AdaCompStep(g, ra, absl::MakeSpan(next), t, gmax, ua)) {
          return "MISMATCH (library kernel refused a finite step)";
        }
        ra.swap(next);
        proto::OnePass(g.data(), rb.data(), static_cast<uint32_t>(n), t, sb, ub);
        if (!proto::TwoPass(g.data(), rc.data(), static_cast<uint32_t>(n), t, sc, uc)) {
          return "MISMATCH (two-pass saw a NaN)";
        }
        if (!SameUpdate(ua, ub) || !SameResidue(ra, rb)) {
          return absl::StrCat("MISMATCH one-pass n=", n, " T=", t, " step ", step);
        }
        if (!SameUpdate(ua, uc) || !SameResidue(ra, rc)) {
          return absl::StrCat("MISMATCH two-pass n=", n, " T=", t, " step ", step);
        }
        // Deferred + branch-free + prefetch: compare after flushing a copy.
        proto::OnePass(g.data(), rd.data(), static_cast<uint32_t>(n), t, sd, ud, 64, true,
                       true, true, true);
        std::vector<float> flushed = rd;
        proto::Scratch copy;
        copy.Reserve(n);
        copy.pcnt = sd.pcnt;
        copy.pscale = sd.pscale;
        std::memcpy(copy.pidx.get(), sd.pidx.get(), sd.pcnt * sizeof(uint32_t));
        std::memcpy(copy.pneg.get(), sd.pneg.get(), sd.pcnt);
        copy.Flush(flushed.data());
        if (!SameUpdate(ua, ud) || !SameResidue(ra, flushed)) {
          return absl::StrCat("MISMATCH deferred n=", n, " T=", t, " step ", step);
        }
        if (proto::SupportedAvx512()) {
          proto::OnePass512(g.data(), re.data(), static_cast<uint32_t>(n), t, se, ue);
          std::vector<float> fe = re;
          proto::Scratch c2;
          c2.Reserve(n);
          c2.pcnt = se.pcnt;
          c2.pscale = se.pscale;
          std::memcpy(c2.pidx.get(), se.pidx.get(), se.pcnt * sizeof(uint32_t));
          std::memcpy(c2.pneg.get(), se.pneg.get(), se.pcnt);
          c2.Flush(fe.data());
          if (!SameUpdate(ua, ue) || !SameResidue(ra, fe)) {
            return absl::StrCat("MISMATCH avx512 n=", n, " T=", t, " step ", step);
          }
        }
      }
      g[n / 2] = std::nanf("");
      const std::vector<float> before = rc;
      if (proto::TwoPass(g.data(), rc.data(), static_cast<uint32_t>(n), t, sc, uc) ||
          !SameResidue(before, rc)) {
        return "MISMATCH (two-pass did not refuse a NaN cleanly)";
      }
    }
  }
  return "bit-identical to the library kernel (5 lengths x 2 bin sizes x 6 steps; "
         "two-pass refuses NaN untouched)";
}

void BM_ProtoDecodeAddRice(benchmark::State& state, uint32_t t) {
  Data& d = GetData();
  const Data::PerBin& pb = d.per_bin[t];
  std::vector<float> dst(d.n, 0.0f);
  proto::FastRiceDecoder decoder;
  for (auto _ : state) {
    if (!decoder.DecodeAdd(pb.rice, 0.5f, absl::MakeSpan(dst))) {
      state.SkipWithError("prototype decoder rejected a valid update");
      return;
    }
    benchmark::ClobberMemory();
  }
  SetCodecCounters(state, d, pb, pb.rice.size());
}

// The prototype decoder must add exactly what DecodeAdd adds, and refuse what it refuses
// (every truncation, and a flipped bit wherever DecodeAdd rejects it).
std::string CheckDecoder() {
  const size_t n = 200'003;
  bench::GradientStream stream(bench::GradientStream::Tuned1Percent(n, 3));
  std::vector<float> g(n);
  SliceState st(n);
  CompressorOptions o;
  o.bin_size = 50;
  auto c = MakeCompressor(o);
  CompressedUpdate u;
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 5; ++i) {
    stream.Next(absl::MakeSpan(g));
    if (!(*c)->Compress(g, st, u).ok()) return "compress failed";
  }
  if (!EncodeUpdate(u, IndexCoding::kRice, &bytes).ok()) return "encode failed";
  proto::FastRiceDecoder fast;
  std::vector<float> a(n, 1.0f), b(n, 1.0f);
  if (!DecodeAdd(bytes, 0.25f, absl::MakeSpan(a)).ok() ||
      !fast.DecodeAdd(bytes, 0.25f, absl::MakeSpan(b)) || !SameResidue(a, b)) {
    return "MISMATCH on a valid update";
  }
  for (size_t cut = 0; cut < bytes.size(); cut += 1 + cut / 16) {
    absl::Span<const uint8_t> part(bytes.data(), cut);
    if (fast.DecodeAdd(part, 1.0f, absl::MakeSpan(b))) return "accepted a truncated update";
  }
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> bad = bytes;
    bad[rng() % bad.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    std::vector<float> x(n, 0.0f), y(n, 0.0f);
    const bool ok_lib = DecodeAdd(bad, 1.0f, absl::MakeSpan(x)).ok();
    const bool ok_fast = fast.DecodeAdd(bad, 1.0f, absl::MakeSpan(y));
    if (ok_lib != ok_fast || !SameResidue(x, y)) {
      return absl::StrCat("DISAGREES with DecodeAdd on corrupt input (trial ", trial, ")");
    }
  }
  return "same sums as DecodeAdd; same verdict on every truncation and 2000 bit flips";
}

// Collects every iteration run's counters by name, for the summary (median over repetitions).
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      auto& m = values_[run.run_name.str()];
      for (const auto& [key, counter] : run.counters) m[key].push_back(counter.value);
    }
  }

  // Median of a counter of a benchmark; NaN when absent.
  double Get(const std::string& name, const std::string& counter) const {
    auto it = values_.find(name);
    if (it == values_.end()) return std::nan("");
    auto jt = it->second.find(counter);
    if (jt == it->second.end() || jt->second.empty()) return std::nan("");
    std::vector<double> v = jt->second;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }

 private:
  std::map<std::string, std::map<std::string, std::vector<double>>> values_;
};

const char* CodingName(IndexCoding c) { return c == IndexCoding::kRice ? "rice" : "plain32"; }

void RegisterAll() {
  benchmark::RegisterBenchmark("plain_pass", BM_PlainPass)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("nan_scan", BM_AllFinite)->Unit(benchmark::kMillisecond);
  for (uint32_t t : kBinSizes) {
    const std::string ts = absl::StrCat("/T:", t);
    benchmark::RegisterBenchmark(("adacomp_compress" + ts).c_str(), BM_AdaCompCompress, t)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("adacomp_compress_sliced250k" + ts).c_str(),
                                 BM_AdaCompCompressSliced, t, size_t{250'000})
        ->Unit(benchmark::kMillisecond);
    using internal::AdaCompIsa;
    using internal::AdaCompStores;
    for (const auto& [name, isa, stores] :
         {std::tuple{"avx512_nt", AdaCompIsa::kAvx512, AdaCompStores::kStreaming},
          std::tuple{"avx512_st", AdaCompIsa::kAvx512, AdaCompStores::kRegular},
          std::tuple{"avx2_nt", AdaCompIsa::kAvx2, AdaCompStores::kStreaming},
          std::tuple{"avx2_st", AdaCompIsa::kAvx2, AdaCompStores::kRegular},
          std::tuple{"portable", AdaCompIsa::kPortable, AdaCompStores::kRegular}}) {
      benchmark::RegisterBenchmark(absl::StrCat("adacomp_step_", name, ts).c_str(),
                                   BM_AdaCompStep, t, isa, stores)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (uint32_t t : kBinSizes) {
    const std::string ts = absl::StrCat("/T:", t);
    // The proposed AVX2 kernel: deferred fix-up, masked tails, prefetch at large T.
    ProtoVariant best;
    best.prefetch = t >= 128 ? kProtoPrefetch : 0;
    ProtoVariant best_scan = best;
    best_scan.scan = true;
    benchmark::RegisterBenchmark(("proto_onepass" + ts).c_str(), BM_ProtoOnePass, t, best)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("proto_compress" + ts).c_str(), BM_ProtoOnePass, t,
                                 best_scan)
        ->Unit(benchmark::kMillisecond);
    if (g_diagnostics) {
      // One change at a time from the library's structure (eager sparse fix-up, no
      // prefetch, branch per group), to attribute the gain.
      ProtoVariant base;
      base.prefetch = 0;
      base.deferred = false;
      auto reg = [&](const std::string& what, ProtoVariant v) {
        benchmark::RegisterBenchmark(("diag_" + what + ts).c_str(), BM_ProtoOnePass, t, v)
            ->Unit(benchmark::kMillisecond);
      };
      reg("base", base);
      for (uint32_t pf : {512u, 2048u, 8192u}) {
        ProtoVariant v = base;
        v.prefetch = pf;
        reg(absl::StrCat("pf", pf), v);
      }
      ProtoVariant v = base;
      v.branchless = true;
      reg("branchless", v);
      v = base;
      v.deferred = true;
      reg("deferred", v);
      v = best;
      v.deferred = false;
      v.fixup = false;
      reg("nofixup(wrong)", v);
      v.select = false;
      reg("noselect(wrong)", v);
    }
    benchmark::RegisterBenchmark(("proto512_onepass" + ts).c_str(), BM_ProtoAvx512, t, false)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("proto512_compress" + ts).c_str(), BM_ProtoAvx512, t, true)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("proto_twopass" + ts).c_str(), BM_ProtoTwoPass, t)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("topk/0.1%", BM_TopK)->Unit(benchmark::kMillisecond);
  for (uint32_t t : kBinSizes) {
    for (IndexCoding c : {IndexCoding::kRice, IndexCoding::kPlain32}) {
      const std::string suffix = absl::StrCat("_", CodingName(c), "/T:", t);
      benchmark::RegisterBenchmark(("encode" + suffix).c_str(), BM_Encode, t, c)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("decode_add" + suffix).c_str(), BM_DecodeAdd, t, c)
          ->Unit(benchmark::kMicrosecond);
      if (c == IndexCoding::kRice) {
        benchmark::RegisterBenchmark(absl::StrCat("proto_decode_add_rice/T:", t).c_str(),
                                     BM_ProtoDecodeAddRice, t)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

void PrintSummary(const SummaryReporter& rep, const std::string& proto_check,
                  const std::string& decoder_check) {
  const double plain = rep.Get("plain_pass", "items_per_second");
  const double topk = rep.Get("topk/0.1%", "items_per_second");
  std::printf("\n== Summary: %zu floats, one core, CPU time, median over repetitions ==\n",
              g_elements);
  std::printf("AdaComp kernel: %s. Stream: bench/gradient_stream.h defaults, seed 42.\n",
              internal::AdaCompIsaName(internal::AdaCompIsa::kAuto));
  std::printf("%-32s %8s %9s %9s %9s\n", "compress (one step)", "G el/s", "vs plain",
              "vs top-k", "density");
  auto row = [&](const std::string& label, const std::string& name) {
    const double v = rep.Get(name, "items_per_second");
    if (std::isnan(v)) return;
    double density = rep.Get(name, "density");
    if (name.rfind("topk", 0) == 0) density = kTopKFraction;
    const std::string dens =
        std::isnan(density) || density == 0.0 ? "-" : absl::StrFormat("%.3f%%", 100.0 * density);
    std::printf("%-32s %8.3f %9.2f %9.1f %9s\n", label.c_str(), v / 1e9, v / plain, v / topk,
                dens.c_str());
  };
  row("plain pass r+=g (12 B/el)", "plain_pass");
  row("NaN/Inf scan alone (4 B/el)", "nan_scan");
  row("top-k 0.1% (exact, nth_element)", "topk/0.1%");
  for (uint32_t t : kBinSizes) {
    const std::string ts = absl::StrCat("/T:", t);
    row("adacomp Compress" + ts, "adacomp_compress" + ts);
    row("adacomp Compress, 250k slices" + ts, "adacomp_compress_sliced250k" + ts);
    for (const char* k : {"avx512_nt", "avx512_st", "avx2_nt", "avx2_st", "portable"}) {
      row(absl::StrCat("adacomp step ", k, ts), absl::StrCat("adacomp_step_", k, ts));
    }
    row("proto one-pass (no scan)" + ts, "proto_onepass" + ts);
    row("proto Compress (+NaN scan)" + ts, "proto_compress" + ts);
    row("proto two-pass (+NaN check)" + ts, "proto_twopass" + ts);
    row("proto AVX-512 (no scan)" + ts, "proto512_onepass" + ts);
    row("proto AVX-512 (+NaN scan)" + ts, "proto512_compress" + ts);
    for (const char* diag : {"base", "pf512", "pf2048", "pf8192", "branchless", "deferred",
                             "nofixup(wrong)", "noselect(wrong)"}) {
      row(absl::StrCat("  diag ", diag, ts), absl::StrCat("diag_", diag, ts));
    }
  }
  std::printf("prototype kernels: %s\n", proto_check.c_str());

  std::printf("\n%-28s %12s %13s %8s %9s\n", "wire codec", "M sent el/s", "G dense el/s",
              "bits/el", "density");
  for (uint32_t t : kBinSizes) {
    for (const char* op : {"encode", "decode_add", "proto_decode_add"}) {
      for (IndexCoding c : {IndexCoding::kRice, IndexCoding::kPlain32}) {
        const std::string name = absl::StrCat(op, "_", CodingName(c), "/T:", t);
        const double v = rep.Get(name, "items_per_second");
        if (std::isnan(v)) continue;
        std::printf("%-28s %12.1f %13.2f %8.2f %8.3f%%\n", name.c_str(), v / 1e6,
                    rep.Get(name, "dense_el/s") / 1e9, rep.Get(name, "bits/el"),
                    100.0 * rep.Get(name, "density"));
      }
    }
  }

  std::printf("prototype decoder: %s\n", decoder_check.c_str());
  std::printf("\ntargets (issue 2, one core):\n");
  auto target = [](const std::string& what, double got, double want, const char* unit) {
    if (std::isnan(got)) return;
    std::printf("  %-40s %7.2f %-7s (target >= %.1f) %s\n", what.c_str(), got, unit, want,
                got >= want ? "MET" : "MISSED");
  };
  for (uint32_t t : kBinSizes) {
    const double want = t == 50 ? 0.6 : 1.0;
    const std::string ts = absl::StrCat(" T=", t);
    const double full = rep.Get(absl::StrCat("adacomp_compress/T:", t), "items_per_second");
    target("AdaComp Compress" + ts, full / 1e9, want, "G el/s");
    target("AdaComp Compress / top-k" + ts, full / topk, 8.0, "x");
  }
  const double bits = rep.Get("encode_rice/T:500", "bits/el");
  if (!std::isnan(bits)) {
    std::printf("  %-40s %7.2f %-7s (target <= 12 at %.2f%% density) %s\n",
                "rice bits per sent element, ~1% stream", bits, "bits",
                100.0 * rep.Get("encode_rice/T:500", "density"), bits <= 12.0 ? "MET" : "MISSED");
  }
}

}  // namespace
}  // namespace adaps

int main(int argc, char** argv) {
  // Take out our own flag, then hand the rest to Google Benchmark.
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const char* kFlag = "--elements=";
    if (i > 0 && std::strncmp(argv[i], kFlag, std::strlen(kFlag)) == 0) {
      adaps::g_elements = std::strtoull(argv[i] + std::strlen(kFlag), nullptr, 10);
      continue;
    }
    if (i > 0 && std::strcmp(argv[i], "--diagnostics") == 0) {
      adaps::g_diagnostics = true;
      continue;
    }
    args.push_back(argv[i]);
  }
  int new_argc = static_cast<int>(args.size());
  benchmark::Initialize(&new_argc, args.data());
  if (benchmark::ReportUnrecognizedArguments(new_argc, args.data())) return 1;
  if (adaps::g_elements < 1000) {
    std::fprintf(stderr, "--elements must be at least 1000\n");
    return 1;
  }
  adaps::RegisterAll();
  const std::string proto_check = adaps::CheckPrototypes();
  const std::string decoder_check = adaps::CheckDecoder();
  adaps::SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  adaps::PrintSummary(reporter, proto_check, decoder_check);
  benchmark::Shutdown();
  return 0;
}
