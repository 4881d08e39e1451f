// Host side of adaps_cuda, part 2: the compressors and decompression into device memory. The
// kernels are in adacomp_kernels.cu, devices and slice state in cuda_device.cc; design notes in
// docs/gpu.md.
#include "common/cuda/cuda_compressor.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/adacomp_kernels.h"
#include "common/cuda/cuda_internal.h"
#include "common/status_macros.h"

namespace adaps {
namespace cuda {
namespace {

namespace k = kernels;

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

// Device scratch of DecompressAddToDevice: grown as needed, never shrunk.
struct DecompressScratch {
  DeviceBuffer a, b;

  template <typename T>
  absl::Status Upload(DeviceBuffer& buf, const std::vector<T>& v, cudaStream_t s) {
    const size_t bytes = v.size() * sizeof(T);
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(buf, bytes, s));
    if (bytes == 0) return absl::OkStatus();
    ADAPS_CUDA_CALL(cudaMemcpyAsync(buf.data(), v.data(), bytes, cudaMemcpyHostToDevice, s),
                    "cudaMemcpyAsync host to device");
    return absl::OkStatus();
  }

  absl::Status Run(const CompressedUpdate& u, float factor, float* dst, size_t n,
                   cudaStream_t s, int sm) {
    if (n != u.length) {
      return absl::InvalidArgumentError(
          absl::StrCat("update is for ", u.length, " elements, buffer has ", n));
    }
    ADAPS_RETURN_IF_ERROR(ValidateUpdate(u));
    if (n > 0 && dst == nullptr) return absl::InvalidArgumentError("device pointer is null");
    switch (u.kind) {
      case CompressorKind::kDense:
        ADAPS_RETURN_IF_ERROR(Upload(a, u.values, s));
        ADAPS_CUDA_CALL(k::LaunchDenseAdd(a.floats(), n, nullptr, factor, dst, sm, s),
                        "DenseAdd kernel launch");
        break;
      case CompressorKind::kAdaComp:
        ADAPS_RETURN_IF_ERROR(Upload(a, u.indices, s));
        ADAPS_RETURN_IF_ERROR(Upload(b, u.negative, s));
        ADAPS_CUDA_CALL(k::LaunchAdaCompAdd(static_cast<const uint32_t*>(a.data()),
                                            static_cast<const uint8_t*>(b.data()),
                                            static_cast<uint32_t>(u.indices.size()), u.scale,
                                            nullptr, factor, dst, sm, s),
                        "AdaCompAdd kernel launch");
        break;
      case CompressorKind::kTopK:
        ADAPS_RETURN_IF_ERROR(Upload(a, u.indices, s));
        ADAPS_RETURN_IF_ERROR(Upload(b, u.values, s));
        ADAPS_CUDA_CALL(k::LaunchSparseAdd(static_cast<const uint32_t*>(a.data()), b.floats(),
                                           u.indices.size(), factor, dst, sm, s),
                        "SparseAdd kernel launch");
        break;
      case CompressorKind::kSign:
        ADAPS_RETURN_IF_ERROR(Upload(a, u.sign_bits, s));
        ADAPS_CUDA_CALL(k::LaunchSignAdd(static_cast<const uint64_t*>(a.data()), n, u.scale,
                                         u.scale_neg, factor, dst, sm, s),
                        "SignAdd kernel launch");
        break;
      default:
        return absl::InvalidArgumentError("unknown compressor kind");
    }
    ADAPS_CUDA_CALL(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    return absl::OkStatus();
  }
};

// Scratch shared by both kinds: the header (+ the tiles' counts and sums), the state
// of the last Enqueue, and decompression scratch.
class CudaCompressorBase : public CudaCompressor {
 public:
  CudaCompressorBase(const CudaCompressorOptions& options, int sm_count)
      : options_(options), sm_count_(sm_count), stream_(AsStream(options.stream)) {}
  const CudaCompressorOptions& options() const override { return options_; }

  absl::Status Compress(const float* device_grad, size_t n, CudaSliceState& state,
                        CompressedUpdate& out) override {
    ADAPS_RETURN_IF_ERROR(Enqueue(device_grad, n, state));
    return Fetch(out);
  }

  absl::Status CompressPending(const float* device_grad, size_t n, CudaSliceState& state,
                               CompressedUpdate& out) override {
    ADAPS_RETURN_IF_ERROR(EnqueuePending(device_grad, n, state));
    return Fetch(out);
  }

  absl::Status Wait() override {
    CompressedUpdate scratch;
    bool failed = false;
    return WaitForStep(scratch, &failed);
  }

  absl::Status DecompressAddToDevice(const CompressedUpdate& update, float factor,
                                     float* device_dst, size_t n) override {
    return decompress_.Run(update, factor, device_dst, n, stream_, sm_count_);
  }

