// The AdaComp pass kernels (docs/algorithm.md; design notes in docs/gpu.md). The
// decompress-and-add kernels and the dense finiteness check are in add_kernels.cu.
//
// Fused pass (bin size T <= kTileCap): PassKernel, one thread block per tile of K whole bins
// (K*T <= 2048 elements; block i takes tile i). The block streams the residue and the gradient
// once (coalesced: thread t owns element t of each of 8 rows of 256), applies the previous
// step's deferred fix-up, adds the gradient, writes the residue back, takes the per-bin maxima in
// shared memory (warp reductions, one shared atomic per warp row and bin), selects with ballots
// and writes the selection as bitmask words (one bit per element: the next pass's fix-up) with a
// second bitmask of the selected elements' signs, the tile's count and the sum of its bin maxima
// in a fixed tree order. No block waits for another. FinalizeKernel (one block) then scans the
// tiles' counts into output offsets, sums the tile sums into the scale and publishes the step;
// ScatterKernel (a warp per tile) writes the indices and signs in ascending order from the two
// bitmasks. Selected elements are a few percent, so the bitmasks cost 1/16 of the residue's
// traffic; in exchange no block spins on another's status word, and the pass runs at 6 blocks
// per SM (40 registers), measured against the single-kernel decoupled look-back it replaced in
// docs/gpu.md ("Variants").
//
// General path (T > kTileCap): UpdateMaxKernel updates the residue and takes bin maxima with
// global atomics; PassKernel<false> selects exactly like the fused kernel, reading the maxima
// from global memory; FinalizeKernel and ScatterKernel as above.
//
// Double buffering: the pass reads the residue and the bitmask of the active set and writes the
// new residue and selection into the other set; NaN/Inf in the gradient and in residue +
// gradient are flagged per warp as the data streams by, and FinalizeKernel switches the active
// set only when no warp flagged anything (a two-phase pass stages it instead, for the caller
// to commit or discard once every slice of the push is done). There is no separate finiteness
// pass.
//
// Floating point: only adds, comparisons and maxima touch the data, each rounded exactly as on
// the CPU (IEEE, no fused multiply-add is possible; denormals are kept: no fast-math).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/adacomp_kernels.h"

namespace adaps {
namespace cuda {
namespace kernels {
namespace {

constexpr unsigned kFull = 0xffffffffu;

// Build-time variants, for measuring on a GPU (bench/gpu-variants.sh); the defaults are what
// ships.
#ifndef ADAPS_PASS_MIN_BLOCKS
#define ADAPS_PASS_MIN_BLOCKS 6  // __launch_bounds__ minimum blocks per SM, 8-row tiles
#endif
#ifndef ADAPS_PASS_STREAM_RESIDUE
#define ADAPS_PASS_STREAM_RESIDUE 1  // the residue read and written evict-first (0: cached)
#endif

struct KernelArgs {
  PassArgs p;
  uint32_t bin_magic;  // ceil(2^32 / T) for T >= 2, 0 for T = 1 (BinOf<true>)
};

// e / T for the element offsets of a tile (e * T < 2^32): the high word of e * ceil(2^32 / T),
// or e itself for T = 1 (kUnit).
template <bool kUnit>
__device__ __forceinline__ uint32_t BinOf(uint32_t e, uint32_t magic) {
  return kUnit ? e : __umulhi(e, magic);
}

__device__ __forceinline__ bool IsNonFinite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

// Sum of `x` over the block in a fixed order (shuffle tree per warp, then warps in order).
// The result is valid in thread 0. Every thread must call it.
__device__ double BlockSumFixedOrder(double x, double* s_red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_down_sync(kFull, x, off);
  if (lane == 0) s_red[warp] = x;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kWarps; ++w) total += s_red[w];
  }
  return total;
}

// The inclusive prefix sum of x over the lanes of a warp (every lane must call it).
__device__ __forceinline__ uint32_t WarpInclusiveScan(uint32_t x) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t t = __shfl_up_sync(kFull, x, off);
    if ((threadIdx.x & 31) >= static_cast<unsigned>(off)) x += t;
  }
  return x;
}

