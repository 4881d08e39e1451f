// Host side of adaps_cuda, part 1: CUDA errors, devices, device memory and the slice state.
// The compressors are in cuda_compressor.cc, the kernels in adacomp_kernels.cu; design notes in
// docs/gpu.md.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda/adacomp_kernels.h"
#include "common/cuda/cuda_compressor.h"
#include "common/cuda/cuda_internal.h"
#include "common/status_macros.h"

namespace adaps {
namespace cuda {

namespace k = kernels;

absl::Status CudaError(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();  // clear a non-sticky error so later calls start clean
  const std::string msg =
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::UnavailableError(
          absl::StrCat(msg, "; is an NVIDIA GPU with a recent enough driver present?"));
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return absl::FailedPreconditionError(absl::StrCat(
          msg, "; adaps_cuda was built for other GPUs: reconfigure with "
               "-DADAPS_CUDA_ARCHITECTURES=<this GPU's sm number>"));
    default:
      return absl::InternalError(msg);
  }
}

// ---------------------------------------------------------------------------------------------
// Devices.

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice) {
    (void)cudaGetLastError();
    return 0;
  }
  ADAPS_CUDA_CALL(e, "cudaGetDeviceCount");
  return count;
}

absl::Status CudaAvailable() {
  ADAPS_ASSIGN_OR_RETURN(const int count, CudaDeviceCount());
  if (count == 0) {
    return absl::UnavailableError("no CUDA device found (cudaGetDeviceCount reports 0 devices)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CudaDeviceDescription() {
  ADAPS_RETURN_IF_ERROR(CudaAvailable());
  int dev = 0;
  ADAPS_CUDA_CALL(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop;
  ADAPS_CUDA_CALL(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  return absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", ", prop.multiProcessorCount,
                      " SMs, ", prop.totalGlobalMem >> 30, " GiB)");
}

absl::Status CudaSynchronize() {
  ADAPS_CUDA_CALL(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// DeviceBuffer.

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  ADAPS_CUDA_CALL(cudaMalloc(&b.ptr_, bytes), "cudaMalloc");
  b.bytes_ = bytes;
  return b;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::FromHost(absl::Span<const float> values) {
  ADAPS_ASSIGN_OR_RETURN(DeviceBuffer b, Allocate(values.size() * sizeof(float)));
  ADAPS_RETURN_IF_ERROR(b.Upload(values.data(), values.size() * sizeof(float)));
  return b;
}

absl::Status DeviceBuffer::Upload(const void* host, size_t bytes, size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("upload of ", bytes, " bytes at ", offset,
                                              " past the end of a ", bytes_, "-byte buffer"));
  }
  if (bytes == 0) return absl::OkStatus();
  ADAPS_CUDA_CALL(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes,
                             cudaMemcpyHostToDevice),
                  "cudaMemcpy host to device");
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Download(void* host, size_t bytes, size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("download of ", bytes, " bytes at ", offset,
                                              " past the end of a ", bytes_, "-byte buffer"));
  }
  if (bytes == 0) return absl::OkStatus();
  ADAPS_CUDA_CALL(cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes,
                             cudaMemcpyDeviceToHost),
                  "cudaMemcpy device to host");
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Zero(void* stream) {
  if (bytes_ == 0) return absl::OkStatus();
  ADAPS_CUDA_CALL(cudaMemsetAsync(ptr_, 0, bytes_, AsStream(stream)), "cudaMemsetAsync");
  return absl::OkStatus();
}

absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return absl::OkStatus();
  ADAPS_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, AsStream(stream)),
                  "cudaMemcpyAsync device to device");
  return absl::OkStatus();
}

