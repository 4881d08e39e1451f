// Internal to the worker library: the devices a worker's tensors live on
// (TensorSpec::device; docs/gpu.md "The worker library's device path").
//
// A device is opened at the first tensor declared on it and shared by the rest; a tensor on a
// device gets its codec, its slices' residues and (recompressed pulls) its replica copies
// there. A device tensor takes AdaComp or dense only, and never pulls in place.
//
// Ownership: Worker::Impl owns the Devices; a Tensor holds a shared_ptr to its Device.
// Thread-safety: `mu_` guards the open devices and is taken alone.
#ifndef ADAPS_WORKER_DEVICES_H_
#define ADAPS_WORKER_DEVICES_H_

#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "adaps/worker.h"
#include "common/logging.h"
#include "worker/device.h"
#include "worker/tensor.h"

namespace adaps {

class Devices {
 public:
  // `emulate`: WorkerOptions::emulate_devices.
  Devices(bool emulate, const RoleLog& log) : emulate_(emulate), log_(log) {}
  Devices(const Devices&) = delete;
  Devices& operator=(const Devices&) = delete;

  // The device of `spec` (opened at its first tensor), or null for host memory (device = -1);
  // kInvalidArgument for a spec a device cannot take.
  absl::StatusOr<std::shared_ptr<Device>> For(const TensorSpec& spec);
  // t's codec, residues and replica copies on t.device (not null).
  static absl::Status Place(Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  // A codec on t's device at `bin_size`; null for a tensor in host memory.
  static absl::StatusOr<std::unique_ptr<DeviceCodec>> NewCodec(const Tensor& t,
                                                               uint32_t bin_size);
  // Whether a call that gives host buffers (`on_device` false: PushPull, Push, Pull) or device
  // pointers (`on_device`: PushPullOnDevice, ...) fits where t lives.
  static absl::Status CheckCall(const Tensor& t, absl::string_view name, bool on_device);

 private:
  const bool emulate_;
  const RoleLog& log_;
  absl::Mutex mu_;
  std::map<int, std::shared_ptr<Device>> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaps

#endif  // ADAPS_WORKER_DEVICES_H_
