// AdaComp (docs/algorithm.md) and the dense baseline on an NVIDIA GPU, behind the same plain
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
// Streams: a compressor issues all its work on the stream of its options (`stream`, a
// cudaStream_t passed as void*; null: the CUDA legacy default stream, which is ordered after
// any kernel on a blocking stream, e.g. PyTorch's default). A slice state's own operations
// (Reset, UploadResidue, DownloadResidue, Materialize) run on the stream given to Create; use
// the compressor's. Blocking calls synchronise that stream only, never the whole device.
// Device: the calling thread's current CUDA device.
//
// Failure: a failed step (NaN/Inf gradient, residue overflow) leaves the residue and any pending
// fix-up bit-for-bit unchanged: the residue is double-buffered as on the CPU (2 x 4 B per
// element), the pass writes the spare buffer and finds NaN/Inf in the gradient and in
// residue + gradient as it goes, and only a successful pass makes the spare buffer current.
//
// Two phases: a push of a tensor of several slices commits every slice's residue or none
// (docs/algorithm.md). EnqueuePending stages a successful step's residue in the slice state;
// CudaSliceState::Commit / Discard end the push, as the CPU's CompressPending and
// SliceState::Commit / Discard.
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
  // Sets every byte to zero (asynchronous, on `stream`; null: the legacy default stream).
  absl::Status Zero(void* stream = nullptr);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// dst <- src, `bytes` bytes, device to device, asynchronous on `stream` (null: legacy default).
absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, void* stream = nullptr);

// Streams, events, copies and pinned host memory, for the worker library's device path
// (worker/device_cuda.cc). Streams and events are plain pointers (cudaStream_t, cudaEvent_t).

// OK when this library's kernels can run on the current device; kFailedPrecondition naming
// the device's architecture and the rebuild flag when it was not built for it.
absl::Status CheckKernelImage();
// Makes `ordinal` the calling thread's current device. The caller checks it against
// CudaDeviceCount once (cudaSetDevice is cheap; counting the devices on every call is not).
absl::Status SetDevice(int ordinal);
// The calling thread's current device.
absl::StatusOr<int> GetDevice();
// A non-blocking stream of the current device (does not wait for the legacy default stream);
// DestroyStream(null) does nothing.
absl::StatusOr<void*> CreateStream();
void DestroyStream(void* stream);
// An event recorded now on `stream` (null: the legacy default stream): what was given to it so
// far. Freed by DestroyEvent (null: nothing).
absl::StatusOr<void*> RecordEvent(void* stream);
void DestroyEvent(void* event);
// The work given to `stream` from now on waits for `event` (asynchronous).
absl::Status StreamWaitEvent(void* stream, void* event);
// Copies of `bytes` bytes on `stream`, returning once done (the stream synchronised).
absl::Status CopyToHost(void* host, const void* device, size_t bytes, void* stream);
absl::Status CopyToDevice(void* device, const void* host, size_t bytes, void* stream);
absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes, void* stream);

// Page-locked host memory (cudaMallocHost), freed on destruction. Move-only. Copies between it
// and the device run at the bus's speed; pageable memory is staged by the driver in pieces.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  // Grows to at least `bytes` (contents lost when it grows). kResourceExhausted on failure.
  absl::Status Reserve(size_t bytes);
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// The residue of one slice, in device memory. Starts at zero.
class CudaSliceState {
 public:
  ~CudaSliceState();
  // `stream`: a cudaStream_t as void* (null: the legacy default stream) for the state's own
  // operations. A zero-length state holds no device memory (and touches no device).
  static absl::StatusOr<std::unique_ptr<CudaSliceState>> Create(size_t length,
                                                                 void* stream = nullptr);

  size_t size() const;
  // Applies a deferred residue fix-up, if any (asynchronous).
  absl::Status Materialize();
  // True when a deferred fix-up may be pending (the device residue may not be the true one).
  bool fixup_pending() const;
  // Materializes and returns the buffer that holds the current residue (`size()` floats). Blocks
  // (the stream) to learn which of the two buffers that is; valid until the next Enqueue.
  absl::StatusOr<float*> DeviceResidue();

  // Materializes, then copies the residue to `host` (size() floats). Blocks.
  absl::Status DownloadResidue(absl::Span<float> host);
  // Replaces the residue (size() floats) and drops any pending fix-up. Blocks.
  absl::Status UploadResidue(absl::Span<const float> host);
  // Zeroes the residue and drops any pending fix-up and staged residue (asynchronous).
  absl::Status Reset();

  // The second phase of CudaCompressor::EnqueuePending (the CPU's SliceState::Commit and
  // Discard): Commit makes the staged residue the slice's residue, Discard drops it and keeps
  // the old one (with its pending fix-up). Both asynchronous, on the state's stream; nothing
  // happens when nothing is staged (the pass failed, or no EnqueuePending since the last
  // Commit/Discard/Reset/UploadResidue). Errors: a failed kernel launch (the state is then as
  // before the call).
  absl::Status Commit();
  absl::Status Discard();

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
  // The CUDA stream (cudaStream_t as void*) all work of the compressor goes to; null: the
  // legacy default stream. The caller keeps the stream alive as long as the compressor.
  void* stream = nullptr;
};

class CudaCompressor {
 public:
  virtual ~CudaCompressor() = default;
  virtual const CudaCompressorOptions& options() const = 0;

