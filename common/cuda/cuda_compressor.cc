// Host side of adaps_cuda: device memory, slice state, the compressors and error mapping. The
// kernels are in adacomp_kernels.cu; design notes in docs/gpu.md.
#include "common/cuda/cuda_compressor.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/adacomp_kernels.h"
#include "common/status_macros.h"

namespace adaps {
namespace cuda {
namespace {

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

#define ADAPS_CUDA_CALL(expr, what) ADAPS_RETURN_IF_ERROR(CudaError((expr), (what)))

constexpr size_t kHeaderBytes = 64;
static_assert(sizeof(k::Header) <= kHeaderBytes, "header too large");

absl::Status CheckLengths(size_t grad_n, const CudaSliceState& state, const float* grad) {
  if (grad_n != state.size()) {
    return absl::InvalidArgumentError(absl::StrCat("gradient has ", grad_n,
                                                   " elements but the slice has ", state.size()));
  }
  if (grad_n > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice of ", grad_n, " elements is longer than 2^32-1"));
  }
  if (grad_n > 0 && grad == nullptr) {
    return absl::InvalidArgumentError("gradient device pointer is null");
  }
  return absl::OkStatus();
}

absl::Status EnsureCapacity(DeviceBuffer& buf, size_t bytes) {
  if (buf.bytes() >= bytes) return absl::OkStatus();
  buf = DeviceBuffer();  // free first: the peak is then the new size only
  ADAPS_ASSIGN_OR_RETURN(buf, DeviceBuffer::Allocate(bytes));
  return absl::OkStatus();
}

}  // namespace

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

absl::Status DeviceBuffer::Zero() {
  if (bytes_ == 0) return absl::OkStatus();
  ADAPS_CUDA_CALL(cudaMemsetAsync(ptr_, 0, bytes_, 0), "cudaMemsetAsync");
  return absl::OkStatus();
}

absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  ADAPS_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0),
                  "cudaMemcpyAsync device to device");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// CudaSliceState.

struct CudaSliceState::Impl {
  size_t n = 0;
  DeviceBuffer residue;        // n floats
  DeviceBuffer pending_scale;  // 1 float: s of the deferred fix-up
  DeviceBuffer bits;           // selection bitmask of the last compress
  uint32_t pending_tile_elems = 0;  // layout of `bits`; 0: no fix-up pending
  uint32_t pending_num_tiles = 0;

  absl::Status Materialize() {
    if (pending_tile_elems == 0) return absl::OkStatus();
    ADAPS_CUDA_CALL(k::LaunchApplyPending(residue.floats(), pending_tile_elems,
                                          pending_num_tiles, static_cast<uint32_t*>(bits.data()),
                                          pending_scale.floats()),
                    "ApplyPending kernel launch");
    pending_tile_elems = 0;
    pending_num_tiles = 0;
    return absl::OkStatus();
  }

  absl::Status EnsureBits(size_t words) {
    if (bits.bytes() >= words * sizeof(uint32_t)) return absl::OkStatus();
    ADAPS_RETURN_IF_ERROR(Materialize());
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(bits, words * sizeof(uint32_t)));
    return bits.Zero();
  }
};

