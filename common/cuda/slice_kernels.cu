// The slice state's own kernels (docs/gpu.md, "Kernels"): the deferred fix-up applied on its own
// (Materialize, the eager mode), and the second phase of a two-phase push (Commit, Discard).
// The pass kernels are in adacomp_kernels.cu.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/adacomp_kernels.h"

namespace adaps {
namespace cuda {
namespace kernels {
namespace {

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

}  // namespace

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