  // Compresses the gradient `device_grad` (`n` floats in device memory) for the slice whose
  // residue is `state` and copies the update to host memory in `out` (previous contents
  // replaced). Blocks until done. Same errors and guarantees as Compressor::Compress:
  // kInvalidArgument when n != state.size() or n > 2^32-1 (nothing done), or (policy kReject)
  // when the gradient holds NaN/Inf; kOutOfRange when residue + gradient overflowed the float
  // range. On the last two the residue is untouched and `out` is the CPU's empty update.
  virtual absl::Status Compress(const float* device_grad, size_t n, CudaSliceState& state,
                                CompressedUpdate& out) = 0;

  // The asynchronous half of Compress: validates the arguments on the host, enqueues the
  // kernels and returns without waiting. The update stays in device memory (see
  // DecompressAddLast) until Fetch copies it out. A NaN/Inf gradient or an overflow is detected
  // on the device: the kernels then leave the residue untouched and Wait/Fetch report it.
  // A rejected call (bad arguments) forgets the previous update: Wait, Fetch and
  // DecompressAddLast are kFailedPrecondition until the next successful Enqueue. One
  // compressor may serve several slices; "the last update" is that of the last Enqueue.
  virtual absl::Status Enqueue(const float* device_grad, size_t n, CudaSliceState& state) = 0;
  // The first phase of a two-phase push over several slices (docs/algorithm.md: commit every
  // slice's residue or none; the CPU's Compressor::CompressPending): Enqueue, except that a
  // successful step's new residue is staged in `state` instead of becoming its residue, until
  // state.Commit() or state.Discard(). Meanwhile the state's residue (DownloadResidue) is the old
  // one. A later Enqueue or EnqueuePending on the state replaces a staged residue. With
  // defer_residue_fixup off the fix-up is applied by Commit. The caller commits every slice
  // only when Wait or Fetch gave OK for each, and discards all otherwise.
  virtual absl::Status EnqueuePending(const float* device_grad, size_t n,
                                      CudaSliceState& state) = 0;
  // EnqueuePending, then Fetch(out): the CPU's CompressPending, blocking.
  virtual absl::Status CompressPending(const float* device_grad, size_t n, CudaSliceState& state,
                                       CompressedUpdate& out) = 0;
  // Waits for the last Enqueue and returns Compress's status for it without copying the update
  // (the status of the device-resident path). kFailedPrecondition when nothing was enqueued.
  virtual absl::Status Wait() = 0;
  // Waits for the last Enqueue and copies its update to `out`, with Compress's status (on a
  // failed step `out` is the CPU's empty update). kFailedPrecondition when nothing was enqueued.
  virtual absl::Status Fetch(CompressedUpdate& out) = 0;
  // device_dst[i] += factor * decompress(last update)[i], for the `n` floats of the last
  // Enqueue, entirely on the device (no host round trip, asynchronous). Adds nothing when the
  // step failed (NaN/Inf gradient or overflow; Wait or Fetch gives its status).
  // kFailedPrecondition when nothing was enqueued.
  virtual absl::Status DecompressAddLast(float factor, float* device_dst) = 0;
  // device_dst[i] += factor * decompress(update)[i] for an update in host memory (any kind),
  // on this compressor's stream, with device scratch kept in the compressor (no allocation
  // once it is large enough). Validation as adaps::DecompressAdd (kInvalidArgument, device_dst
  // unchanged). Blocks until done (synchronises this compressor's stream only).
  virtual absl::Status DecompressAddToDevice(const CompressedUpdate& update, float factor,
                                             float* device_dst, size_t n) = 0;
};

// kInvalidArgument for invalid options, kUnimplemented for kinds without a GPU path;
// kUnavailable when no GPU can be used.
absl::StatusOr<std::unique_ptr<CudaCompressor>> MakeCudaCompressor(
    const CudaCompressorOptions& options);
// The same with `options.kind` forced to kAdaComp.
absl::StatusOr<std::unique_ptr<CudaCompressor>> MakeCudaAdaComp(CompressorOptions options,
                                                               bool defer_residue_fixup = true);

// device_dst[i] += factor * decompress(update)[i] for an update in host memory (any kind),
// `n` floats at device_dst, on the legacy default stream. Same validation as
// adaps::DecompressAdd (kInvalidArgument, and device_dst unchanged, when n != update.length or
// the update is malformed). Scratch is kept per thread (no allocation once large enough);
// blocks on the legacy default stream only. CudaCompressor::DecompressAddToDevice is the same
// on a compressor's stream.
absl::Status DecompressAddToDevice(const CompressedUpdate& update, float factor,
                                   float* device_dst, size_t n);

namespace internal {
// The result of a finished step, from the device's flags: when the step failed (a NaN/Inf
// gradient, or an AdaComp residue overflow) `out` becomes the CPU's empty update (kind, length
// n, AdaComp bin size, dense: n zeros under kSendNothing) and *failed is set; the status is the
// CPU's (NaN/Inf: kInvalidArgument under kReject, OK under kSendNothing; overflow:
// kOutOfRange). Otherwise OK with *failed false and `out` untouched.
absl::Status ResolveStep(bool nonfinite_gradient, bool overflow, const CompressorOptions& options,
                         size_t n, CompressedUpdate& out, bool* failed);
// MakeCudaCompressor without the device check, for tests of the host-side logic on machines
// without a GPU (only calls that touch no device may then be made: zero-length slices).
absl::StatusOr<std::unique_ptr<CudaCompressor>> MakeCudaCompressorWithoutDeviceCheck(
    const CudaCompressorOptions& options);
}  // namespace internal

}  // namespace cuda
}  // namespace adaps

#endif  // ADAPS_COMMON_CUDA_CUDA_COMPRESSOR_H_
