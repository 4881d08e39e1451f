// The AdaComp pass kernels (DESIGN.md section 1; design notes in docs/gpu.md). The
// decompress-and-add kernels and the dense finiteness check are in add_kernels.cu.
//
// Fused pass (bin size T <= kTileCap): one thread block per tile of K whole bins (K*T <= 2048
// elements). The block streams the residue and the gradient once (coalesced: thread t owns
// element t of each of 8 rows of 256), applies the previous step's deferred fix-up, adds the
// gradient, writes the residue back, takes the per-bin maxima in shared memory (warp
// reductions, one shared atomic per warp row and bin), selects with ballots, and compacts the
// selected indices in ascending order: per-row/warp counts, a block scan, and a decoupled
// look-back across tiles (tile ids handed out in launch order) give each tile its output
// offset, so the indices are scattered in one pass. Each tile also sums its bin maxima in a
// fixed tree order; the last block to finish sums those and writes the scale. The fix-up of the
// new selection is recorded as a bitmask (one bit per element, the warp ballots) and applied by
// the next pass (or by ApplyPending).
//
// General path (T > kTileCap): one kernel updates the residue and takes bin maxima with global
// atomics; a second selects and compacts exactly like the fused kernel, reading the maxima from
// global memory.
//
// Double buffering: the pass reads the residue and the bitmask of the active set and writes the
// new residue and selection into the other set; NaN/Inf in the gradient and in residue +
// gradient are flagged per block as the data streams by, and the last block switches the active
// set only when no block flagged anything (a two-phase pass stages it instead, for the caller
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
static_assert(kRows * kWarps % 32 == 0, "the block scan gives each lane of warp 0 whole counts");

struct KernelArgs {
  PassArgs p;
  uint64_t bin_magic;  // ceil(2^32 / T): (e * magic) >> 32 == e / T for e * T < 2^32
};

__device__ __forceinline__ bool IsNonFinite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

__device__ __forceinline__ void StoreStatus(unsigned long long* status, uint32_t tile,
                                            unsigned flag, unsigned value) {
  *reinterpret_cast<volatile unsigned long long*>(status + tile) =
      (static_cast<unsigned long long>(flag) << 32) | value;
}

__device__ __forceinline__ unsigned long long LoadStatus(const unsigned long long* status,
                                                         uint32_t tile) {
  return *reinterpret_cast<const volatile unsigned long long*>(status + tile);
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

// Loads the tile's gradient and residue (set `in`), applies the pending fix-up `sp` recorded in
// `bits`, adds the gradient and stores the new residue (set `out`). v[k], g[k] hold element
// k * kBlock + threadIdx.x of the tile; bad_g / bad_v are set when this thread saw a non-finite
// gradient / residue + gradient.
template <int kR>
__device__ __forceinline__ void LoadUpdateStore(const float* grad, const float* in, float* out,
                                                float sp, uint32_t lo, uint32_t cnt,
                                                const uint32_t* bits, float (&v)[kR],
                                                float (&g)[kR], bool& bad_g, bool& bad_v) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float r[kR];
  unsigned old[kR];
#pragma unroll
  for (int k = 0; k < kR; ++k) {
    const uint32_t e = k * kBlock + tid;
    g[k] = 0.0f;
    r[k] = 0.0f;
    old[k] = 0u;
    if (e < cnt) {
      g[k] = __ldcs(grad + lo + e);
      r[k] = in[lo + e];
    }
    if (static_cast<uint32_t>(k * kBlock + warp * 32) < cnt) old[k] = bits[k * kWarps + warp];
  }
#pragma unroll
  for (int k = 0; k < kR; ++k) {
    const uint32_t e = k * kBlock + tid;
    float x = r[k];
    if ((old[k] >> lane) & 1u) x = x < 0.0f ? __fadd_rn(x, sp) : __fsub_rn(x, sp);
    v[k] = __fadd_rn(x, g[k]);
    if (e < cnt) {
      bad_g |= IsNonFinite(g[k]);
      bad_v |= IsNonFinite(v[k]);
      out[lo + e] = v[k];
    }
  }
}

// Raises the header's failure flags for the block (every thread must call it; a barrier).
__device__ __forceinline__ void FlagFailures(Header* h, bool bad_g, bool bad_v) {
  const int any_g = __syncthreads_or(bad_g);
  const int any_v = __syncthreads_or(bad_v);
  if (threadIdx.x == 0) {
    if (any_g) atomicOr(&h->nonfinite, 1u);
    if (any_v) atomicOr(&h->overflow, 1u);
  }
}

