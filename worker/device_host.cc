// A device in host memory (WorkerOptions::emulate_devices): the worker library's device path
// with the CPU codec doing the device's work, bit for bit what the CUDA kernels compute
// (docs/gpu.md: the CPU code is their oracle). Also OpenDevice, and OpenCudaDevice's stub for
// a library built without CUDA.
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/device.h"

namespace adaps {
namespace {

class HostResidue final : public DeviceResidue {
 public:
  explicit HostResidue(size_t n) : state_(n) {}
  absl::Status Commit() override {
    state_.Commit();
    return absl::OkStatus();
  }
  absl::Status Discard() override {
    state_.Discard();
    return absl::OkStatus();
  }
  absl::Status Zero() override {
    state_.Discard();
    state_.Reset();
    return absl::OkStatus();
  }
  absl::Status Download(absl::Span<float> host) override {
    ADAPS_RETURN_IF_ERROR(CheckSize(host.size()));
    const absl::Span<const float> r = state_.residue();
    std::copy(r.begin(), r.end(), host.begin());
    return absl::OkStatus();
  }
  absl::Status Upload(absl::Span<const float> host) override {
    ADAPS_RETURN_IF_ERROR(CheckSize(host.size()));
    state_.Discard();
    absl::Span<float> r = state_.residue();
    std::copy(host.begin(), host.end(), r.begin());
    return absl::OkStatus();
  }
  size_t size() const override { return state_.size(); }
  SliceState& state() { return state_; }

 private:
  absl::Status CheckSize(size_t n) const {
    ADAPS_RET_CHECK(n == state_.size(), absl::StatusCode::kInvalidArgument,
                    absl::StrCat("residue of ", state_.size(), " elements, buffer of ", n));
    return absl::OkStatus();
  }
  SliceState state_;
};

class HostCodec final : public DeviceCodec {
 public:
  explicit HostCodec(std::unique_ptr<Compressor> compressor)
      : compressor_(std::move(compressor)) {}
  absl::Status CompressPending(const float* grad, size_t n, DeviceResidue& residue,
                               CompressedUpdate& out) override {
    return compressor_->CompressPending(absl::MakeConstSpan(grad, n),
                                        static_cast<HostResidue&>(residue).state(), out);
  }
  absl::Status AddUpdate(const CompressedUpdate& update, float* dst, size_t n) override {
    return DecompressAdd(update, 1.0f, absl::MakeSpan(dst, n));
  }

 private:
  std::unique_ptr<Compressor> compressor_;
};

class HostArray final : public DeviceArray {
 public:
  explicit HostArray(size_t n) : v_(n, 0.0f) {}
  float* data() override { return v_.data(); }

 private:
  std::vector<float> v_;
};

class HostDevice final : public Device {
 public:
  explicit HostDevice(int ordinal) : ordinal_(ordinal) {}
  std::string name() const override {
    return absl::StrCat("cuda:", ordinal_, " (emulated in host memory)");
  }
  absl::StatusOr<std::unique_ptr<DeviceCodec>> NewCodec(
      const CompressorOptions& options) override {
    ADAPS_RET_CHECK(options.kind == CompressorKind::kAdaComp, absl::StatusCode::kInvalidArgument,
                    "a device compresses with AdaComp only");
    ADAPS_ASSIGN_OR_RETURN(std::unique_ptr<Compressor> c, MakeCompressor(options));
    return std::unique_ptr<DeviceCodec>(new HostCodec(std::move(c)));
  }
  absl::StatusOr<std::unique_ptr<DeviceResidue>> NewResidue(size_t n) override {
    return std::unique_ptr<DeviceResidue>(new HostResidue(n));
  }
  absl::StatusOr<std::unique_ptr<DeviceArray>> NewArray(size_t n) override {
    return std::unique_ptr<DeviceArray>(new HostArray(n));
  }
  absl::Status ToHost(void* host, const void* device, size_t bytes) override {
    if (bytes > 0) std::memcpy(host, device, bytes);
    return absl::OkStatus();
  }
  absl::Status ToDevice(void* device, const void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(device, host, bytes);
    return absl::OkStatus();
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<DeviceMark>> Mark(void*) override {
    return std::make_shared<DeviceMark>();
  }
  absl::Status WaitFor(const DeviceMark&) override { return absl::OkStatus(); }

 private:
  const int ordinal_;
};

}  // namespace

#ifndef ADAPS_WORKER_WITH_CUDA
absl::StatusOr<std::shared_ptr<Device>> OpenCudaDevice(int ordinal) {
  return absl::UnimplementedError(absl::StrCat(
      "tensor on CUDA device ", ordinal,
      ": this adaps worker library was built without CUDA (no toolkit found at build time, "
      "or -DADAPS_CUDA=OFF); rebuild with the CUDA toolkit, or give host memory"));
}
#endif

absl::StatusOr<std::shared_ptr<Device>> OpenDevice(int ordinal, bool emulated) {
  ADAPS_RET_CHECK(ordinal >= 0, absl::StatusCode::kInvalidArgument,
                  absl::StrCat("device ", ordinal, ": a device ordinal is >= 0"));
  if (emulated) return std::shared_ptr<Device>(new HostDevice(ordinal));
  return OpenCudaDevice(ordinal);
}

}  // namespace adaps
