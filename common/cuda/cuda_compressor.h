// AdaComp (DESIGN.md section 1) and the dense baseline on an NVIDIA GPU, behind the same plain
// C++ interface as the CPU code (common/compressor.h). No CUDA header is included here: device
// memory is passed as plain pointers, and every CUDA error comes back as an absl::Status (this
// library never aborts on a CUDA error).
//
// The CPU implementation is the oracle: for the same gradients and bin size the GPU selects the
// same indices with the same signs and leaves the same residue; the scale is the mean of the
// bin maxima summed in double in a fixed (deterministic) tree order, which equals the CPU's
// sequential double sum after rounding to float except when the mean lies within ~2^-40 of a
// float rounding boundary (then the two differ by one ulp, and so may the fixed-up residues).
//
// Streams: all work is issued on the CUDA legacy default stream, so it is ordered after any
// kernel that produced the gradient on a blocking stream (PyTorch's default). Device: the
// calling thread's current CUDA device.
//
// Ownership and thread-safety as on the CPU: the caller owns one `CudaSliceState` per tensor
// slice; a `CudaCompressor` holds device scratch space and is thread-compatible.
//
// Deferred residue fix-up: by default a Compress call leaves the residue of the elements it
// selected without the `- sign * s` fix-up and records the selection as a bitmask; the next
// Compress applies it while it streams the residue anyway (bit-identical arithmetic: the
// residue is first fixed up, then the gradient added). This saves a scattered read-modify-write
// pass. `CudaSliceState::Materialize()` (and `DownloadResidue`) applies a pending fix-up; set
// `CudaCompressorOptions::defer_residue_fixup = false` to have Compress apply it at once.
#ifndef ADAPS_COMMON_CUDA_CUDA_COMPRESSOR_H_
#define ADAPS_COMMON_CUDA_CUDA_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/compressor.h"

namespace adaps {
namespace cuda {

// Number of CUDA devices visible to this process: 0 when there is none, an error status
// (kUnavailable, with the CUDA runtime's reason) when the runtime or driver cannot be used.
absl::StatusOr<int> CudaDeviceCount();
// OK when at least one device can be used; kUnavailable with the reason otherwise
// (no driver, no device, driver too old for this runtime, ...).
absl::Status CudaAvailable();
// "NVIDIA H200 (sm_90, 132 SMs, 141 GB)" for the current device, or the error.
absl::StatusOr<std::string> CudaDeviceDescription();
// Waits for all work issued by this library (and anything else on the device) to finish and
// reports any pending asynchronous CUDA error.
absl::Status CudaSynchronize();

// Device memory, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // kResourceExhausted / kUnavailable on failure. A zero-byte buffer holds no memory.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  // Allocates and uploads.
  static absl::StatusOr<DeviceBuffer> FromHost(absl::Span<const float> values);

  void* data() const { return ptr_; }
  float* floats() const { return static_cast<float*>(ptr_); }
  size_t bytes() const { return bytes_; }

  // Synchronous copies; `offset` and `bytes` in bytes; kOutOfRange past the end.
  absl::Status Upload(const void* host, size_t bytes, size_t offset = 0);
  absl::Status Download(void* host, size_t bytes, size_t offset = 0) const;
  // Sets every byte to zero (asynchronous, stream-ordered).
  absl::Status Zero();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// dst <- src, `bytes` bytes, device to device, asynchronous (stream-ordered).
absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes);

// The residue of one slice, in device memory. Starts at zero.
class CudaSliceState {
 public:
  ~CudaSliceState();
  static absl::StatusOr<std::unique_ptr<CudaSliceState>> Create(size_t length);

  size_t size() const;
  // Applies a deferred residue fix-up, if any (asynchronous). After it, device_residue()
  // holds the residue exactly as the CPU code would.
  absl::Status Materialize();
  // True when a deferred fix-up is pending (the device residue is not yet the true one).
  bool fixup_pending() const;
  // The residue buffer (`size()` floats). Holds the true residue only after Materialize().
  float* device_residue();

  // Materializes, then copies the residue to `host` (size() floats). Blocks.
  absl::Status DownloadResidue(absl::Span<float> host);
  // Replaces the residue (size() floats) and drops any pending fix-up. Blocks.
  absl::Status UploadResidue(absl::Span<const float> host);
  // Zeroes the residue and drops any pending fix-up.
  absl::Status Reset();

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit CudaSliceState(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct CudaCompressorOptions {
  // kind: kAdaComp or kDense (kTopK, kSign: kUnimplemented). bin_size, non_finite as on the
  // CPU.
  CompressorOptions base;
  // See the file comment. Off: every Compress leaves the true residue.
  bool defer_residue_fixup = true;
};

class CudaCompressor {
 public:
  virtual ~CudaCompressor() = default;
  virtual const CudaCompressorOptions& options() const = 0;

  // Compresses the gradient `device_grad` (`n` floats in device memory) for the slice whose
  // residue is `state` and copies the update to host memory in `out` (previous contents
  // replaced). Blocks until done. Same errors and guarantees as Compressor::Compress:
  // kInvalidArgument when n != state.size() or n > 2^32-1, or (policy kReject) when the
  // gradient holds NaN/Inf, in which case residue and `out` are untouched; kOutOfRange when the
  // residue overflowed the float range (as on the CPU).
  virtual absl::Status Compress(const float* device_grad, size_t n, CudaSliceState& state,
                                CompressedUpdate& out) = 0;

  // The asynchronous half of Compress: validates the arguments on the host, enqueues the
  // kernels and returns without waiting. The update stays in device memory (see
  // DecompressAddLast) until Fetch copies it out. A NaN/Inf gradient is detected on the device:
  // the kernels then leave the residue untouched and Fetch reports it.
  virtual absl::Status Enqueue(const float* device_grad, size_t n, CudaSliceState& state) = 0;
  // Waits for the last Enqueue and copies its update to `out`, with Compress's status.
  // kFailedPrecondition when nothing was enqueued.
  virtual absl::Status Fetch(CompressedUpdate& out) = 0;
  // device_dst[i] += factor * decompress(last update)[i], for the `n` floats of the last
  // Enqueue, entirely on the device (no host round trip). Adds nothing when the gradient held
  // NaN/Inf. kFailedPrecondition when nothing was enqueued.
  virtual absl::Status DecompressAddLast(float factor, float* device_dst) = 0;
};

// kInvalidArgument for invalid options, kUnimplemented for kinds without a GPU path;
// kUnavailable when no GPU can be used.
absl::StatusOr<std::unique_ptr<CudaCompressor>> MakeCudaCompressor(
    const CudaCompressorOptions& options);
// The same with `options.kind` forced to kAdaComp.
absl::StatusOr<std::unique_ptr<CudaCompressor>> MakeCudaAdaComp(CompressorOptions options,
                                                               bool defer_residue_fixup = true);

// device_dst[i] += factor * decompress(update)[i] for an update in host memory (any kind),
// `n` floats at device_dst. Same validation as adaps::DecompressAdd (kInvalidArgument, and
// device_dst unchanged, when n != update.length or the update is malformed); the update is
// uploaded to temporary device memory. Blocks.
absl::Status DecompressAddToDevice(const CompressedUpdate& update, float factor,
                                   float* device_dst, size_t n);

}  // namespace cuda
}  // namespace adaps

#endif  // ADAPS_COMMON_CUDA_CUDA_COMPRESSOR_H_