constexpr int MinBlocksFor(int rows) { return rows <= 8 ? 4 : (rows <= 12 ? 3 : 2); }

// The maximum of |v| over the lanes of one warp row, per bin, into gmax[] (shared or global).
// `b` is this lane's bin, `b0` lane 0's; the row spans at most two bins when T >= 32.
__device__ __forceinline__ void RowMax(unsigned* gmax, uint32_t b, uint32_t b0, unsigned a,
                                       uint32_t bin_size) {
  const int lane = threadIdx.x & 31;
  if (__all_sync(kFull, b == b0)) {
    const unsigned m = __reduce_max_sync(kFull, a);
    if (lane == 0 && m != 0u) atomicMax(gmax + b0, m);
  } else if (bin_size >= 32) {
    const unsigned m0 = __reduce_max_sync(kFull, b == b0 ? a : 0u);
    const unsigned m1 = __reduce_max_sync(kFull, b != b0 ? a : 0u);
    if (lane == 0) {
      if (m0 != 0u) atomicMax(gmax + b0, m0);
      if (m1 != 0u) atomicMax(gmax + b0 + 1, m1);
    }
  } else if (a != 0u) {
    atomicMax(gmax + b, a);
  }
}

template <bool kFused, int kR>
__global__ void __launch_bounds__(kBlock, MinBlocksFor(kR)) PassKernel(KernelArgs ka) {
  const PassArgs& p = ka.p;
  constexpr int kWpt = kR * kWarps;  // bitmask words per tile
  __shared__ unsigned s_gmax[kFused ? kMaxBinsPerTile : 1];
  __shared__ unsigned s_off[kWpt];
  __shared__ double s_red[kWarps];
  __shared__ uint32_t s_tile, s_prefix, s_last;

  const unsigned a = p.ctl->active & 1u;  // the same in every block: only the last one flips it
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t T = p.bin_size;
  if (tid == 0) s_tile = atomicAdd(&p.header->tile_counter, 1u);
  if constexpr (kFused) {
    for (uint32_t j = tid; j < p.layout.bins_per_tile; j += kBlock) s_gmax[j] = 0u;
  }
  __syncthreads();
  const uint32_t tile = s_tile;
  const uint32_t E = p.layout.tile_elems;
  const uint32_t lo = tile * E;
  const uint32_t cnt = min(E, p.n - lo);
  const uint32_t* bits_in = p.bits[a] + static_cast<size_t>(tile) * kWpt;
  uint32_t* bits_out = p.bits[a ^ 1u] + static_cast<size_t>(tile) * kWpt;

  float v[kR], g[kR];
  if constexpr (kFused) {
    bool bad_g = false, bad_v = false;
    LoadUpdateStore<kR>(p.grad, p.residue[a], p.residue[a ^ 1u], p.ctl->pending_scale[a], lo,
                        cnt, bits_in, v, g, bad_g, bad_v);
#pragma unroll
    for (int k = 0; k < kR; ++k) {
      const uint32_t row = k * kBlock + warp * 32;
      if (row >= cnt) continue;  // warp-uniform
      const uint32_t e = row + lane;
      const uint32_t b0 = static_cast<uint32_t>((row * ka.bin_magic) >> 32);
      const bool valid = e < cnt;
      const uint32_t b = valid ? static_cast<uint32_t>((e * ka.bin_magic) >> 32) : b0;
      const unsigned mag = valid ? __float_as_uint(fabsf(v[k])) : 0u;
      RowMax(s_gmax, b, b0, mag, T);
    }
    FlagFailures(p.header, bad_g, bad_v);  // also the barrier before s_gmax is read
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
  unsigned ball[kR];
  const uint32_t gbin_lo = kFused ? 0u : lo / T;
  const uint64_t gnext = (static_cast<uint64_t>(gbin_lo) + 1u) * T;
#pragma unroll
  for (int k = 0; k < kR; ++k) {
    const uint32_t e = k * kBlock + tid;
    bool sel = false;
    if (e < cnt) {
      float m;
      if constexpr (kFused) {
        m = __uint_as_float(s_gmax[static_cast<uint32_t>((e * ka.bin_magic) >> 32)]);
      } else {
        const uint32_t b = (static_cast<uint64_t>(lo) + e >= gnext) ? gbin_lo + 1 : gbin_lo;
        m = __uint_as_float(__ldg(p.gmax + b));
      }
      sel = m > 0.0f && v[k] != 0.0f && fabsf(__fadd_rn(v[k], g[k])) >= m;
    }
    ball[k] = __ballot_sync(kFull, sel);
    if (lane == 0) {
      s_off[k * kWarps + warp] = __popc(ball[k]);
      bits_out[k * kWarps + warp] = ball[k];
    }
  }
  __syncthreads();

  // Block scan of the kRows * kWarps row/warp counts (in index order), then the decoupled
  // look-back across tiles.
  if (warp == 0) {
    constexpr int kPer = kWpt / 32;
    static_assert(kWpt % 32 == 0, "the block scan gives each lane of warp 0 whole counts");
    unsigned c[kPer];
    unsigned sum = 0u;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      c[j] = s_off[kPer * lane + j];
      sum += c[j];
    }
    unsigned incl = sum;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const unsigned t = __shfl_up_sync(kFull, incl, off);
      if (lane >= off) incl += t;
    }
    unsigned run = incl - sum;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      s_off[kPer * lane + j] = run;
      run += c[j];
    }
    const unsigned total = __shfl_sync(kFull, incl, 31);
    unsigned prefix = 0u;
    if (tile == 0) {
      if (lane == 0) StoreStatus(p.status, 0, 2u, total);
    } else {
      if (lane == 0) StoreStatus(p.status, tile, 1u, total);
      int pred = static_cast<int>(tile) - 1;
      while (true) {
        const int idx = pred - lane;
        unsigned long long w = 2ull << 32;  // before tile 0: an inclusive prefix of 0
        if (idx >= 0) {
          do {
            w = LoadStatus(p.status, static_cast<uint32_t>(idx));
          } while ((w >> 32) == 0ull);
        }
        const unsigned flag = static_cast<unsigned>(w >> 32);
        const unsigned val = static_cast<unsigned>(w);
        const unsigned incl_mask = __ballot_sync(kFull, flag == 2u);
        if (incl_mask != 0u) {
          const int first = __ffs(incl_mask) - 1;
          prefix += __reduce_add_sync(kFull, lane <= first ? val : 0u);
          break;
        }
        prefix += __reduce_add_sync(kFull, val);
        pred -= 32;
      }
      if (lane == 0) StoreStatus(p.status, tile, 2u, prefix + total);
    }
    if (lane == 0) s_prefix = prefix;
  }

  // This tile's share of the scale: its bin maxima, summed in a fixed order.
  double part = 0.0;
  if constexpr (kFused) {
    const uint32_t nbins = (cnt + T - 1) / T;
    for (uint32_t j = tid; j < nbins; j += kBlock) part += static_cast<double>(__uint_as_float(s_gmax[j]));
  }
  const double tile_sum = BlockSumFixedOrder(part, s_red);  // also publishes s_off, s_prefix
  if (kFused && tid == 0) p.tile_sums[tile] = tile_sum;

  // Scatter, ascending.
  const unsigned base = s_prefix;
  const unsigned lt = (1u << lane) - 1u;
