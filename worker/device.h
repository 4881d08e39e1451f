// Internal to the worker library: a device that tensors live on (TensorSpec::device), as the
// tensor code sees it. No CUDA header: device memory and streams are plain pointers.
//
// Two implementations: CUDA (worker/device_cuda.cc, built when the toolkit is; the AdaComp
// kernels of common/cuda/ compress on the device and only the encoded update crosses to the
// host) and host emulation (worker/device_host.cc: "device" memory is host memory and the CPU
// codec does the work; WorkerOptions::emulate_devices), which runs the whole device path of
// the worker library on machines without a GPU, so that its logic is tested everywhere.
//
// The library's work on a device goes to a stream of its own, created per Worker and device;
// an operation given on the trainer's stream first makes that stream wait for what the
// trainer had given to its stream (Mark, WaitFor: an event, as NCCL and Horovod order their
// work after the framework's). Every call below that moves data returns once it is done, so
// a ready future means the device memory it wrote is written.
//
// Thread-safety: a Device is shared by the tensors declared on it and thread-safe; a
// DeviceCodec and a DeviceResidue are used under their tensor's lock (Tensor::mu).
#ifndef ADAPS_WORKER_DEVICE_H_
#define ADAPS_WORKER_DEVICE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/compressor.h"

namespace adaps {

// One slice's error-feedback residue in device memory, two-phase as SliceState: a compress
// stages the new residue, Commit makes it the residue, Discard drops it. Starts at zero.
class DeviceResidue {
 public:
  virtual ~DeviceResidue() = default;
  virtual absl::Status Commit() = 0;
  virtual absl::Status Discard() = 0;
  // The residue becomes zero; anything staged is dropped.
  virtual absl::Status Zero() = 0;
  // The residue (size() floats) to and from host memory; Upload drops anything staged.
  virtual absl::Status Download(absl::Span<float> host) = 0;
  virtual absl::Status Upload(absl::Span<const float> host) = 0;
  virtual size_t size() const = 0;
};

// A tensor's codec on its device (its scratch space).
class DeviceCodec {
 public:
  virtual ~DeviceCodec() = default;
  // Phase one of a push (Compressor::CompressPending): compresses the `n` floats at `grad`
  // (device memory) with `residue`, whose new value is staged; the update comes back in host
  // memory in `out`. Same errors as the CPU (kInvalidArgument for NaN/Inf, kOutOfRange for an
  // overflow: nothing staged then).
  virtual absl::Status CompressPending(const float* grad, size_t n, DeviceResidue& residue,
                                       CompressedUpdate& out) = 0;
  // dst[0..n) += decompress(update), `dst` in device memory; kInvalidArgument (dst unchanged)
  // for an update that does not fit.
  virtual absl::Status AddUpdate(const CompressedUpdate& update, float* dst, size_t n) = 0;
};

// `n` floats of device memory, zeros at first.
class DeviceArray {
 public:
  virtual ~DeviceArray() = default;
  virtual float* data() = 0;
};

// What a trainer had given to its stream when it gave an operation (an event).
class DeviceMark {
 public:
  virtual ~DeviceMark() = default;
};

class Device {
 public:
  virtual ~Device() = default;
  // "cuda:0", or "cuda:0 (emulated in host memory)".
  virtual std::string name() const = 0;
  // The compressor kinds the device compresses (AdaComp); the others are refused at Declare.
  virtual absl::StatusOr<std::unique_ptr<DeviceCodec>> NewCodec(
      const CompressorOptions& options) = 0;
  virtual absl::StatusOr<std::unique_ptr<DeviceResidue>> NewResidue(size_t n) = 0;
  virtual absl::StatusOr<std::unique_ptr<DeviceArray>> NewArray(size_t n) = 0;
  // Copies of `bytes` bytes (pinned staging is the caller's affair: these take any host memory).
  virtual absl::Status ToHost(void* host, const void* device, size_t bytes) = 0;
  virtual absl::Status ToDevice(void* device, const void* host, size_t bytes) = 0;
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes) = 0;
  // The work given to `stream` (the trainer's; null: the default stream) so far.
  virtual absl::StatusOr<std::shared_ptr<DeviceMark>> Mark(void* stream) = 0;
  // The library's work from now on waits for `mark`.
  virtual absl::Status WaitFor(const DeviceMark& mark) = 0;
};

// The device `ordinal`: CUDA's (kUnimplemented when this library was built without CUDA,
// kUnavailable without a usable GPU, kInvalidArgument for a device that does not exist), or
// with `emulated` one in host memory (any ordinal >= 0).
absl::StatusOr<std::shared_ptr<Device>> OpenDevice(int ordinal, bool emulated);

// The CUDA device, or kUnimplemented without CUDA (worker/device_cuda.cc, or the stub in
// worker/device_host.cc when the library is built without it).
absl::StatusOr<std::shared_ptr<Device>> OpenCudaDevice(int ordinal);

}  // namespace adaps

#endif  // ADAPS_WORKER_DEVICE_H_