 protected:
  k::Header* header() const { return static_cast<k::Header*>(scratch_.data()); }

  // Waits for the last enqueue and reads its header; on a failed step `out` is the empty
  // update and *failed is set. kFailedPrecondition when nothing is enqueued.
  absl::Status WaitForStep(CompressedUpdate& out, bool* failed, k::Header* h_out = nullptr) {
    *failed = false;
    if (!have_last_) {
      return absl::FailedPreconditionError("no update: nothing successfully enqueued");
    }
    k::Header h{};
    if (last_n_ > 0) {
      ADAPS_CUDA_CALL(cudaMemcpyAsync(&h, scratch_.data(), sizeof h, cudaMemcpyDeviceToHost,
                                      stream_),
                      "cudaMemcpyAsync device to host");
      ADAPS_CUDA_CALL(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }
    if (h_out != nullptr) *h_out = h;
    return internal::ResolveStep(h.nonfinite != 0u, h.overflow != 0u, options_.base, last_n_,
                                 out, failed);
  }

  absl::Status Download(void* host, const DeviceBuffer& dev, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    ADAPS_CUDA_CALL(cudaMemcpyAsync(host, dev.data(), bytes, cudaMemcpyDeviceToHost, stream_),
                    "cudaMemcpyAsync device to host");
    return absl::OkStatus();
  }

  CudaCompressorOptions options_;
  int sm_count_;
  cudaStream_t stream_;
  DeviceBuffer scratch_;
  DecompressScratch decompress_;
  PinnedBuffer staging_;  // Fetch's copy of the indices and signs
  bool have_last_ = false;
  size_t last_n_ = 0;
};

class CudaAdaComp final : public CudaCompressorBase {
 public:
  using CudaCompressorBase::CudaCompressorBase;

  absl::Status Enqueue(const float* device_grad, size_t n, CudaSliceState& state) override {
    return EnqueuePass(device_grad, n, state, /*two_phase=*/false);
  }
  absl::Status EnqueuePending(const float* device_grad, size_t n, CudaSliceState& state) override {
    return EnqueuePass(device_grad, n, state, /*two_phase=*/true);
  }