// Thread `tid`'s share of the scale (StridedSum with kStride threads): the tiles' sums of bin
// maxima (fused), or the bins' maxima themselves (general path).
template <int kStride, bool kFused>
__device__ __forceinline__ double ScaleShare(const PassArgs& p, uint32_t tid) {
  if constexpr (kFused) {
    return StridedSum<kStride>(tid, p.layout.num_tiles, [&](uint32_t j) { return p.tile_sums[j]; });
  } else {
    return StridedSum<kStride>(tid, p.layout.num_bins, [&](uint32_t j) {
      return static_cast<double>(__uint_as_float(p.gmax[j]));
    });
  }
}

// cnt - first, or 0 when first >= cnt: of a tile of cnt elements, how many lie at or after
// element `first`.
__device__ __forceinline__ uint32_t RowsLeft(uint32_t cnt, uint32_t first) {
  return first < cnt ? cnt - first : 0u;
}

// Loads the tile's gradient and residue (set `in`), applies the pending fix-up `sp` recorded in
// `bits`, adds the gradient and stores the new residue (set `out`). v[k], g[k] hold element
// k * kBlock + threadIdx.x of the tile; bad_v is set when this thread saw a non-finite
// residue + gradient (a non-finite gradient makes it non-finite too: FlagFailures tells them
// apart, on the rare warp that saw one). Per-thread base pointers, so that each row's access is
// an immediate offset.
template <int kR>
__device__ __forceinline__ void LoadUpdateStore(const float* grad, const float* in, float* out,
                                                float sp, uint32_t lo, uint32_t cnt,
                                                const uint32_t* bits, float (&v)[kR],
                                                float (&g)[kR], bool& bad_v) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* gp = grad + lo + tid;
  const float* ip = in + lo + tid;
  float* op = out + lo + tid;
  const uint32_t* bp = bits + warp;
  const uint32_t left = RowsLeft(cnt, tid);  // elements of the tile from this thread's first
  const uint32_t wleft = RowsLeft(cnt, warp * 32);
  float r[kR];
  unsigned old[kR];
#pragma unroll
  for (int k = 0; k < kR; ++k) {
    g[k] = 0.0f;
    r[k] = 0.0f;
    old[k] = 0u;
    if (static_cast<uint32_t>(k * kBlock) < left) {
      g[k] = __ldcs(gp + k * kBlock);
#if ADAPS_PASS_STREAM_RESIDUE
      r[k] = __ldcs(ip + k * kBlock);
#else
      r[k] = ip[k * kBlock];
#endif
    }
    if (static_cast<uint32_t>(k * kBlock) < wleft) old[k] = bp[k * kWarps];
  }
#pragma unroll
  for (int k = 0; k < kR; ++k) {
    float x = r[k];
    if ((old[k] >> lane) & 1u) x = x < 0.0f ? __fadd_rn(x, sp) : __fsub_rn(x, sp);
    v[k] = __fadd_rn(x, g[k]);
    if (static_cast<uint32_t>(k * kBlock) < left) {
      bad_v |= IsNonFinite(v[k]);
#if ADAPS_PASS_STREAM_RESIDUE
      __stcs(op + k * kBlock, v[k]);
#else
      op[k * kBlock] = v[k];
#endif
    }
  }
}

// Raises the header's failure flags: one atomic per warp that saw a failure (rare), no barrier.
// A warp with a non-finite residue + gradient looks again at its gradients, to tell a NaN/Inf
// gradient (nonfinite) from an overflow. FinalizeKernel reads the flags after the pass (the
// kernel boundary orders them). Every lane of the warp must call it.
template <int kR>
__device__ __forceinline__ void FlagFailures(Header* h, bool bad_v, const float (&g)[kR],
                                             uint32_t cnt) {
  if (!__any_sync(kFull, bad_v)) return;
  const uint32_t left = RowsLeft(cnt, threadIdx.x);
  bool bad_g = false;
#pragma unroll
  for (int k = 0; k < kR; ++k) {
    if (static_cast<uint32_t>(k * kBlock) < left) bad_g |= IsNonFinite(g[k]);
  }
  const bool any_g = __any_sync(kFull, bad_g);
  if ((threadIdx.x & 31) == 0) {
    if (any_g) atomicOr(&h->nonfinite, 1u);
    atomicOr(&h->overflow, 1u);
  }
}