absl::Status EnsureCapacity(DeviceBuffer& buf, size_t bytes, cudaStream_t stream) {
  if (buf.bytes() >= bytes) return absl::OkStatus();
  if (buf.data() != nullptr) {
    ADAPS_CUDA_CALL(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  buf = DeviceBuffer();  // free first: the peak is then the new size only
  ADAPS_ASSIGN_OR_RETURN(buf, DeviceBuffer::Allocate(bytes));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// CudaSliceState.

absl::Status CudaSliceState::Impl::Materialize(cudaStream_t s) {
  if (!has_pending) return absl::OkStatus();
  float* r[2];
  uint32_t* b[2];
  ResiduePtrs(r);
  BitsPtrs(b);
  ADAPS_CUDA_CALL(k::LaunchApplyPending(r, b, ctl_ptr(), bits_layout, s),
                  "ApplyPending kernel launch");
  has_pending = false;
  return absl::OkStatus();
}

absl::Status CudaSliceState::Impl::ClearBits(cudaStream_t s) {
  for (DeviceBuffer& b : bits) ADAPS_RETURN_IF_ERROR(b.Zero(s));
  return absl::OkStatus();
}

absl::Status CudaSliceState::Impl::Commit(cudaStream_t s) {
  if (!maybe_staged) return absl::OkStatus();
  ADAPS_CUDA_CALL(k::LaunchCommitStaged(ctl_ptr(), s), "CommitStaged kernel launch");
  maybe_staged = false;
  has_pending = true;  // the committed set's selection, if the pass succeeded
  if (materialize_on_commit) ADAPS_RETURN_IF_ERROR(Materialize(s));
  return absl::OkStatus();
}

absl::Status CudaSliceState::Impl::Discard(cudaStream_t s) {
  if (!maybe_staged) return absl::OkStatus();
  ADAPS_CUDA_CALL(k::LaunchDiscardStaged(ctl_ptr(), s), "DiscardStaged kernel launch");
  maybe_staged = false;
  return absl::OkStatus();
}

absl::Status CudaSliceState::Impl::ResetControl(cudaStream_t s) {
  has_pending = false;
  maybe_staged = false;
  ADAPS_RETURN_IF_ERROR(ClearBits(s));
  return ctl.Zero(s);  // active = 0, pending scales 0.0f
}

absl::StatusOr<unsigned> CudaSliceState::Impl::Active(cudaStream_t s) const {
  if (n == 0) return 0u;
  k::SliceCtl c;
  ADAPS_CUDA_CALL(cudaMemcpyAsync(&c, ctl.data(), sizeof c, cudaMemcpyDeviceToHost, s),
                  "cudaMemcpyAsync device to host");
  ADAPS_CUDA_CALL(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return c.active & 1u;
}

absl::Status CudaSliceState::Impl::PrepareForPass(const k::Layout& layout, cudaStream_t s) {
  if (residue[1].bytes() < n * sizeof(float)) {
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(residue[1], n * sizeof(float), s));
  }
  if (bits_layout.same_bits(layout)) return absl::OkStatus();
  ADAPS_RETURN_IF_ERROR(Materialize(s));  // with the old layout
  const size_t bytes = layout.bit_words() * sizeof(uint32_t);
  for (DeviceBuffer& b : bits) ADAPS_RETURN_IF_ERROR(EnsureCapacity(b, bytes, s));
  ADAPS_RETURN_IF_ERROR(ClearBits(s));
  bits_layout = layout;
  return absl::OkStatus();
}

CudaSliceState::CudaSliceState(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaSliceState::~CudaSliceState() = default;

absl::StatusOr<std::unique_ptr<CudaSliceState>> CudaSliceState::Create(size_t length,
                                                                       void* stream) {
  auto impl = std::make_unique<Impl>();
  impl->n = length;
  impl->stream = AsStream(stream);
  if (length > 0) {
    ADAPS_ASSIGN_OR_RETURN(impl->residue[0], DeviceBuffer::Allocate(length * sizeof(float)));
    ADAPS_ASSIGN_OR_RETURN(impl->ctl, DeviceBuffer::Allocate(sizeof(k::SliceCtl)));
    ADAPS_RETURN_IF_ERROR(impl->residue[0].Zero(stream));
    ADAPS_RETURN_IF_ERROR(impl->ctl.Zero(stream));
  }
  return std::unique_ptr<CudaSliceState>(new CudaSliceState(std::move(impl)));
}

size_t CudaSliceState::size() const { return impl_->n; }
absl::Status CudaSliceState::Materialize() { return impl_->Materialize(impl_->stream); }
bool CudaSliceState::fixup_pending() const { return impl_->has_pending; }

absl::StatusOr<float*> CudaSliceState::DeviceResidue() {
  ADAPS_RETURN_IF_ERROR(impl_->Materialize(impl_->stream));
  ADAPS_ASSIGN_OR_RETURN(const unsigned a, impl_->Active(impl_->stream));
  return impl_->residue[a].floats();
}

absl::Status CudaSliceState::DownloadResidue(absl::Span<float> host) {
  if (host.size() != impl_->n) {
    return absl::InvalidArgumentError(
        absl::StrCat("host buffer has ", host.size(), " floats, the slice ", impl_->n));
  }
  if (impl_->n == 0) return absl::OkStatus();
  ADAPS_ASSIGN_OR_RETURN(float* r, DeviceResidue());
  ADAPS_CUDA_CALL(cudaMemcpyAsync(host.data(), r, host.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost, impl_->stream),
                  "cudaMemcpyAsync device to host");
  ADAPS_CUDA_CALL(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
  return absl::OkStatus();
}

absl::Status CudaSliceState::UploadResidue(absl::Span<const float> host) {
  if (host.size() != impl_->n) {
    return absl::InvalidArgumentError(
        absl::StrCat("host buffer has ", host.size(), " floats, the slice ", impl_->n));
  }
  if (impl_->n == 0) return absl::OkStatus();
  ADAPS_RETURN_IF_ERROR(impl_->ResetControl(impl_->stream));
  ADAPS_CUDA_CALL(cudaMemcpyAsync(impl_->residue[0].data(), host.data(),
                                  host.size() * sizeof(float), cudaMemcpyHostToDevice,
                                  impl_->stream),
                  "cudaMemcpyAsync host to device");
  ADAPS_CUDA_CALL(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
  return absl::OkStatus();
}

absl::Status CudaSliceState::Commit() { return impl_->Commit(impl_->stream); }
absl::Status CudaSliceState::Discard() { return impl_->Discard(impl_->stream); }

absl::Status CudaSliceState::Reset() {
  if (impl_->n == 0) return absl::OkStatus();
  ADAPS_RETURN_IF_ERROR(impl_->ResetControl(impl_->stream));
  return impl_->residue[0].Zero(impl_->stream);
}

// ---------------------------------------------------------------------------------------------
// Streams, events, copies and pinned memory (the worker library's device path).

absl::Status SetDevice(int ordinal) {
  ADAPS_CUDA_CALL(cudaSetDevice(ordinal), "cudaSetDevice");
  return absl::OkStatus();
}

absl::Status CheckKernelImage() {
  const cudaError_t e = k::ProbeKernelImage();
  if (e == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  int dev = 0, major = 0, minor = 0;
  (void)cudaGetDevice(&dev);
  (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction ||
      e == cudaErrorUnsupportedPtxVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "adaps_cuda has no kernels for this GPU (sm_", major, minor, ": ", cudaGetErrorName(e),
        "); rebuild with -DADAPS_CUDA_ARCHITECTURES=\"", major, minor,
        "\" (or a list such as \"80;90\")"));
  }
  return CudaError(e, "cudaFuncGetAttributes");
}

absl::StatusOr<int> GetDevice() {
  int dev = 0;
  ADAPS_CUDA_CALL(cudaGetDevice(&dev), "cudaGetDevice");
  return dev;
}

absl::StatusOr<void*> CreateStream() {
  cudaStream_t s = nullptr;
  ADAPS_CUDA_CALL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return static_cast<void*>(s);
}

void DestroyStream(void* stream) {
  if (stream != nullptr) (void)cudaStreamDestroy(AsStream(stream));
}

absl::StatusOr<void*> RecordEvent(void* stream) {
  cudaEvent_t e = nullptr;
  ADAPS_CUDA_CALL(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  const cudaError_t rec = cudaEventRecord(e, AsStream(stream));
  if (rec != cudaSuccess) {
    (void)cudaEventDestroy(e);
    return CudaError(rec, "cudaEventRecord");
  }
  return static_cast<void*>(e);
}

void DestroyEvent(void* event) {
  if (event != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

absl::Status StreamWaitEvent(void* stream, void* event) {
  ADAPS_CUDA_CALL(cudaStreamWaitEvent(AsStream(stream), static_cast<cudaEvent_t>(event), 0),
                  "cudaStreamWaitEvent");
  return absl::OkStatus();
}

namespace {
absl::Status CopyAndWait(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                         void* stream, const char* what) {
  if (bytes == 0) return absl::OkStatus();
  ADAPS_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, kind, AsStream(stream)), what);
  ADAPS_CUDA_CALL(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
  return absl::OkStatus();
}
}  // namespace

absl::Status CopyToHost(void* host, const void* device, size_t bytes, void* stream) {
  return CopyAndWait(host, device, bytes, cudaMemcpyDeviceToHost, stream,
                     "cudaMemcpyAsync device to host");
}

absl::Status CopyToDevice(void* device, const void* host, size_t bytes, void* stream) {
  return CopyAndWait(device, host, bytes, cudaMemcpyHostToDevice, stream,
                     "cudaMemcpyAsync host to device");
}

absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes, void* stream) {
  return CopyAndWait(dst, src, bytes, cudaMemcpyDeviceToDevice, stream,
                     "cudaMemcpyAsync device to device");
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::Status PinnedBuffer::Reserve(size_t bytes) {
  if (bytes <= bytes_) return absl::OkStatus();
  if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
  ADAPS_CUDA_CALL(cudaMallocHost(&ptr_, bytes), "cudaMallocHost");
  bytes_ = bytes;
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace adaps
