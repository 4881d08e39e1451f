#include "worker/tensor_metrics.h"

namespace adaps {

namespace n = metric_names;
namespace l = metric_labels;

TensorMetrics::TensorMetrics(Metrics& metrics, const std::string& name, uint64_t length)
    : enabled_(metrics.enabled()), length_(length) {
  const MetricLabels tensor = {{l::kTensor, name}};
  pushes_ = metrics.GetCounter(n::kPushesTotal, tensor);
  pulls_ = metrics.GetCounter(n::kPullsTotal, tensor);
  push_bytes_ = metrics.GetCounter(n::kPushBytesTotal, tensor);
  pull_bytes_ = metrics.GetCounter(n::kPullBytesTotal, tensor);
  push_dense_bytes_ = metrics.GetCounter(n::kPushDenseBytesTotal, tensor);
  pull_dense_bytes_ = metrics.GetCounter(n::kPullDenseBytesTotal, tensor);
  ratio_ = metrics.GetGauge(n::kCompressionRatio, tensor);
  density_ = metrics.GetGauge(n::kDensity, tensor);
}

void TensorMetrics::SyncImpl(const TrafficCounters& now) {
  pushes_.Increment(CounterDelta(now.pushes, seen_.pushes));
  pulls_.Increment(CounterDelta(now.pulls, seen_.pulls));
  const double push_wire = CounterDelta(now.push_wire_bytes, seen_.push_wire_bytes);
  const double push_dense = CounterDelta(now.push_dense_bytes, seen_.push_dense_bytes);
  push_bytes_.Increment(push_wire);
  push_dense_bytes_.Increment(push_dense);
  pull_bytes_.Increment(CounterDelta(now.pull_wire_bytes, seen_.pull_wire_bytes));
  pull_dense_bytes_.Increment(CounterDelta(now.pull_dense_bytes, seen_.pull_dense_bytes));
  if (now.pushes != seen_.pushes) {
    if (push_wire > 0) ratio_.Set(push_dense / push_wire);
    if (length_ > 0) density_.Set(static_cast<double>(sent_) / static_cast<double>(length_));
    sent_ = 0;
  }
  seen_ = now;
}

}  // namespace adaps