constexpr int MinBlocksFor(int rows) {
  return rows <= 8 ? ADAPS_PASS_MIN_BLOCKS : (rows <= 12 ? 3 : 2);
}

// The maximum of |v| over the lanes of one warp row, per bin, into gmax[] (shared or global).
// `b` is this lane's bin, `b0` lane 0's. With T >= 32 a row meets at most two bins: two warp
// reductions, always (a branch on whether the row spans two bins made the compiler wrap each
// reduction in a divergence-safe loop, measured on the H200: docs/gpu.md "Variants"); with
// T < 32, an atomic per lane. `bin_size` is the same for the whole grid, so the branch is
// uniform.
__device__ __forceinline__ void RowMax(unsigned* gmax, uint32_t b, uint32_t b0, unsigned a,
                                       uint32_t bin_size) {
  if (bin_size >= 32u) {
    const unsigned m0 = __reduce_max_sync(kFull, b == b0 ? a : 0u);
    const unsigned m1 = __reduce_max_sync(kFull, b != b0 ? a : 0u);
    if ((threadIdx.x & 31) == 0) {
      if (m0 != 0u) atomicMax(gmax + b0, m0);
      if (m1 != 0u) atomicMax(gmax + b0 + 1, m1);
    }
  } else if (a != 0u) {
    atomicMax(gmax + b, a);
  }
}