CudaSliceState::CudaSliceState(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaSliceState::~CudaSliceState() = default;

absl::StatusOr<std::unique_ptr<CudaSliceState>> CudaSliceState::Create(size_t length) {
  auto impl = std::make_unique<Impl>();
  impl->n = length;
  ADAPS_ASSIGN_OR_RETURN(impl->residue, DeviceBuffer::Allocate(length * sizeof(float)));
  ADAPS_ASSIGN_OR_RETURN(impl->pending_scale, DeviceBuffer::Allocate(sizeof(float)));
  ADAPS_RETURN_IF_ERROR(impl->residue.Zero());
  ADAPS_RETURN_IF_ERROR(impl->pending_scale.Zero());
  return std::unique_ptr<CudaSliceState>(new CudaSliceState(std::move(impl)));
}

size_t CudaSliceState::size() const { return impl_->n; }
absl::Status CudaSliceState::Materialize() { return impl_->Materialize(); }
bool CudaSliceState::fixup_pending() const { return impl_->pending_tile_elems != 0; }
float* CudaSliceState::device_residue() { return impl_->residue.floats(); }

absl::Status CudaSliceState::DownloadResidue(absl::Span<float> host) {
  if (host.size() != impl_->n) {
    return absl::InvalidArgumentError(
        absl::StrCat("host buffer has ", host.size(), " floats, the slice ", impl_->n));
  }
  ADAPS_RETURN_IF_ERROR(impl_->Materialize());
  return impl_->residue.Download(host.data(), host.size() * sizeof(float));
}

absl::Status CudaSliceState::UploadResidue(absl::Span<const float> host) {
  if (host.size() != impl_->n) {
    return absl::InvalidArgumentError(
        absl::StrCat("host buffer has ", host.size(), " floats, the slice ", impl_->n));
  }
  ADAPS_RETURN_IF_ERROR(impl_->bits.Zero());
  impl_->pending_tile_elems = 0;
  impl_->pending_num_tiles = 0;
  return impl_->residue.Upload(host.data(), host.size() * sizeof(float));
}

absl::Status CudaSliceState::Reset() {
  ADAPS_RETURN_IF_ERROR(impl_->bits.Zero());
  impl_->pending_tile_elems = 0;
  impl_->pending_num_tiles = 0;
  return impl_->residue.Zero();
}

// ---------------------------------------------------------------------------------------------
// Compressors.

namespace {

// Scratch shared by both kinds: the header (+ look-back status words and tile sums).
class CudaCompressorBase : public CudaCompressor {
 public:
  CudaCompressorBase(const CudaCompressorOptions& options, int sm_count)
      : options_(options), sm_count_(sm_count) {}
  const CudaCompressorOptions& options() const override { return options_; }

  absl::Status Compress(const float* device_grad, size_t n, CudaSliceState& state,
                        CompressedUpdate& out) override {
    ADAPS_RETURN_IF_ERROR(Enqueue(device_grad, n, state));
    return Fetch(out);
  }

 protected:
  k::Header* header() const { return static_cast<k::Header*>(scratch_.data()); }

  // Reads the header of the last enqueue (blocks until the kernels are done).
  absl::Status ReadHeader(k::Header* h) {
    return scratch_.Download(h, sizeof(k::Header));
  }

  absl::Status NonFiniteResult(CompressedUpdate& out, CompressorKind kind) {
    if (options_.base.non_finite == NonFinitePolicy::kReject) {
      return absl::InvalidArgumentError("gradient holds NaN or Inf; residue left unchanged");
    }
    out.Clear();
    out.kind = kind;
    out.length = static_cast<uint32_t>(last_n_);
    if (kind == CompressorKind::kAdaComp) {
      out.bin_size = options_.base.bin_size;
    } else {
      out.values.assign(last_n_, 0.0f);
    }
    return absl::OkStatus();
  }

  CudaCompressorOptions options_;
  int sm_count_;
  DeviceBuffer scratch_;
  bool have_last_ = false;
  size_t last_n_ = 0;
};

class CudaAdaComp final : public CudaCompressorBase {
 public:
  using CudaCompressorBase::CudaCompressorBase;

  absl::Status Enqueue(const float* device_grad, size_t n, CudaSliceState& state) override {
    ADAPS_RETURN_IF_ERROR(CheckLengths(n, state, device_grad));
    have_last_ = false;
    last_n_ = n;
    if (n == 0) {
      have_last_ = true;
      return absl::OkStatus();
    }
    CudaSliceState::Impl& st = state.impl();
    const uint32_t t = options_.base.bin_size;
    const k::Layout layout = k::MakeLayout(static_cast<uint32_t>(n), t);
    if (st.pending_tile_elems != 0 && st.pending_tile_elems != layout.tile_elems) {
      ADAPS_RETURN_IF_ERROR(st.Materialize());
    }
    ADAPS_RETURN_IF_ERROR(st.EnsureBits(static_cast<size_t>(layout.num_tiles) * k::kWordsPerTile));
    const size_t status_bytes = static_cast<size_t>(layout.num_tiles) * sizeof(uint64_t);
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(scratch_, kHeaderBytes + 2 * status_bytes));
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(indices_, n * sizeof(uint32_t)));
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(negative_, n));
    if (!layout.fused) {
      ADAPS_RETURN_IF_ERROR(EnsureCapacity(gmax_, layout.num_bins * sizeof(uint32_t)));
    }
    char* base = static_cast<char*>(scratch_.data());
    ADAPS_CUDA_CALL(cudaMemsetAsync(base, 0, kHeaderBytes + status_bytes, 0), "cudaMemsetAsync");
    ADAPS_CUDA_CALL(k::LaunchCheckFinite(device_grad, n, header(), sm_count_),
                    "CheckFinite kernel launch");
    if (!layout.fused) {
      ADAPS_CUDA_CALL(cudaMemsetAsync(gmax_.data(), 0, layout.num_bins * sizeof(uint32_t), 0),
                      "cudaMemsetAsync");
    }
    k::PassArgs a;
    a.grad = device_grad;
    a.residue = st.residue.floats();
    a.n = static_cast<uint32_t>(n);
    a.bin_size = t;
    a.layout = layout;
    a.bits = static_cast<uint32_t*>(st.bits.data());
    a.pending_scale = st.pending_scale.floats();
    a.header = header();
    a.status = reinterpret_cast<unsigned long long*>(base + kHeaderBytes);
    a.tile_sums = reinterpret_cast<double*>(base + kHeaderBytes + status_bytes);
    a.gmax = static_cast<unsigned int*>(gmax_.data());
    a.out_indices = static_cast<uint32_t*>(indices_.data());
    a.out_negative = static_cast<uint8_t*>(negative_.data());
    ADAPS_CUDA_CALL(k::LaunchAdaCompPass(a), "AdaComp pass kernel launch");
    st.pending_tile_elems = layout.tile_elems;
    st.pending_num_tiles = layout.num_tiles;
    if (!options_.defer_residue_fixup) ADAPS_RETURN_IF_ERROR(st.Materialize());
    have_last_ = true;
    return absl::OkStatus();
  }

  absl::Status Fetch(CompressedUpdate& out) override {
    if (!have_last_) return absl::FailedPreconditionError("Fetch without a successful Enqueue");
    const uint32_t t = options_.base.bin_size;
    if (last_n_ == 0) {
      out.Clear();
      out.kind = CompressorKind::kAdaComp;
      out.length = 0;
      out.bin_size = t;
      return absl::OkStatus();
    }
    k::Header h;
    ADAPS_RETURN_IF_ERROR(ReadHeader(&h));
    if (h.nonfinite != 0u) return NonFiniteResult(out, CompressorKind::kAdaComp);
    if (h.count > last_n_) {
      return absl::InternalError(absl::StrCat("AdaComp kernel reported ", h.count,
                                              " selected elements of ", last_n_));
    }
    out.Clear();
    out.kind = CompressorKind::kAdaComp;
    out.length = static_cast<uint32_t>(last_n_);
    out.bin_size = t;
    out.scale = h.scale;
    out.indices.resize(h.count);
    out.negative.resize(h.count);
    ADAPS_RETURN_IF_ERROR(indices_.Download(out.indices.data(), h.count * sizeof(uint32_t)));
    ADAPS_RETURN_IF_ERROR(negative_.Download(out.negative.data(), h.count));
    if (!std::isfinite(out.scale)) {
      return absl::OutOfRangeError("AdaComp residue overflowed the float range");
    }
    return absl::OkStatus();
  }

  absl::Status DecompressAddLast(float factor, float* device_dst) override {
    if (!have_last_) {
      return absl::FailedPreconditionError("DecompressAddLast without a successful Enqueue");
    }
    if (last_n_ == 0) return absl::OkStatus();
    ADAPS_CUDA_CALL(k::LaunchAdaCompAdd(static_cast<const uint32_t*>(indices_.data()),
                                        static_cast<const uint8_t*>(negative_.data()), 0, 0.0f,
                                        header(), factor, device_dst, sm_count_),
                    "AdaCompAdd kernel launch");
    return absl::OkStatus();
  }

 private:
  DeviceBuffer indices_, negative_, gmax_;
};

