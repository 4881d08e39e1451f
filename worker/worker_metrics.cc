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

}  // namespace

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
  malformed_.Increment(CounterDelta(now.dropped_invalid, last_.dropped_invalid));
  messages_in_.Increment(CounterDelta(now.messages_in, last_.messages_in));
  messages_out_.Increment(CounterDelta(now.messages_out, last_.messages_out));
  bytes_in_.Increment(CounterDelta(now.bytes_in, last_.bytes_in));
  bytes_out_.Increment(CounterDelta(now.bytes_out, last_.bytes_out));
  last_ = now;
}

}  // namespace adaps
