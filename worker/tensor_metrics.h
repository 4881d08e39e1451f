// The Prometheus series of one tensor (worker/worker_metrics.h says what the worker exports):
// pushes, pulls, wire and dense bytes, the compression ratio and density of the last push.
// Each Tensor holds one, guarded by Tensor::mu like its TrafficCounters (worker/tensor.h).
#ifndef ADAPS_WORKER_TENSOR_METRICS_H_
#define ADAPS_WORKER_TENSOR_METRICS_H_

#include <cstdint>
#include <string>

#include "adaps/worker.h"
#include "common/metrics.h"

namespace adaps {

// What a monotonic count added since `before` (0 when it went back: a reset).
inline double CounterDelta(uint64_t now, uint64_t before) {
  return now >= before ? static_cast<double>(now - before) : 0.0;
}

// The series of one tensor. Default: no-op.
class TensorMetrics {
 public:
  TensorMetrics() = default;
  TensorMetrics(Metrics& metrics, const std::string& name, uint64_t length);

  // Adds to the counters what `now` counts beyond what the last call saw; after a push also
  // sets the compression ratio and the density (from the elements AddSent counted).
  void Sync(const TrafficCounters& now) {
    if (enabled_) SyncImpl(now);
  }
  // Elements one slice of the current push carries (SentElements of its update).
  void AddSent(uint64_t elements) {
    if (enabled_) sent_ += elements;
  }

 private:
  void SyncImpl(const TrafficCounters& now);

  bool enabled_ = false;
  uint64_t length_ = 0;
  Counter pushes_, pulls_, push_bytes_, pull_bytes_, push_dense_bytes_, pull_dense_bytes_;
  Gauge ratio_, density_;
  TrafficCounters seen_;
  uint64_t sent_ = 0;
};

}  // namespace adaps

#endif  // ADAPS_WORKER_TENSOR_METRICS_H_