// The dense baseline: the "compressed" update is a copy of the gradient.
class CudaDense final : public CudaCompressorBase {
 public:
  using CudaCompressorBase::CudaCompressorBase;

  absl::Status Enqueue(const float* device_grad, size_t n, CudaSliceState& state) override {
    ADAPS_RETURN_IF_ERROR(CheckLengths(n, state, device_grad));
    have_last_ = false;
    last_n_ = n;
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(scratch_, kHeaderBytes));
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(values_, n * sizeof(float)));
    ADAPS_CUDA_CALL(cudaMemsetAsync(scratch_.data(), 0, kHeaderBytes, 0), "cudaMemsetAsync");
    ADAPS_CUDA_CALL(k::LaunchCheckFinite(device_grad, n, header(), sm_count_),
                    "CheckFinite kernel launch");
    ADAPS_RETURN_IF_ERROR(CopyDeviceToDevice(values_.data(), device_grad, n * sizeof(float)));
    have_last_ = true;
    return absl::OkStatus();
  }

  absl::Status Fetch(CompressedUpdate& out) override {
    if (!have_last_) return absl::FailedPreconditionError("Fetch without a successful Enqueue");
    k::Header h;
    ADAPS_RETURN_IF_ERROR(ReadHeader(&h));
    if (h.nonfinite != 0u) return NonFiniteResult(out, CompressorKind::kDense);
    out.Clear();
    out.kind = CompressorKind::kDense;
    out.length = static_cast<uint32_t>(last_n_);
    out.values.resize(last_n_);
    return values_.Download(out.values.data(), last_n_ * sizeof(float));
  }

  absl::Status DecompressAddLast(float factor, float* device_dst) override {
    if (!have_last_) {
      return absl::FailedPreconditionError("DecompressAddLast without a successful Enqueue");
    }
    ADAPS_CUDA_CALL(k::LaunchDenseAdd(values_.floats(), last_n_, header(), factor, device_dst,
                                      sm_count_),
                    "DenseAdd kernel launch");
    return absl::OkStatus();
  }

 private:
  DeviceBuffer values_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaCompressor>> MakeCudaCompressor(
    const CudaCompressorOptions& options) {
  ADAPS_RETURN_IF_ERROR(ValidateOptions(options.base));
  if (options.base.kind != CompressorKind::kAdaComp &&
      options.base.kind != CompressorKind::kDense) {
    return absl::UnimplementedError(absl::StrCat("no GPU path for the ",
                                                 CompressorKindName(options.base.kind),
                                                 " compressor (only adacomp and dense)"));
  }
  ADAPS_RETURN_IF_ERROR(CudaAvailable());
  const int sm_count = k::MultiProcessorCount();
  if (options.base.kind == CompressorKind::kAdaComp) {
    return std::unique_ptr<CudaCompressor>(new CudaAdaComp(options, sm_count));
  }
  return std::unique_ptr<CudaCompressor>(new CudaDense(options, sm_count));
}

