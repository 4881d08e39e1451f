// Internal to adaps_cuda: the kernel launchers of adacomp_kernels.cu. Plain C++ types plus
// cudaError_t; only files of the adaps_cuda target include this.
#ifndef ADAPS_COMMON_CUDA_ADACOMP_KERNELS_H_
#define ADAPS_COMMON_CUDA_ADACOMP_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace adaps {
namespace cuda {
namespace kernels {

// One thread block handles one tile of at most kTileCap elements: kRows rows of kBlock
// consecutive elements; thread t owns element t of every row (coalesced), and warp w's 32
// elements of row k form selection-bitmask word k * kWarps + w of the tile.
constexpr int kBlock = 256;
constexpr int kWarps = kBlock / 32;
constexpr int kRows = 8;
constexpr int kTileCap = kBlock * kRows;        // 2048 elements
constexpr int kWordsPerTile = kTileCap / 32;    // 64 bitmask words

// Per-compress device scratch header; zeroed before each compress.
struct Header {
  unsigned int nonfinite;     // set by CheckFinite
  unsigned int count;         // number of selected elements
  float scale;                // s
  unsigned int tile_counter;  // dynamic tile ids (decoupled look-back needs launch order)
  unsigned int done_counter;  // last-block detection
  unsigned int pad[3];
};

// How a slice of n elements is cut into tiles for bin size T.
struct Layout {
  bool fused = true;         // T <= kTileCap: tiles hold whole bins (one kernel)
  uint32_t tile_elems = 0;   // E: elements per tile (K * T when fused, kTileCap otherwise)
  uint32_t bins_per_tile = 0;  // K (fused only)
  uint32_t num_tiles = 0;
  uint32_t num_bins = 0;
};
Layout MakeLayout(uint32_t n, uint32_t bin_size);

struct PassArgs {
  const float* grad;
  float* residue;
  uint32_t n;
  uint32_t bin_size;
  Layout layout;
  uint32_t* bits;              // selection bitmask, kWordsPerTile words per tile
  float* pending_scale;        // s of the deferred fix-up; written with the new s
  Header* header;
  unsigned long long* status;  // num_tiles words, zeroed
  double* tile_sums;           // num_tiles (fused)
  unsigned int* gmax;          // num_bins (general path), float bits, zeroed
  uint32_t* out_indices;       // capacity n
  uint8_t* out_negative;       // capacity n
};

int MultiProcessorCount();

// header->nonfinite = 1 when grad[0, n) holds NaN or +-Inf.
cudaError_t LaunchCheckFinite(const float* grad, size_t n, Header* header, int sm_count);
// The AdaComp pass (fused, or the two kernels of the general path for T > kTileCap). Does
// nothing when header->nonfinite is set. Leaves the fix-up of the new selection pending.
cudaError_t LaunchAdaCompPass(const PassArgs& args);
// Applies the pending fix-up recorded in `bits` (layout `tile_elems`) and clears the bits.
cudaError_t LaunchApplyPending(float* residue, uint32_t tile_elems, uint32_t num_tiles,
                               uint32_t* bits, const float* pending_scale);
// dst[idx[j]] += (neg[j] ? -1 : 1) * (factor * scale) for j < count; count and scale read from
// `header` when non-null (nothing added when header->nonfinite), else from the arguments.
cudaError_t LaunchAdaCompAdd(const uint32_t* indices, const uint8_t* negative, uint32_t count,
                             float scale, const Header* header, float factor, float* dst,
                             int sm_count);
// dst[i] += factor * values[i]; nothing when header (nullable) has nonfinite set.
cudaError_t LaunchDenseAdd(const float* values, size_t n, const Header* header, float factor,
                           float* dst, int sm_count);
// dst[idx[j]] += factor * values[j].
cudaError_t LaunchSparseAdd(const uint32_t* indices, const float* values, size_t count,
                            float factor, float* dst, int sm_count);
// dst[i] += factor * (bit i of sign_bits ? scale_neg : scale).
cudaError_t LaunchSignAdd(const uint64_t* sign_bits, size_t n, float scale, float scale_neg,
                          float factor, float* dst, int sm_count);

}  // namespace kernels
}  // namespace cuda
}  // namespace adaps

#endif  // ADAPS_COMMON_CUDA_ADACOMP_KERNELS_H_
