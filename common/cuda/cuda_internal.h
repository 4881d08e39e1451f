// Internal to adaps_cuda: CUDA error mapping and the slice state's implementation, shared by
// cuda_device.cc and cuda_compressor.cc. Includes the CUDA runtime header.
#ifndef ADAPS_COMMON_CUDA_CUDA_INTERNAL_H_
#define ADAPS_COMMON_CUDA_CUDA_INTERNAL_H_

#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"
#include "common/cuda/adacomp_kernels.h"
#include "common/cuda/cuda_compressor.h"
#include "common/status_macros.h"

namespace adaps {
namespace cuda {

// OK for cudaSuccess; otherwise the error as a status (kResourceExhausted, kUnavailable,
// kFailedPrecondition for a missing kernel image, else kInternal), with `what` in the message.
absl::Status CudaError(cudaError_t e, const char* what);

#define ADAPS_CUDA_CALL(expr, what) ADAPS_RETURN_IF_ERROR(::adaps::cuda::CudaError((expr), (what)))

inline cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

// Grows `buf` to at least `bytes` (contents lost). Synchronises `stream` first, so that no
// queued kernel still uses the old memory.
absl::Status EnsureCapacity(DeviceBuffer& buf, size_t bytes, cudaStream_t stream);

// The residue (two sets: see kernels::SliceCtl) and the deferred fix-up of one slice.
struct CudaSliceState::Impl {
  size_t n = 0;
  cudaStream_t stream = nullptr;  // for the state's own public operations
  DeviceBuffer residue[2];        // n floats each; residue[1] allocated by the first pass
  DeviceBuffer bits[2];           // selection bitmask sets
  DeviceBuffer ctl;               // kernels::SliceCtl
  // The bitmask layout of the last pass on this slice, and so of a fix-up that may be pending
  // (in whichever set is active: after a pass the host does not know whether it succeeded, but
  // both candidates have this layout). Both bitmask sets are zero outside it.
  kernels::Layout bits_layout;
  bool has_pending = false;
  // An EnqueuePending may have staged the other set (SliceCtl::staged), and with the eager
  // fix-up, Commit applies it.
  bool maybe_staged = false;
  bool materialize_on_commit = false;

  kernels::SliceCtl* ctl_ptr() const { return static_cast<kernels::SliceCtl*>(ctl.data()); }
  void ResiduePtrs(float* out[2]) const {
    out[0] = residue[0].floats();
    out[1] = residue[1].floats();
  }
  void BitsPtrs(uint32_t* out[2]) const {
    out[0] = static_cast<uint32_t*>(bits[0].data());
    out[1] = static_cast<uint32_t*>(bits[1].data());
  }

  // Applies a pending fix-up to the active set (asynchronous).
  absl::Status Materialize(cudaStream_t s);
  // Zeroes both bitmask sets (asynchronous).
  absl::Status ClearBits(cudaStream_t s);
  // Makes set 0 active with no fix-up pending (asynchronous); the residue itself is untouched.
  absl::Status ResetControl(cudaStream_t s);
  // CommitStaged / DiscardStaged on the device, when something may be staged (asynchronous).
  absl::Status Commit(cudaStream_t s);
  absl::Status Discard(cudaStream_t s);
  // Which set is active. Blocks on `s`.
  absl::StatusOr<unsigned> Active(cudaStream_t s) const;
  // Before a pass with `layout`: the spare residue; when the layout differs from the last
  // pass's, a pending fix-up applied, the bitmasks grown as needed and both sets cleared (a
  // failed pass may have left bits in the spare set that no later pass of another layout
  // overwrites).
  absl::Status PrepareForPass(const kernels::Layout& layout, cudaStream_t s);
};

}  // namespace cuda
}  // namespace adaps

#endif  // ADAPS_COMMON_CUDA_CUDA_INTERNAL_H_