absl::StatusOr<std::unique_ptr<CudaCompressor>> MakeCudaAdaComp(CompressorOptions options,
                                                               bool defer_residue_fixup) {
  options.kind = CompressorKind::kAdaComp;
  CudaCompressorOptions o;
  o.base = options;
  o.defer_residue_fixup = defer_residue_fixup;
  return MakeCudaCompressor(o);
}

// ---------------------------------------------------------------------------------------------
// Decompress a host update into device memory.

absl::Status DecompressAddToDevice(const CompressedUpdate& u, float factor, float* device_dst,
                                   size_t n) {
  if (n != u.length) {
    return absl::InvalidArgumentError(
        absl::StrCat("update is for ", u.length, " elements, buffer has ", n));
  }
  ADAPS_RETURN_IF_ERROR(ValidateUpdate(u));
  const int sm = k::MultiProcessorCount();
  switch (u.kind) {
    case CompressorKind::kDense: {
      ADAPS_ASSIGN_OR_RETURN(DeviceBuffer v, DeviceBuffer::FromHost(u.values));
      ADAPS_CUDA_CALL(k::LaunchDenseAdd(v.floats(), n, nullptr, factor, device_dst, sm),
                      "DenseAdd kernel launch");
      break;
    }
    case CompressorKind::kAdaComp: {
      const size_t c = u.indices.size();
      ADAPS_ASSIGN_OR_RETURN(DeviceBuffer idx, DeviceBuffer::Allocate(c * sizeof(uint32_t)));
      ADAPS_ASSIGN_OR_RETURN(DeviceBuffer neg, DeviceBuffer::Allocate(c));
      ADAPS_RETURN_IF_ERROR(idx.Upload(u.indices.data(), c * sizeof(uint32_t)));
      ADAPS_RETURN_IF_ERROR(neg.Upload(u.negative.data(), c));
      ADAPS_CUDA_CALL(k::LaunchAdaCompAdd(static_cast<const uint32_t*>(idx.data()),
                                          static_cast<const uint8_t*>(neg.data()),
                                          static_cast<uint32_t>(c), u.scale, nullptr, factor,
                                          device_dst, sm),
                      "AdaCompAdd kernel launch");
      ADAPS_RETURN_IF_ERROR(CudaSynchronize());  // before idx and neg are freed
      break;
    }
    case CompressorKind::kTopK: {
      const size_t c = u.indices.size();
      ADAPS_ASSIGN_OR_RETURN(DeviceBuffer idx, DeviceBuffer::Allocate(c * sizeof(uint32_t)));
      ADAPS_RETURN_IF_ERROR(idx.Upload(u.indices.data(), c * sizeof(uint32_t)));
      ADAPS_ASSIGN_OR_RETURN(DeviceBuffer v, DeviceBuffer::FromHost(u.values));
      ADAPS_CUDA_CALL(k::LaunchSparseAdd(static_cast<const uint32_t*>(idx.data()), v.floats(), c,
                                         factor, device_dst, sm),
                      "SparseAdd kernel launch");
      ADAPS_RETURN_IF_ERROR(CudaSynchronize());
      break;
    }
    case CompressorKind::kSign: {
      ADAPS_ASSIGN_OR_RETURN(DeviceBuffer b,
                             DeviceBuffer::Allocate(u.sign_bits.size() * sizeof(uint64_t)));
      ADAPS_RETURN_IF_ERROR(b.Upload(u.sign_bits.data(), u.sign_bits.size() * sizeof(uint64_t)));
      ADAPS_CUDA_CALL(k::LaunchSignAdd(static_cast<const uint64_t*>(b.data()), n, u.scale,
                                       u.scale_neg, factor, device_dst, sm),
                      "SignAdd kernel launch");
      ADAPS_RETURN_IF_ERROR(CudaSynchronize());
      break;
    }
    default:
      return absl::InvalidArgumentError("unknown compressor kind");
  }
  return CudaSynchronize();
}

}  // namespace cuda
}  // namespace adaps
