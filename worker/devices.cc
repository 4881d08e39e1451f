#include "worker/devices.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace adaps {

absl::StatusOr<std::shared_ptr<Device>> Devices::For(const TensorSpec& spec) {
  if (spec.device < 0) {
    ADAPS_RET_CHECK(spec.device == -1, absl::StatusCode::kInvalidArgument,
                    absl::StrCat("tensor '", spec.name, "': device ", spec.device,
                                 " (a device ordinal is >= 0, or -1 for host memory)"));
    return std::shared_ptr<Device>();
  }
  ADAPS_RET_CHECK(spec.compression == Compression::kAdaComp ||
                      spec.compression == Compression::kDense,
                  absl::StatusCode::kInvalidArgument,
                  absl::StrCat("tensor '", spec.name, "' on device ", spec.device,
                               ": a device compresses with AdaComp (or sends dense) only"));
  ADAPS_RET_CHECK(!spec.pull_in_place, absl::StatusCode::kInvalidArgument,
                  absl::StrCat("tensor '", spec.name, "' on device ", spec.device,
                               ": pull_in_place is for host memory"));
  absl::MutexLock lock(&mu_);
  auto it = open_.find(spec.device);
  if (it != open_.end()) return it->second;
  ADAPS_ASSIGN_OR_RETURN(std::shared_ptr<Device> device, OpenDevice(spec.device, emulate_));
  log_.get()->info("tensors on device {}: {}", spec.device, device->name());
  open_.emplace(spec.device, device);
  return device;
}

absl::Status Devices::Place(Tensor& t) {
  ADAPS_ASSIGN_OR_RETURN(t.device_codec, NewCodec(t, t.spec.bin_size));
  for (size_t i = 0; i < t.slices.size(); ++i) {
    SliceRt& rt = t.slices[i];
    const uint32_t n = t.meta[i].info.length;
    if (t.spec.compression != Compression::kDense) {
      ADAPS_ASSIGN_OR_RETURN(rt.device_residue, t.device->NewResidue(n));
    }
    if (t.spec.pull == PullFormat::kRecompressed) {
      ADAPS_ASSIGN_OR_RETURN(rt.device_replica, t.device->NewArray(n));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceCodec>> Devices::NewCodec(const Tensor& t,
                                                               uint32_t bin_size) {
  if (t.device == nullptr) return std::unique_ptr<DeviceCodec>();
  CompressorOptions copts;
  copts.kind = CompressorKind::kAdaComp;  // (a dense tensor's codec only adds pull answers)
  copts.bin_size = bin_size;
  return t.device->NewCodec(copts);
}

absl::Status Devices::CheckCall(const Tensor& t, absl::string_view name, bool on_device) {
  if (on_device && t.device == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' is in host memory (TensorSpec::device = -1): give it with "
        "PushPull, Push or Pull"));
  }
  if (!on_device && t.device != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' is on ", t.device->name(),
        ": give its gradient and parameters with PushPullOnDevice, PushOnDevice or "
        "PullOnDevice"));
  }
  return absl::OkStatus();
}

}  // namespace adaps