// The pass over one tile per block (block i: tile i): residue update, bin maxima (fused), the
// selection as bitmask words (bits_out: selected; neg_bits: selected and negative), the tile's
// selection count (counts[tile]) and, fused, the sum of its bin maxima (tile_sums[tile]). No
// block waits for another: the output offsets, the scale and the indices come after, in
// FinalizeKernel and ScatterKernel.
// (T = 1, kUnit: 4 blocks per SM; at 6 its 40 registers spilled 8 bytes.)
template <bool kFused, int kR, bool kUnit = false>
__global__ void __launch_bounds__(kBlock, kUnit ? 4 : MinBlocksFor(kR)) PassKernel(KernelArgs ka) {
  const PassArgs& p = ka.p;
  constexpr int kWpt = kR * kWarps;  // bitmask words per tile
  __shared__ unsigned s_gmax[kFused ? kMaxBinsPerTile : 1];
  __shared__ unsigned s_cnt[kWarps];
  __shared__ double s_red[kWarps];

  const unsigned a = p.ctl->active & 1u;  // the same in every block: FinalizeKernel flips it
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t T = p.bin_size;
  const uint32_t tile = blockIdx.x;
  const uint32_t E = p.layout.tile_elems;
  const uint32_t lo = tile * E;
  const uint32_t cnt = min(E, p.n - lo);
  const size_t word0 = static_cast<size_t>(tile) * kWpt;

  float v[kR], g[kR];
  if constexpr (kFused) {
    for (uint32_t j = tid; j < p.layout.bins_per_tile; j += kBlock) s_gmax[j] = 0u;
    bool bad_v = false;
    LoadUpdateStore<kR>(p.grad, p.residue[a], p.residue[a ^ 1u], p.ctl->pending_scale[a], lo,
                        cnt, p.bits[a] + word0, v, g, bad_v);
    FlagFailures<kR>(p.header, bad_v, g, cnt);
    __syncthreads();  // s_gmax zeroed
#pragma unroll
    for (int k = 0; k < kR; ++k) {  // a row past the tile has every mag 0: no atomic
      const uint32_t row = k * kBlock + warp * 32;
      const uint32_t e = row + lane;
      const uint32_t b0 = BinOf<kUnit>(row, ka.bin_magic);
      const bool valid = e < cnt;
      const uint32_t b = valid ? BinOf<kUnit>(e, ka.bin_magic) : b0;
      const unsigned mag = valid ? __float_as_uint(fabsf(v[k])) : 0u;
      RowMax(s_gmax, b, b0, mag, T);
    }
    __syncthreads();  // s_gmax complete
  } else {
    // The residue was updated (into set a ^ 1) and the failures flagged by UpdateMaxKernel.
#pragma unroll
    for (int k = 0; k < kR; ++k) {
      const uint32_t e = k * kBlock + tid;
      v[k] = 0.0f;
      g[k] = 0.0f;
      if (e < cnt) {
        v[k] = p.residue[a ^ 1u][lo + e];
        g[k] = __ldcs(p.grad + lo + e);
      }
    }
  }

  // Selection: gmax[b] > 0, G != 0, |G + g| >= gmax[b].
  const uint32_t gbin_lo = kFused ? 0u : lo / T;
  const uint64_t gnext = (static_cast<uint64_t>(gbin_lo) + 1u) * T;
  uint32_t* bits_out = p.bits[a ^ 1u] + word0;
  uint32_t* neg_out = p.neg_bits + word0;
  unsigned selected = 0u;
#pragma unroll
  for (int k = 0; k < kR; ++k) {
    const uint32_t e = k * kBlock + tid;
    bool sel = false;
    if (e < cnt) {
      float m;
      if constexpr (kFused) {
        m = __uint_as_float(s_gmax[BinOf<kUnit>(e, ka.bin_magic)]);
      } else {
        const uint32_t b = (static_cast<uint64_t>(lo) + e >= gnext) ? gbin_lo + 1 : gbin_lo;
        m = __uint_as_float(__ldg(p.gmax + b));
      }
      sel = m > 0.0f && v[k] != 0.0f && fabsf(__fadd_rn(v[k], g[k])) >= m;
    }
    const unsigned ball = __ballot_sync(kFull, sel);
    const unsigned neg = __ballot_sync(kFull, sel && v[k] < 0.0f);
    if (lane == 0) {
      bits_out[k * kWarps + warp] = ball;
      neg_out[k * kWarps + warp] = neg;
      selected += __popc(ball);
    }
  }
  if (lane == 0) s_cnt[warp] = selected;

  // This tile's share of the scale: its bin maxima, summed in a fixed order.
  double part = 0.0;
  if constexpr (kFused) {
    const uint32_t nbins = (cnt + T - 1) / T;
    for (uint32_t j = tid; j < nbins; j += kBlock) part += static_cast<double>(__uint_as_float(s_gmax[j]));
  }
  const double tile_sum = BlockSumFixedOrder(part, s_red);  // also publishes s_cnt
  if (tid == 0) {
    unsigned total = 0u;
    for (int w = 0; w < kWarps; ++w) total += s_cnt[w];
    p.counts[tile] = total;
    if (kFused) p.tile_sums[tile] = tile_sum;
    if (tile == 0) p.header->out_set = a ^ 1u;  // for ScatterKernel (and the small path's end)
  }
}

