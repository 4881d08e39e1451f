// The worker's live metrics (common/metrics.h): per tensor pushes, pulls, push and pull wire
// and dense bytes (the same numbers as Worker::Traffic), the compression ratio and density
// of the last push; per step the step time and its phases (compress, wait, decode) as
// histograms in seconds; the transport's traffic and its malformed drops.
//
// A step: step s of the worker begins with the first push of step s (any tensor) and ends
// when the pull of step s of every slice of every declared tensor has been applied. Its
// phases: compress (encoding every push of the step), decode (applying every pull answer)
// and wait, the rest of the step's wall time (the servers, the network, and the trainer's
// own compute between the pushes of one step when it pushes layer by layer).
//
// Ownership: Worker::Impl owns the Metrics and the WorkerMetrics; each Tensor holds its
// TensorMetrics (worker/tensor_metrics.h), guarded by Tensor::mu like its TrafficCounters.
// Thread-safety: WorkerMetrics is thread-safe (its step table is locked). With a
// disabled Metrics every call returns after one branch and reads no clock.
#ifndef ADAPS_WORKER_WORKER_METRICS_H_
#define ADAPS_WORKER_WORKER_METRICS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adaps/worker.h"
#include "common/metrics.h"
#include "common/transport.h"
#include "worker/tensor_metrics.h"

namespace adaps {

struct Tensor;  // worker/tensor.h

class WorkerMetrics {
 public:
  // `metrics` must outlive this object.
  explicit WorkerMetrics(Metrics& metrics) : metrics_(metrics) {}

  bool enabled() const { return metrics_.enabled(); }
  // Once registered: sets the rank label and makes the worker's series. Before it every
  // tensor's metrics are no-ops (tensors are declared after registration).
  void Bind(int rank);
  // Gives a tensor about to be published its series (takes t.mu); its slices' pulls
  // become part of every step.
  void Attach(Tensor& t);

  // The clock when enabled; InfinitePast (no clock read) when not.
  absl::Time Now() const { return enabled() ? absl::Now() : absl::InfinitePast(); }
  // At the end of a push (t.mu held): syncs the tensor's series with its traffic and adds
  // the time since `started` (before encoding) to the compress phase of the push's step.
  void Pushed(Tensor& t, absl::Time started);
  // Runs `apply` (a slice's pull answer being applied) and times it as the decode phase of
  // the step before `pull_step` (the slice's step when the pull was sent; 0: no step yet).
  template <typename F>
  absl::Status Decode(uint64_t pull_step, F&& apply) {
    if (!enabled()) return apply();
    const absl::Time started = absl::Now();
    absl::Status status = apply();
    if (status.ok() && pull_step > 0) Decoded(pull_step - 1, started);
    return status;
  }
  // Periodic: what the transport counted since the last call.
  void Tick(const TransportStats& now);

 private:
  struct StepTimes {
    absl::Time start;
    absl::Duration compress, decode;
    size_t pulls = 0;
  };
  StepTimes& StepLocked(uint64_t step, absl::Time started) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Decoded(uint64_t step, absl::Time started);
  void Compressed(uint64_t step, absl::Time started);

  Metrics& metrics_;
  absl::Mutex mu_;
  bool bound_ ABSL_GUARDED_BY(mu_) = false;
  size_t pulls_per_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, StepTimes> steps_ ABSL_GUARDED_BY(mu_);
  Counter steps_total_;
  Histogram step_seconds_, compress_, wait_, decode_;
  Counter malformed_, messages_in_, messages_out_, bytes_in_, bytes_out_;
  TransportStats last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaps

#endif  // ADAPS_WORKER_WORKER_METRICS_H_