  absl::Status Fetch(CompressedUpdate& out) override {
    bool failed = false;
    k::Header h{};
    ADAPS_RETURN_IF_ERROR(WaitForStep(out, &failed, &h));
    if (failed) return absl::OkStatus();  // kSendNothing: the empty update (errors returned)
    out.Clear();
    out.kind = CompressorKind::kAdaComp;
    out.length = static_cast<uint32_t>(last_n_);
    out.bin_size = options_.base.bin_size;
    if (last_n_ == 0) return absl::OkStatus();
    if (h.ok == 0u || h.count > last_n_) {
      return absl::InternalError(absl::StrCat("AdaComp kernel reported ", h.count,
                                              " selected elements of ", last_n_, " (ok ", h.ok,
                                              ")"));
    }
    out.scale = h.scale;
    // Through pinned staging: a copy into pageable vectors is staged by the driver in pieces
    // (6-11x the compress itself at 25M elements, docs/gpu.md); then one host memcpy.
    const size_t index_bytes = h.count * sizeof(uint32_t);
    ADAPS_RETURN_IF_ERROR(staging_.Reserve(index_bytes + h.count));
    char* staged = static_cast<char*>(staging_.data());
    ADAPS_RETURN_IF_ERROR(Download(staged, indices_, index_bytes));
    ADAPS_RETURN_IF_ERROR(Download(staged + index_bytes, negative_, h.count));
    ADAPS_CUDA_CALL(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    out.indices.resize(h.count);
    out.negative.resize(h.count);
    if (h.count > 0) {
      std::memcpy(out.indices.data(), staged, index_bytes);
      std::memcpy(out.negative.data(), staged + index_bytes, h.count);
    }
    return absl::OkStatus();
  }

  // Enqueue (two_phase false) and EnqueuePending (true).
  absl::Status EnqueuePass(const float* device_grad, size_t n, CudaSliceState& state,
                           bool two_phase) {
    have_last_ = false;  // a rejected call forgets the previous update
    ADAPS_RETURN_IF_ERROR(CheckLengths(n, state, device_grad));
    last_n_ = n;
    if (n == 0) {
      have_last_ = true;
      return absl::OkStatus();
    }
    CudaSliceState::Impl& st = state.impl();
    const uint32_t t = options_.base.bin_size;
    const k::Layout layout = k::MakeLayout(static_cast<uint32_t>(n), t);
    ADAPS_RETURN_IF_ERROR(st.PrepareForPass(layout, stream_));
    // Header, then per tile a count (8 bytes apart, so that the tile sums stay aligned) and a
    // tile sum; every tile writes its own, so only the header is zeroed.
    const size_t status_bytes = static_cast<size_t>(layout.num_tiles) * sizeof(uint64_t);
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(scratch_, kHeaderBytes + 2 * status_bytes, stream_));
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(indices_, n * sizeof(uint32_t), stream_));
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(negative_, n, stream_));
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(neg_bits_, layout.bit_words() * sizeof(uint32_t), stream_));
    if (!layout.fused) {
      ADAPS_RETURN_IF_ERROR(EnsureCapacity(gmax_, layout.num_bins * sizeof(uint32_t), stream_));
    }
    char* base = static_cast<char*>(scratch_.data());
    ADAPS_CUDA_CALL(cudaMemsetAsync(base, 0, kHeaderBytes, stream_),
                    "cudaMemsetAsync");
    if (!layout.fused) {
      ADAPS_CUDA_CALL(cudaMemsetAsync(gmax_.data(), 0, layout.num_bins * sizeof(uint32_t),
                                      stream_),
                      "cudaMemsetAsync");
    }
    k::PassArgs a;
    a.grad = device_grad;
    st.ResiduePtrs(a.residue);
    st.BitsPtrs(a.bits);
    a.ctl = st.ctl_ptr();
    a.n = static_cast<uint32_t>(n);
    a.bin_size = t;
    a.layout = layout;
    a.header = header();
    a.counts = reinterpret_cast<uint32_t*>(base + kHeaderBytes);
    a.tile_sums = reinterpret_cast<double*>(base + kHeaderBytes + status_bytes);
    a.gmax = static_cast<unsigned int*>(gmax_.data());
    a.out_indices = static_cast<uint32_t*>(indices_.data());
    a.out_negative = static_cast<uint8_t*>(negative_.data());
    a.neg_bits = static_cast<uint32_t*>(neg_bits_.data());
    a.two_phase = two_phase;
    ADAPS_CUDA_CALL(k::LaunchAdaCompPass(a, stream_), "AdaComp pass kernel launch");
    st.maybe_staged = two_phase;  // the pass replaced a staged set, or staged its own
    if (two_phase) {
      st.materialize_on_commit = !options_.defer_residue_fixup;  // the old set stays active
    } else {
      st.has_pending = true;  // in the new set if the step succeeded (layout st.bits_layout)
      if (!options_.defer_residue_fixup) ADAPS_RETURN_IF_ERROR(st.Materialize(stream_));
    }
    have_last_ = true;
    return absl::OkStatus();
  }

  absl::Status DecompressAddLast(float factor, float* device_dst) override {
    if (!have_last_) {
      return absl::FailedPreconditionError("DecompressAddLast without a successful Enqueue");
    }
    if (last_n_ == 0) return absl::OkStatus();
    if (device_dst == nullptr) return absl::InvalidArgumentError("device pointer is null");
    // The kernel reads count, scale and ok from the header: a failed step adds nothing.
    ADAPS_CUDA_CALL(k::LaunchAdaCompAdd(static_cast<const uint32_t*>(indices_.data()),
                                        static_cast<const uint8_t*>(negative_.data()), 0, 0.0f,
                                        header(), factor, device_dst, sm_count_, stream_),
                    "AdaCompAdd kernel launch");
    return absl::OkStatus();
  }

 private:
  DeviceBuffer indices_, negative_, gmax_, neg_bits_;
};

// The dense baseline: the "compressed" update is a copy of the gradient.
class CudaDense final : public CudaCompressorBase {
 public:
  using CudaCompressorBase::CudaCompressorBase;

  absl::Status Enqueue(const float* device_grad, size_t n, CudaSliceState& state) override {
    have_last_ = false;  // a rejected call forgets the previous update
    ADAPS_RETURN_IF_ERROR(CheckLengths(n, state, device_grad));
    last_n_ = n;
    if (n == 0) {
      have_last_ = true;
      return absl::OkStatus();
    }
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(scratch_, kHeaderBytes, stream_));
    ADAPS_RETURN_IF_ERROR(EnsureCapacity(values_, n * sizeof(float), stream_));
    ADAPS_CUDA_CALL(cudaMemsetAsync(scratch_.data(), 0, kHeaderBytes, stream_),
                    "cudaMemsetAsync");
    ADAPS_CUDA_CALL(k::LaunchCheckFinite(device_grad, n, header(), sm_count_, stream_),
                    "CheckFinite kernel launch");
    ADAPS_RETURN_IF_ERROR(
        CopyDeviceToDevice(values_.data(), device_grad, n * sizeof(float), stream_));
    have_last_ = true;
    return absl::OkStatus();
  }
  // No residue: nothing is ever staged (as the CPU's dense CompressPending).
  absl::Status EnqueuePending(const float* device_grad, size_t n, CudaSliceState& state) override {
    return Enqueue(device_grad, n, state);
  }

