#include "worker/worker_metrics.h"

#include <algorithm>

#include "worker/tensor.h"

namespace adaps {

namespace n = metric_names;
namespace l = metric_labels;

namespace {

// Steps whose pulls never all arrive (a tensor that is declared but not pulled) are
// forgotten past this many.
constexpr size_t kMaxOpenSteps = 64;

double Delta(uint64_t now, uint64_t before) {
  return now >= before ? static_cast<double>(now - before) : 0.0;
}

}  // namespace

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
  pushes_.Increment(Delta(now.pushes, seen_.pushes));
  pulls_.Increment(Delta(now.pulls, seen_.pulls));
  const double push_wire = Delta(now.push_wire_bytes, seen_.push_wire_bytes);
  const double push_dense = Delta(now.push_dense_bytes, seen_.push_dense_bytes);
  push_bytes_.Increment(push_wire);
  push_dense_bytes_.Increment(push_dense);
  pull_bytes_.Increment(Delta(now.pull_wire_bytes, seen_.pull_wire_bytes));
  pull_dense_bytes_.Increment(Delta(now.pull_dense_bytes, seen_.pull_dense_bytes));
  if (now.pushes != seen_.pushes) {
    if (push_wire > 0) ratio_.Set(push_dense / push_wire);
    if (length_ > 0) density_.Set(static_cast<double>(sent_) / static_cast<double>(length_));
    sent_ = 0;
  }
  seen_ = now;
}

void WorkerMetrics::Bind(int rank) {
  if (!enabled()) return;
  metrics_.SetRank(rank).IgnoreError();  // Bind runs once, before any series exists
  steps_total_ = metrics_.GetCounter(n::kStepsTotal);
  step_seconds_ = metrics_.GetHistogram(n::kStepSeconds);
  compress_ = metrics_.GetHistogram(n::kStepPhaseSeconds, {{l::kPhase, l::kPhaseCompress}});
  wait_ = metrics_.GetHistogram(n::kStepPhaseSeconds, {{l::kPhase, l::kPhaseWait}});
  decode_ = metrics_.GetHistogram(n::kStepPhaseSeconds, {{l::kPhase, l::kPhaseDecode}});
  malformed_ = metrics_.GetCounter(n::kRejectedMessagesTotal, {{l::kReason, l::kReasonMalformed}});
  messages_in_ = metrics_.GetCounter(n::kTransportMessagesTotal, {{l::kDirection, "in"}});
  messages_out_ = metrics_.GetCounter(n::kTransportMessagesTotal, {{l::kDirection, "out"}});
  bytes_in_ = metrics_.GetCounter(n::kTransportBytesTotal, {{l::kDirection, "in"}});
  bytes_out_ = metrics_.GetCounter(n::kTransportBytesTotal, {{l::kDirection, "out"}});
  absl::MutexLock lock(&mu_);
  bound_ = true;
}

void WorkerMetrics::Attach(Tensor& t) {
  if (!enabled()) return;
  {
    absl::MutexLock lock(&mu_);
    if (!bound_) return;
    pulls_per_step_ += t.meta.size();
  }
  absl::MutexLock lock(&t.mu);
  t.metrics = TensorMetrics(metrics_, t.spec.name, t.length);
}

void WorkerMetrics::Pushed(Tensor& t, absl::Time started) {
  if (!enabled()) return;
  t.metrics.Sync(t.traffic);
  if (!t.slices.empty() && t.slices[0].step > 0) Compressed(t.slices[0].step - 1, started);
}

WorkerMetrics::StepTimes& WorkerMetrics::StepLocked(uint64_t step, absl::Time started) {
  auto it = steps_.find(step);
  if (it != steps_.end()) return it->second;
  if (steps_.size() >= kMaxOpenSteps) steps_.erase(steps_.begin());
  StepTimes& s = steps_[step];
  s.start = started;
  return s;
}

void WorkerMetrics::Compressed(uint64_t step, absl::Time started) {
  if (!enabled()) return;
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (!bound_) return;
  StepLocked(step, started).compress += now - started;
}

void WorkerMetrics::Decoded(uint64_t step, absl::Time started) {
  if (!enabled()) return;
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (!bound_) return;
  StepTimes& s = StepLocked(step, started);
  s.decode += now - started;
  if (++s.pulls < pulls_per_step_) return;
  const absl::Duration wall = now - s.start;
  steps_total_.Increment();
  step_seconds_.Observe(absl::ToDoubleSeconds(wall));
  compress_.Observe(absl::ToDoubleSeconds(s.compress));
  decode_.Observe(absl::ToDoubleSeconds(s.decode));
  wait_.Observe(
      absl::ToDoubleSeconds(std::max(absl::ZeroDuration(), wall - s.compress - s.decode)));
  steps_.erase(step);
}

void WorkerMetrics::Tick(const TransportStats& now) {
  if (!enabled()) return;
  absl::MutexLock lock(&mu_);
  if (!bound_) return;
  malformed_.Increment(Delta(now.dropped_invalid, last_.dropped_invalid));
  messages_in_.Increment(Delta(now.messages_in, last_.messages_in));
  messages_out_.Increment(Delta(now.messages_out, last_.messages_out));
  bytes_in_.Increment(Delta(now.bytes_in, last_.bytes_in));
  bytes_out_.Increment(Delta(now.bytes_out, last_.bytes_out));
  last_ = now;
}

}  // namespace adaps
