// The CUDA device of the worker library's device path (worker/device.h): residues in device
// memory, AdaComp on the device (common/cuda/, docs/gpu.md), the update copied to the host
// through pinned staging, pull answers added on the device. Built only with CUDA
// (ADAPS_WORKER_WITH_CUDA); includes no CUDA header itself.
//
// Every call makes the device current on the calling thread for its duration and restores
// the thread's own afterwards (the trainer's thread calls some of them: a trainer using other
// devices keeps its current one), and issues its work on the Worker's own stream of that
// device.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_compressor.h"
#include "common/status_macros.h"
#include "worker/device.h"

namespace adaps {
namespace {

// The device current on this thread while it lives; the thread's previous one afterwards.
// `ordinal` was checked against the device count when its device opened.
class OnDevice {
 public:
  explicit OnDevice(int ordinal) {
    absl::StatusOr<int> current = cuda::GetDevice();
    if (!current.ok()) {
      status_ = current.status();
      return;
    }
    previous_ = *current;
    if (previous_ != ordinal) {
      status_ = cuda::SetDevice(ordinal);
      changed_ = status_.ok();
    }
  }
  ~OnDevice() {
    if (changed_) (void)cuda::SetDevice(previous_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = 0;
  bool changed_ = false;
  absl::Status status_;
};

#define ADAPS_ON_DEVICE(ordinal)    \
  OnDevice on_device_(ordinal);     \
  ADAPS_RETURN_IF_ERROR(on_device_.status())

class CudaResidue final : public DeviceResidue {
 public:
  CudaResidue(int ordinal, std::unique_ptr<cuda::CudaSliceState> state)
      : ordinal_(ordinal), state_(std::move(state)) {}
  absl::Status Commit() override {
    ADAPS_ON_DEVICE(ordinal_);
    return state_->Commit();
  }
  absl::Status Discard() override {
    ADAPS_ON_DEVICE(ordinal_);
    return state_->Discard();
  }
  absl::Status Zero() override {
    ADAPS_ON_DEVICE(ordinal_);
    return state_->Reset();
  }
  absl::Status Download(absl::Span<float> host) override {
    ADAPS_ON_DEVICE(ordinal_);
    return state_->DownloadResidue(host);
  }
  absl::Status Upload(absl::Span<const float> host) override {
    ADAPS_ON_DEVICE(ordinal_);
    ADAPS_RETURN_IF_ERROR(state_->Discard());
    return state_->UploadResidue(host);
  }
  size_t size() const override { return state_->size(); }
  cuda::CudaSliceState& state() { return *state_; }

 private:
  const int ordinal_;
  std::unique_ptr<cuda::CudaSliceState> state_;
};

class CudaCodec final : public DeviceCodec {
 public:
  CudaCodec(int ordinal, std::unique_ptr<cuda::CudaCompressor> compressor)
      : ordinal_(ordinal), compressor_(std::move(compressor)) {}
  absl::Status CompressPending(const float* grad, size_t n, DeviceResidue& residue,
                               CompressedUpdate& out) override {
    ADAPS_ON_DEVICE(ordinal_);
    return compressor_->CompressPending(grad, n, static_cast<CudaResidue&>(residue).state(),
                                        out);
  }
  absl::Status AddUpdate(const CompressedUpdate& update, float* dst, size_t n) override {
    ADAPS_ON_DEVICE(ordinal_);
    return compressor_->DecompressAddToDevice(update, 1.0f, dst, n);
  }

 private:
  const int ordinal_;
  std::unique_ptr<cuda::CudaCompressor> compressor_;
};

class CudaArray final : public DeviceArray {
 public:
  explicit CudaArray(cuda::DeviceBuffer buffer) : buffer_(std::move(buffer)) {}
  float* data() override { return buffer_.floats(); }

 private:
  cuda::DeviceBuffer buffer_;
};

class CudaMark final : public DeviceMark {
 public:
  explicit CudaMark(void* event) : event_(event) {}
  ~CudaMark() override { cuda::DestroyEvent(event_); }
  void* event() const { return event_; }

 private:
  void* event_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, void* stream) : ordinal_(ordinal), stream_(stream) {}
  ~CudaDevice() override {
    OnDevice on(ordinal_);
    if (on.status().ok()) cuda::DestroyStream(stream_);
  }
  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }
  absl::StatusOr<std::unique_ptr<DeviceCodec>> NewCodec(
      const CompressorOptions& options) override {
    ADAPS_ON_DEVICE(ordinal_);
    cuda::CudaCompressorOptions o;
    o.base = options;
    o.stream = stream_;
    ADAPS_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaCompressor> c, cuda::MakeCudaCompressor(o));
    return std::unique_ptr<DeviceCodec>(new CudaCodec(ordinal_, std::move(c)));
  }
  absl::StatusOr<std::unique_ptr<DeviceResidue>> NewResidue(size_t n) override {
    ADAPS_ON_DEVICE(ordinal_);
    ADAPS_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaSliceState> s,
                           cuda::CudaSliceState::Create(n, stream_));
    return std::unique_ptr<DeviceResidue>(new CudaResidue(ordinal_, std::move(s)));
  }
  absl::StatusOr<std::unique_ptr<DeviceArray>> NewArray(size_t n) override {
    ADAPS_ON_DEVICE(ordinal_);
    ADAPS_ASSIGN_OR_RETURN(cuda::DeviceBuffer b, cuda::DeviceBuffer::Allocate(n * sizeof(float)));
    ADAPS_RETURN_IF_ERROR(b.Zero(stream_));
    return std::unique_ptr<DeviceArray>(new CudaArray(std::move(b)));
  }
  absl::Status ToHost(void* host, const void* device, size_t bytes) override {
    ADAPS_ON_DEVICE(ordinal_);
    return cuda::CopyToHost(host, device, bytes, stream_);
  }
  absl::Status ToDevice(void* device, const void* host, size_t bytes) override {
    ADAPS_ON_DEVICE(ordinal_);
    return cuda::CopyToDevice(device, host, bytes, stream_);
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    ADAPS_ON_DEVICE(ordinal_);
    return cuda::CopyOnDevice(dst, src, bytes, stream_);
  }
  absl::StatusOr<std::shared_ptr<DeviceMark>> Mark(void* stream) override {
    ADAPS_ON_DEVICE(ordinal_);
    ADAPS_ASSIGN_OR_RETURN(void* event, cuda::RecordEvent(stream));
    return std::shared_ptr<DeviceMark>(new CudaMark(event));
  }
  absl::Status WaitFor(const DeviceMark& mark) override {
    ADAPS_ON_DEVICE(ordinal_);
    return cuda::StreamWaitEvent(stream_, static_cast<const CudaMark&>(mark).event());
  }

 private:
  const int ordinal_;
  void* const stream_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Device>> OpenCudaDevice(int ordinal) {
  ADAPS_RETURN_IF_ERROR(cuda::CudaAvailable());
  ADAPS_ASSIGN_OR_RETURN(const int count, cuda::CudaDeviceCount());
  ADAPS_RET_CHECK(ordinal < count, absl::StatusCode::kInvalidArgument,
                  absl::StrCat("CUDA device ", ordinal, " does not exist (", count, " visible)"));
  ADAPS_ON_DEVICE(ordinal);
  // (Before anything is declared: a GPU this library has no kernels for fails here, not at
  // its first push.)
  ADAPS_RETURN_IF_ERROR(cuda::CheckKernelImage());
  ADAPS_ASSIGN_OR_RETURN(void* stream, cuda::CreateStream());
  return std::shared_ptr<Device>(new CudaDevice(ordinal, stream));
}

}  // namespace adaps