  absl::Status Fetch(CompressedUpdate& out) override {
    bool failed = false;
    ADAPS_RETURN_IF_ERROR(WaitForStep(out, &failed));
    if (failed) return absl::OkStatus();
    out.Clear();
    out.kind = CompressorKind::kDense;
    out.length = static_cast<uint32_t>(last_n_);
    out.values.resize(last_n_);
    if (last_n_ == 0) return absl::OkStatus();
    ADAPS_RETURN_IF_ERROR(Download(out.values.data(), values_, last_n_ * sizeof(float)));
    ADAPS_CUDA_CALL(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return absl::OkStatus();
  }

  absl::Status DecompressAddLast(float factor, float* device_dst) override {
    if (!have_last_) {
      return absl::FailedPreconditionError("DecompressAddLast without a successful Enqueue");
    }
    if (last_n_ == 0) return absl::OkStatus();
    if (device_dst == nullptr) return absl::InvalidArgumentError("device pointer is null");
    ADAPS_CUDA_CALL(k::LaunchDenseAdd(values_.floats(), last_n_, header(), factor, device_dst,
                                      sm_count_, stream_),
                    "DenseAdd kernel launch");
    return absl::OkStatus();
  }

 private:
  DeviceBuffer values_;
};

absl::StatusOr<std::unique_ptr<CudaCompressor>> MakeUnchecked(const CudaCompressorOptions& o) {
  ADAPS_RETURN_IF_ERROR(ValidateOptions(o.base));
  if (o.base.kind != CompressorKind::kAdaComp && o.base.kind != CompressorKind::kDense) {
    return absl::UnimplementedError(absl::StrCat("no GPU path for the ",
                                                 CompressorKindName(o.base.kind),
                                                 " compressor (only adacomp and dense)"));
  }
  const int sm_count = k::MultiProcessorCount();
  if (o.base.kind == CompressorKind::kAdaComp) {
    return std::unique_ptr<CudaCompressor>(new CudaAdaComp(o, sm_count));
  }
  return std::unique_ptr<CudaCompressor>(new CudaDense(o, sm_count));
}

}  // namespace

namespace internal {

absl::Status ResolveStep(bool nonfinite_gradient, bool overflow, const CompressorOptions& options,
                         size_t n, CompressedUpdate& out, bool* failed) {
  *failed = nonfinite_gradient || overflow;
  if (!*failed) return absl::OkStatus();
  out.Clear();
  out.kind = options.kind;
  out.length = static_cast<uint32_t>(n);
  if (options.kind == CompressorKind::kAdaComp) out.bin_size = options.bin_size;
  if (nonfinite_gradient) {
    if (options.non_finite == NonFinitePolicy::kSendNothing) {
      if (options.kind == CompressorKind::kDense) out.values.assign(n, 0.0f);
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError("gradient holds NaN or Inf; residue left unchanged");
  }
  return absl::OutOfRangeError(
      "AdaComp residue + gradient overflows the float range; residue left unchanged");
}

absl::StatusOr<std::unique_ptr<CudaCompressor>> MakeCudaCompressorWithoutDeviceCheck(
    const CudaCompressorOptions& options) {
  return MakeUnchecked(options);
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<CudaCompressor>> MakeCudaCompressor(
    const CudaCompressorOptions& options) {
  ADAPS_RETURN_IF_ERROR(ValidateOptions(options.base));
  if (options.base.kind != CompressorKind::kAdaComp &&
      options.base.kind != CompressorKind::kDense) {
    return MakeUnchecked(options).status();  // kUnimplemented, before the device is touched
  }
  ADAPS_RETURN_IF_ERROR(CudaAvailable());
  return MakeUnchecked(options);
}

absl::StatusOr<std::unique_ptr<CudaCompressor>> MakeCudaAdaComp(CompressorOptions options,
                                                               bool defer_residue_fixup) {
  options.kind = CompressorKind::kAdaComp;
  CudaCompressorOptions o;
  o.base = options;
  o.defer_residue_fixup = defer_residue_fixup;
  return MakeCudaCompressor(o);
}

absl::Status DecompressAddToDevice(const CompressedUpdate& update, float factor,
                                   float* device_dst, size_t n) {
  thread_local DecompressScratch scratch;  // per thread: no allocation once large enough
  return scratch.Run(update, factor, device_dst, n, nullptr, k::MultiProcessorCount());
}

}  // namespace cuda
}  // namespace adaps