#pragma unroll
  for (int k = 0; k < kR; ++k) {
    if ((ball[k] >> lane) & 1u) {
      const unsigned pos = base + s_off[k * kWarps + warp] + __popc(ball[k] & lt);
      p.out_indices[pos] = lo + k * kBlock + tid;
      p.out_negative[pos] = v[k] < 0.0f ? 1 : 0;
    }
  }

  // The last block to finish writes the count and the scale. What it reads of the other blocks
  // (tile sum, failure flags, look-back status word) each wrote from thread 0, so only thread 0
  // fences before taking the block's ticket.
  if (tid == 0) {
    __threadfence();
    s_last = atomicAdd(&p.header->done_counter, 1u) == p.layout.num_tiles - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  double acc;
  if constexpr (kFused) {
    acc = StridedSum(tid, p.layout.num_tiles, [&](uint32_t j) { return __ldcg(p.tile_sums + j); });
  } else {
    acc = StridedSum(tid, p.layout.num_bins, [&](uint32_t j) {
      return static_cast<double>(__uint_as_float(__ldcg(p.gmax + j)));
    });
  }
  const double gsum = BlockSumFixedOrder(acc, s_red);
  if (tid == 0) {
    // Every other block raised its flags before its done_counter ticket (fence, then atomic).
    const volatile Header* vh = p.header;
    const bool failed = vh->nonfinite != 0u || vh->overflow != 0u;
    // On failure the step did not happen: set a stays active with its residue and fix-up.
    const float s = static_cast<float>(gsum / static_cast<double>(p.layout.num_bins));
    PublishPass(p.ctl, p.header, a, failed, p.two_phase, s,
                failed ? 0u : static_cast<unsigned>(LoadStatus(p.status, p.layout.num_tiles - 1)));
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
  bool bad_g = false, bad_v = false;
  LoadUpdateStore<kRows>(p.grad, p.residue[a], p.residue[a ^ 1u], p.ctl->pending_scale[a], lo,
                         cnt, bits, v, g, bad_g, bad_v);
  FlagFailures(p.header, bad_g, bad_v);
  const uint32_t T = p.bin_size;
  const uint32_t bin_lo = lo / T;
  const uint64_t next = (static_cast<uint64_t>(bin_lo) + 1u) * T;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const uint32_t row = k * kBlock + warp * 32;
    if (row >= cnt) continue;
    const uint32_t e = row + lane;
    const uint32_t b0 = (static_cast<uint64_t>(lo) + row >= next) ? bin_lo + 1 : bin_lo;
    const bool valid = e < cnt;
    const uint32_t b =
        valid ? ((static_cast<uint64_t>(lo) + e >= next) ? bin_lo + 1 : bin_lo) : b0;
    const unsigned mag = valid ? __float_as_uint(fabsf(v[k])) : 0u;
    RowMax(p.gmax, b, b0, mag, T);
  }
}