// The end of a pass, one block of kFinalBlock threads after every tile's block (the stream
// orders them): the tiles' output offsets (an exclusive scan of counts[], in place; thread t
// takes a contiguous range of tiles), the scale from the tiles' sums (fused) or the bins'
// maxima (general path) in a fixed order, then PublishPass. Slices of more than kSmallTiles
// tiles only; the smaller ones end in ScatterKernel<true>.
constexpr int kFinalBlock = 1024;
template <bool kFused>
__global__ void __launch_bounds__(kFinalBlock) FinalizeKernel(KernelArgs ka) {
  const PassArgs& p = ka.p;
  __shared__ double s_red[kFinalBlock / 32];
  __shared__ uint32_t s_warp[kFinalBlock / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned a = (p.header->out_set & 1u) ^ 1u;  // the set the pass read
  const uint32_t nt = p.layout.num_tiles;

  // The scale: thread t adds the terms t, t + kFinalBlock, ... in order (StridedSum), then a
  // shuffle tree in each warp, then thread 0 the warps' sums in warp order. Fixed, so the
  // scale is the same bits run to run.
  double acc = ScaleShare<kFinalBlock, kFused>(p, tid);
  // The counts of tiles [first, last), issued 8 at a time (L2 round trips).
  const uint32_t per = (nt + kFinalBlock - 1) / kFinalBlock;
  const uint32_t first = min(nt, tid * per), last = min(nt, first + per);
  constexpr int kU = 8;
  uint32_t mine = 0u;
  for (uint32_t j = first; j < last; j += kU) {
    uint32_t x[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) x[u] = j + u < last ? p.counts[j + u] : 0u;
#pragma unroll
    for (int u = 0; u < kU; ++u) mine += x[u];
  }
  const uint32_t incl = WarpInclusiveScan(mine);
  if (lane == 31) s_warp[warp] = incl;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(kFull, acc, off);
  if (lane == 0) s_red[warp] = acc;
  __syncthreads();
  uint32_t run = incl - mine;
  uint32_t total = 0u;
  for (int w = 0; w < kFinalBlock / 32; ++w) {
    if (w < warp) run += s_warp[w];
    total += s_warp[w];
  }
  for (uint32_t j = first; j < last; ++j) {
    const uint32_t c = p.counts[j];
    p.counts[j] = run;
    run += c;
  }
  if (tid == 0) {
    double gsum = 0.0;
    for (int w = 0; w < kFinalBlock / 32; ++w) gsum += s_red[w];
    const bool failed = p.header->nonfinite != 0u || p.header->overflow != 0u;
    // On failure the step did not happen: set a stays active with its residue and fix-up.
    const float s = static_cast<float>(gsum / static_cast<double>(p.layout.num_bins));
    PublishPass(p.ctl, p.header, a, failed, p.two_phase, s, failed ? 0u : total);
  }
}

// Slices of at most this many tiles (1M elements at T = 500) skip FinalizeKernel: each warp of
// ScatterKernel<true> sums the counts before its tile itself (at most 16 loads a lane), and its
// block 0 ends the pass. One launch less: measured on the H200, that is what made 1M- and
// 250k-element slices slower than the single-kernel pass this replaced (docs/gpu.md).
constexpr uint32_t kSmallTiles = 512;

// The indices and signs, ascending: warp w of block i takes tile i * kWarps + w, its words in
// order (word j of a tile holds elements j * 32 .. j * 32 + 31), from the tile's offset.
// Nothing after a failed pass. kSmall: the offsets are not scanned yet (see kSmallTiles), and
// block 0 also sums the scale (the fixed order of a kBlock-thread StridedSum and
// BlockSumFixedOrder; kFused: tile sums, else the bins' maxima) and the count, and publishes.
template <bool kSmall, bool kFused = true>
__global__ void __launch_bounds__(kBlock) ScatterKernel(KernelArgs ka) {
  const PassArgs& p = ka.p;
  Header* h = p.header;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t nt = p.layout.num_tiles;
  const unsigned out_set = h->out_set & 1u;
  bool failed;
  if constexpr (kSmall) {
    failed = h->nonfinite != 0u || h->overflow != 0u;  // raised by the pass (kernel boundary)
    if (blockIdx.x == 0) {
      __shared__ double s_red[kWarps];
      __shared__ uint32_t s_cnt[kWarps];
      const double acc = ScaleShare<kBlock, kFused>(p, tid);
      uint32_t c = 0u;
      for (uint32_t j = tid; j < nt; j += kBlock) c += p.counts[j];
      c = __reduce_add_sync(kFull, c);
      if (lane == 0) s_cnt[warp] = c;
      const double gsum = BlockSumFixedOrder(acc, s_red);  // also publishes s_cnt
      if (tid == 0) {
        uint32_t total = 0u;
        for (int w = 0; w < kWarps; ++w) total += s_cnt[w];
        const float s = static_cast<float>(gsum / static_cast<double>(p.layout.num_bins));
        PublishPass(p.ctl, h, out_set ^ 1u, failed, p.two_phase, s, failed ? 0u : total);
      }
    }
  } else {
    failed = h->ok == 0u;
  }
  const uint32_t tile = blockIdx.x * kWarps + warp;
  if (failed || tile >= nt) return;  // warp-uniform
  const uint32_t wpt = p.layout.rows * static_cast<uint32_t>(kWarps);  // words_per_tile()
  const size_t word0 = static_cast<size_t>(tile) * wpt;
  const uint32_t* bits = (out_set != 0u ? p.bits[1] : p.bits[0]) + word0;  // no local copy
  const uint32_t* neg = p.neg_bits + word0;
  const uint32_t lo = tile * p.layout.tile_elems;
  uint32_t base;
  if constexpr (kSmall) {
    uint32_t before = 0u;
    for (uint32_t j = lane; j < tile; j += 32) before += p.counts[j];
    base = __reduce_add_sync(kFull, before);
  } else {
    base = p.counts[tile];
  }
  constexpr int kGroups = kMaxRows * kWarps / 32;  // a tile's words, 32 at a time
  uint32_t wv[kGroups], nv[kGroups];
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {  // every load before the first use
    const uint32_t j = i * 32u + lane;
    wv[i] = j < wpt ? bits[j] : 0u;
    nv[i] = j < wpt ? neg[j] : 0u;
  }
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    if (static_cast<uint32_t>(i * 32) >= wpt) break;  // wpt is a multiple of 32
    const uint32_t j = i * 32u + lane;
    uint32_t w = wv[i];
    const uint32_t nw = nv[i];
    const uint32_t c = __popc(w);
    const uint32_t incl = WarpInclusiveScan(c);
    uint32_t pos = base + incl - c;
    while (w != 0u) {
      const int b = __ffs(w) - 1;
      p.out_indices[pos] = lo + j * 32u + b;
      p.out_negative[pos] = static_cast<uint8_t>((nw >> b) & 1u);
      ++pos;
      w &= w - 1u;
    }
    base += __shfl_sync(kFull, incl, 31);
  }
}

