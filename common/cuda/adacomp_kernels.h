// Internal to adaps_cuda: the kernel launchers of adacomp_kernels.cu. Plain C++ types plus
// cudaError_t / cudaStream_t; only files of the adaps_cuda target include this.
#ifndef ADAPS_COMMON_CUDA_ADACOMP_KERNELS_H_
#define ADAPS_COMMON_CUDA_ADACOMP_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace adaps {
namespace cuda {
namespace kernels {

// One thread block handles one tile of at most rows * kBlock elements: `rows` rows of kBlock
// consecutive elements; thread t owns element t of every row (coalesced), and warp w's 32
// elements of row k form selection-bitmask word k * kWarps + w of the tile. Rows: 8 (tile cap
// 2048) for every bin size, and 12 or 16 (caps 3072, 4096) for 1024 < T <= 2048, where a
// 2048-element tile would hold one bin and leave up to half of the block idle.
constexpr int kBlock = 256;
constexpr int kWarps = kBlock / 32;
constexpr int kRows = 8;
constexpr int kTileCap = kBlock * kRows;        // 2048 elements (the general path's tile)
constexpr int kMaxRows = 16;
constexpr int kMaxBinsPerTile = kTileCap;       // T = 1 with 8 rows

// Per-slice control word in device memory. The residue and the selection bitmask are double
// buffered ("sets" 0 and 1): a pass reads set `active` and writes the other one, and only a
// successful pass makes the other one active (on the device, so that no host round trip is
// needed). A failed step therefore leaves residue and pending fix-up untouched.
// A two-phase pass (PassArgs::two_phase; docs/algorithm.md: a push of several slices commits
// every slice's residue or none) leaves `active` alone and marks the other set `staged`
// instead; CommitStaged then makes it active, DiscardStaged drops it.
struct SliceCtl {
  unsigned int active;      // 0 or 1
  float pending_scale[2];   // s of the fix-up recorded in bits[set]; 0: none (x -+ 0 == x)
  unsigned int staged;      // 1: set active ^ 1 holds a successful two-phase pass's result
};

// Per-compress device scratch header; zeroed before each compress.
struct Header {
  unsigned int nonfinite;     // a NaN or +-Inf in the gradient
  unsigned int overflow;      // residue + gradient not finite somewhere
  unsigned int count;         // number of selected elements (0 when the step failed)
  float scale;                // s
  unsigned int out_set;       // the residue/bitmask set the pass wrote (FinalizeKernel)
  unsigned int ok;            // AdaComp: 1 when the step succeeded (FinalizeKernel)
  unsigned int pad[2];
};

// The end of a pass, run by one thread of FinalizeKernel (and by host tests of these
// transitions): `a` the set the pass read, `failed` whether any block flagged a NaN/Inf or an
// overflow, `s` and `count` the step's scale and selection size. A failed pass changes neither
// set and stages nothing; a successful one records its fix-up scale for set a ^ 1 and makes
// that set active (one phase) or staged (two phases).
__host__ __device__ inline void PublishPass(SliceCtl* ctl, Header* h, unsigned a, bool failed,
                                            bool two_phase, float s, unsigned count) {
  if (failed) {
    h->count = 0u;
    h->scale = 0.0f;
    ctl->staged = 0u;
    h->ok = 0u;
    return;
  }
  h->count = count;
  h->scale = s;
  ctl->pending_scale[a ^ 1u] = s - s == 0.0f ? s : 0.0f;  // finite maxima: always finite
  if (two_phase) {
    ctl->staged = 1u;
  } else {
    ctl->active = a ^ 1u;
    ctl->staged = 0u;
  }
  h->ok = 1u;
}
// The second phase: the staged set becomes active; nothing when none is staged (the pass
// failed, or was discarded or replaced).
__host__ __device__ inline void CommitStaged(SliceCtl* ctl) {
  if (ctl->staged != 0u) ctl->active ^= 1u;
  ctl->staged = 0u;
}
__host__ __device__ inline void DiscardStaged(SliceCtl* ctl) { ctl->staged = 0u; }

// Thread `first`'s share of FinalizeKernel's sum (the scale's documented fixed order): the sum
// of load(j) over j = first, first + S, first + 2 S, ... < n (S = kStride, the number of threads
// summing; kBlock by default), added one after the
// other from 0.0 in that order, with kSumUnroll loads issued before their adds (the ~12.5k tile
// sums of a 25M-element slice would otherwise be as many L2 round trips one after the other).
// The result is bit for bit that of the plain strided loop. Loads past the end read element
// n - 1 (n >= 1) and are not added, so that the loads need no branch.
constexpr int kSumUnroll = 8;
#ifdef __CUDA_ARCH__  // the device pass only: host compilers do not know the pragma
#define ADAPS_CUDA_UNROLL _Pragma("unroll")
#else
#define ADAPS_CUDA_UNROLL
#endif
template <int kStride = kBlock, typename Load>
__host__ __device__ inline double StridedSum(uint32_t first, uint32_t n, Load load) {
  double acc = 0.0;
  for (uint32_t j = first; j < n; j += kSumUnroll * kStride) {
    double x[kSumUnroll];
    ADAPS_CUDA_UNROLL
    for (int u = 0; u < kSumUnroll; ++u) {
      const uint32_t i = j + u * kStride;
      x[u] = load(i < n ? i : n - 1);
    }
    ADAPS_CUDA_UNROLL
    for (int u = 0; u < kSumUnroll; ++u) {
      if (j + u * kStride < n) acc += x[u];
    }
  }
  return acc;
}

// How a slice of n elements is cut into tiles for bin size T.
struct Layout {
  bool fused = true;           // T <= kTileCap: tiles hold whole bins (one kernel)
  uint32_t rows = kRows;       // rows per tile (8, 12 or 16); bitmask words per tile: rows * 8
  uint32_t tile_elems = 0;     // E: elements per tile (K * T when fused, kTileCap otherwise)
  uint32_t bins_per_tile = 0;  // K (fused only)
  uint32_t num_tiles = 0;
  uint32_t num_bins = 0;
  uint32_t words_per_tile() const { return rows * static_cast<uint32_t>(kWarps); }
  size_t bit_words() const { return static_cast<size_t>(num_tiles) * words_per_tile(); }
  bool same_bits(const Layout& o) const {
    return tile_elems == o.tile_elems && rows == o.rows && num_tiles == o.num_tiles;
  }
};
Layout MakeLayout(uint32_t n, uint32_t bin_size);

struct PassArgs {
  const float* grad;
  float* residue[2];           // the two residue sets, n floats each
  uint32_t* bits[2];           // the two bitmask sets, layout.bit_words() words each
  SliceCtl* ctl;
  uint32_t n;
  uint32_t bin_size;
  Layout layout;
  Header* header;
  uint32_t* counts;            // num_tiles: each tile's selection count, then its offset
  double* tile_sums;           // num_tiles (fused)
  uint32_t* neg_bits;          // layout.bit_words(): selected and negative, as the bitmask
  unsigned int* gmax;          // num_bins (general path), float bits, zeroed
  uint32_t* out_indices;       // capacity n
  uint8_t* out_negative;       // capacity n
  bool two_phase;              // stage the result (SliceCtl::staged) instead of switching sets
};

int MultiProcessorCount();

// header->nonfinite = 1 when grad[0, n) holds NaN or +-Inf (the dense baseline).
// cudaSuccess when the kernels have an image for the current device (the architectures the
// target was built for, or PTX it can compile); else the runtime's error
// (cudaErrorNoKernelImageForDevice, cudaErrorInvalidDeviceFunction).
cudaError_t ProbeKernelImage();

cudaError_t LaunchCheckFinite(const float* grad, size_t n, Header* header, int sm_count,
                              cudaStream_t stream);
// The AdaComp pass (fused, or the two kernels of the general path for T > kTileCap): reads set
// ctl->active, writes the other set, finds a non-finite gradient (header->nonfinite) or
// residue + gradient (header->overflow) as it goes, and only when neither was found switches
// ctl->active (or, two-phase, stages the other set) and sets header->ok, count and scale
// (PublishPass). Leaves the new selection's fix-up pending.
cudaError_t LaunchAdaCompPass(const PassArgs& args, cudaStream_t stream);
// CommitStaged / DiscardStaged on the device (asynchronous, one thread).
cudaError_t LaunchCommitStaged(SliceCtl* ctl, cudaStream_t stream);
cudaError_t LaunchDiscardStaged(SliceCtl* ctl, cudaStream_t stream);
// Applies the pending fix-up of the active set (bitmask layout `layout`) and clears its bits.
cudaError_t LaunchApplyPending(float* const residue[2], uint32_t* const bits[2],
                               const SliceCtl* ctl, const Layout& layout, cudaStream_t stream);
// dst[idx[j]] += (neg[j] ? -1 : 1) * (factor * scale) for j < count; count and scale read from
// `header` when non-null (nothing added unless header->ok), else from the arguments.
cudaError_t LaunchAdaCompAdd(const uint32_t* indices, const uint8_t* negative, uint32_t count,
                             float scale, const Header* header, float factor, float* dst,
                             int sm_count, cudaStream_t stream);
// dst[i] += factor * values[i]; nothing when header (nullable) has nonfinite set.
cudaError_t LaunchDenseAdd(const float* values, size_t n, const Header* header, float factor,
                           float* dst, int sm_count, cudaStream_t stream);
// dst[idx[j]] += factor * values[j].
cudaError_t LaunchSparseAdd(const uint32_t* indices, const float* values, size_t count,
                            float factor, float* dst, int sm_count, cudaStream_t stream);
// dst[i] += factor * (bit i of sign_bits ? scale_neg : scale).
cudaError_t LaunchSignAdd(const uint64_t* sign_bits, size_t n, float scale, float scale_neg,
                          float factor, float* dst, int sm_count, cudaStream_t stream);

}  // namespace kernels
}  // namespace cuda
}  // namespace adaps

#endif  // ADAPS_COMMON_CUDA_ADACOMP_KERNELS_H_