struct PendingArgs {
  float* residue[2];
  uint32_t* bits[2];
  const SliceCtl* ctl;
  uint32_t tile_elems, words_per_tile, num_words;
};

__global__ void ApplyPendingKernel(PendingArgs pa) {
  const uint32_t wi = blockIdx.x * blockDim.x + threadIdx.x;
  if (wi >= pa.num_words) return;
  const unsigned a = pa.ctl->active & 1u;
  uint32_t* bits = a != 0u ? pa.bits[1] : pa.bits[0];  // no local-memory copy of the array
  unsigned w = bits[wi];
  if (w == 0u) return;
  float* r = a != 0u ? pa.residue[1] : pa.residue[0];
  const float s = pa.ctl->pending_scale[a];
  const size_t base = static_cast<size_t>(wi / pa.words_per_tile) * pa.tile_elems +
                      static_cast<size_t>(wi % pa.words_per_tile) * 32u;
  while (w != 0u) {
    const int b = __ffs(w) - 1;
    const float x = r[base + b];
    r[base + b] = x < 0.0f ? __fadd_rn(x, s) : __fsub_rn(x, s);
    w &= w - 1u;
  }
  bits[wi] = 0u;
}

__global__ void CommitStagedKernel(SliceCtl* ctl) { CommitStaged(ctl); }
__global__ void DiscardStagedKernel(SliceCtl* ctl) { DiscardStaged(ctl); }

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
  ka.bin_magic = ((uint64_t{1} << 32) + args.bin_size - 1) / args.bin_size;
  const unsigned grid = args.layout.num_tiles;
  if (!args.layout.fused) {
    UpdateMaxKernel<<<grid, kBlock, 0, stream>>>(ka);
    PassKernel<false, kRows><<<grid, kBlock, 0, stream>>>(ka);
  } else if (args.layout.rows == 16u) {
    PassKernel<true, 16><<<grid, kBlock, 0, stream>>>(ka);
  } else if (args.layout.rows == 12u) {
    PassKernel<true, 12><<<grid, kBlock, 0, stream>>>(ka);
  } else {
    PassKernel<true, kRows><<<grid, kBlock, 0, stream>>>(ka);
  }
  return cudaGetLastError();
}

cudaError_t LaunchCommitStaged(SliceCtl* ctl, cudaStream_t stream) {
  CommitStagedKernel<<<1, 1, 0, stream>>>(ctl);
  return cudaGetLastError();
}

cudaError_t LaunchDiscardStaged(SliceCtl* ctl, cudaStream_t stream) {
  DiscardStagedKernel<<<1, 1, 0, stream>>>(ctl);
  return cudaGetLastError();
}

cudaError_t LaunchApplyPending(float* const residue[2], uint32_t* const bits[2],
                               const SliceCtl* ctl, const Layout& layout, cudaStream_t stream) {
  const size_t words = layout.bit_words();
  if (words == 0) return cudaSuccess;
  PendingArgs pa;
  pa.residue[0] = residue[0];
  pa.residue[1] = residue[1];
  pa.bits[0] = bits[0];
  pa.bits[1] = bits[1];
  pa.ctl = ctl;
  pa.tile_elems = layout.tile_elems;
  pa.words_per_tile = layout.words_per_tile();
  pa.num_words = static_cast<uint32_t>(words);
  ApplyPendingKernel<<<static_cast<unsigned>((words + kBlock - 1) / kBlock), kBlock, 0,
                       stream>>>(pa);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace cuda
}  // namespace adaps