// General path, first kernel: residue update and bin maxima with global atomics (T > kTileCap,
// so a tile meets at most two bins).
__global__ void __launch_bounds__(kBlock, 4) UpdateMaxKernel(KernelArgs ka) {
  const PassArgs& p = ka.p;
  const unsigned a = p.ctl->active & 1u;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t tile = blockIdx.x;
  const uint32_t lo = tile * static_cast<uint32_t>(kTileCap);
  const uint32_t cnt = min(static_cast<uint32_t>(kTileCap), p.n - lo);
  const uint32_t* bits = p.bits[a] + static_cast<size_t>(tile) * (kRows * kWarps);
  float v[kRows], g[kRows];
  bool bad_v = false;
  LoadUpdateStore<kRows>(p.grad, p.residue[a], p.residue[a ^ 1u], p.ctl->pending_scale[a], lo,
                         cnt, bits, v, g, bad_v);
  FlagFailures<kRows>(p.header, bad_v, g, cnt);
  const uint32_t T = p.bin_size;
  const uint32_t bin_lo = lo / T;
  const uint64_t next = (static_cast<uint64_t>(bin_lo) + 1u) * T;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {  // a row past the tile has every mag 0: no atomic
    const uint32_t row = k * kBlock + warp * 32;
    const uint32_t e = row + lane;
    const uint32_t b0 = (static_cast<uint64_t>(lo) + row >= next) ? bin_lo + 1 : bin_lo;
    const bool valid = e < cnt;
    const uint32_t b =
        valid ? ((static_cast<uint64_t>(lo) + e >= next) ? bin_lo + 1 : bin_lo) : b0;
    const unsigned mag = valid ? __float_as_uint(fabsf(v[k])) : 0u;
    RowMax(p.gmax, b, b0, mag, T);
  }
}

// After the pass kernel(s) of `grid` tiles: the end and the scatter, or for small slices the
// scatter alone, which ends the pass itself (kSmallTiles).
template <bool kFused>
void LaunchEnd(const KernelArgs& ka, unsigned grid, cudaStream_t stream) {
  const unsigned scatter_grid = (grid + kWarps - 1) / kWarps;
  if (grid <= kSmallTiles) {
    ScatterKernel<true, kFused><<<scatter_grid, kBlock, 0, stream>>>(ka);
    return;
  }
  FinalizeKernel<kFused><<<1, kFinalBlock, 0, stream>>>(ka);
  ScatterKernel<false><<<scatter_grid, kBlock, 0, stream>>>(ka);
}

unsigned Gcd(unsigned a, unsigned b) {
  while (b != 0u) {
    const unsigned t = a % b;
    a = b;
    b = t;
  }
  return a;
}

uint32_t BinsPerTile(uint32_t t, uint32_t cap, bool align) {
  const uint32_t kmax = cap / t;
  if (!align) return kmax;
  const uint32_t step = 8u / Gcd(t, 8u);
  uint32_t k = (kmax / step) * step;
  if (k == 0 || static_cast<uint64_t>(k) * 8u < static_cast<uint64_t>(kmax) * 7u) k = kmax;
  return k;
}

}  // namespace

Layout MakeLayout(uint32_t n, uint32_t bin_size) {
  Layout l;
  const uint32_t t = bin_size;
  l.num_bins = n == 0 ? 0 : (n - 1) / t + 1;
  if (t <= static_cast<uint32_t>(kTileCap)) {
    l.fused = true;
    l.rows = kRows;
    l.bins_per_tile = BinsPerTile(t, kTileCap, true);
    // 1024 < T <= 2048: one bin per 2048-element tile idles up to half of the block; take 12
    // or 16 rows when they hold more of the block busy (at least 3/4 of it for every such T).
    if (t > static_cast<uint32_t>(kTileCap) / 2) {
      uint64_t best = static_cast<uint64_t>(l.bins_per_tile) * t * 16u / kRows;  // busy / row
      for (uint32_t rows : {12u, 16u}) {
        const uint32_t k = BinsPerTile(t, rows * kBlock, false);
        const uint64_t busy = static_cast<uint64_t>(k) * t * 16u / rows;
        if (busy > best) {
          best = busy;
          l.rows = rows;
          l.bins_per_tile = k;
        }
      }
    }
    l.tile_elems = l.bins_per_tile * t;
  } else {
    l.fused = false;
    l.rows = kRows;
    l.bins_per_tile = 0;
    l.tile_elems = kTileCap;
  }
  l.num_tiles = n == 0 ? 0 : (n - 1) / l.tile_elems + 1;
  return l;
}

cudaError_t LaunchAdaCompPass(const PassArgs& args, cudaStream_t stream) {
  if (args.layout.num_tiles == 0) return cudaSuccess;
  KernelArgs ka;
  ka.p = args;
  ka.bin_magic = args.bin_size <= 1u ? 0u
      : static_cast<uint32_t>(((uint64_t{1} << 32) + args.bin_size - 1) / args.bin_size);
  const unsigned grid = args.layout.num_tiles;
  if (!args.layout.fused) {
    UpdateMaxKernel<<<grid, kBlock, 0, stream>>>(ka);
    PassKernel<false, kRows><<<grid, kBlock, 0, stream>>>(ka);
    LaunchEnd<false>(ka, grid, stream);
  } else {
    if (args.layout.rows == 16u) {
      PassKernel<true, 16><<<grid, kBlock, 0, stream>>>(ka);
    } else if (args.layout.rows == 12u) {
      PassKernel<true, 12><<<grid, kBlock, 0, stream>>>(ka);
    } else if (args.bin_size == 1u) {
      PassKernel<true, kRows, true><<<grid, kBlock, 0, stream>>>(ka);
    } else {
      PassKernel<true, kRows><<<grid, kBlock, 0, stream>>>(ka);
    }
    LaunchEnd<true>(ka, grid, stream);
  }
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace cuda
}  // namespace adaps
