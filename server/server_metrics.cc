#include "server/server_metrics.h"

#include <utility>

namespace adaps {

namespace n = metric_names;
namespace l = metric_labels;

namespace {

const char* ReasonOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kDataLoss:
      return l::kReasonMalformed;
    case absl::StatusCode::kPermissionDenied:
      return l::kReasonForbidden;
    case absl::StatusCode::kFailedPrecondition:
      return l::kReasonFailedPrecondition;
    case absl::StatusCode::kResourceExhausted:
      return l::kReasonTooLarge;
    default:
      return l::kReasonInvalid;
  }
}

double Delta(uint64_t now, uint64_t before) {
  // The transport's counters only grow; a smaller value would be a new transport.
  return now >= before ? static_cast<double>(now - before) : 0.0;
}

}  // namespace

ServerMetrics::Work::Work(Work&& other) noexcept
    : slice_(std::exchange(other.slice_, nullptr)),
      op_(other.op_),
      shard_(other.shard_),
      version_(other.version_),
      start_(other.start_) {}

ServerMetrics::Work::~Work() {
  if (slice_ == nullptr) return;
  const absl::Duration took = absl::Now() - start_;
  op_->Observe(absl::ToDoubleSeconds(took));
  slice_->pending += took;
  const uint64_t version = shard_->version();
  if (version == version_) return;
  slice_->steps.Increment(static_cast<double>(version - version_));
  slice_->step_work.Observe(absl::ToDoubleSeconds(slice_->pending));
  slice_->pending = absl::ZeroDuration();
}

ServerMetrics::ServerMetrics(Metrics& metrics) : metrics_(metrics) {}

void ServerMetrics::OnView(int rank, size_t live_workers) {
  if (!enabled() || rank < 0) return;
  if (!bound()) {
    // A later view with another rank (a server without --identity re-registered) keeps the
    // first rank label: series cannot change their constant labels.
    metrics_.SetRank(rank).IgnoreError();
    push_work_ = metrics_.GetHistogram(n::kServerWorkSeconds, {{l::kOp, "push"}});
    pull_work_ = metrics_.GetHistogram(n::kServerWorkSeconds, {{l::kOp, "pull"}});
    live_workers_ = metrics_.GetGauge(n::kServerLiveWorkers);
    checkpoint_age_ = metrics_.GetGauge(n::kCheckpointAgeSeconds);
    checkpoints_ = metrics_.GetCounter(n::kCheckpointsTotal);
    // (Shard::Format order.)
    const char* formats[kFormats] = {"dense", "recompressed", "replica", "sparse", "forwarded"};
    for (int f = 0; f < kFormats; ++f) {
      answers_[f] = metrics_.GetCounter(n::kServerPullAnswersTotal, {{l::kFormat, formats[f]}});
      answer_bytes_[f] =
          metrics_.GetCounter(n::kServerPullAnswerBytesTotal, {{l::kFormat, formats[f]}});
    }
    messages_in_ = metrics_.GetCounter(n::kTransportMessagesTotal, {{l::kDirection, "in"}});
    messages_out_ = metrics_.GetCounter(n::kTransportMessagesTotal, {{l::kDirection, "out"}});
    bytes_in_ = metrics_.GetCounter(n::kTransportBytesTotal, {{l::kDirection, "in"}});
    bytes_out_ = metrics_.GetCounter(n::kTransportBytesTotal, {{l::kDirection, "out"}});
    {
      absl::MutexLock lock(&mu_);
      // Every reason exists from the start so that rate() sees the first one as an increase.
      for (const char* reason : {l::kReasonMalformed, l::kReasonInvalid, l::kReasonForbidden,
                                 l::kReasonFailedPrecondition, l::kReasonTooLarge}) {
        RejectedCounter(reason);
      }
    }
    bound_.store(true, std::memory_order_release);
  }
  live_workers_.Set(static_cast<double>(live_workers));
}

ServerMetrics::Slice* ServerMetrics::For(const Shard& shard) {
  absl::MutexLock lock(&mu_);
  auto it = slices_.find(shard.key());
  if (it != slices_.end()) return it->second.get();
  const MetricLabels tensor = {{l::kTensor, shard.name()}};
  auto s = std::make_unique<Slice>();
  s->pushes = metrics_.GetCounter(n::kServerPushesTotal, tensor);
  s->pulls = metrics_.GetCounter(n::kServerPullsTotal, tensor);
  s->push_bytes = metrics_.GetCounter(n::kServerPushBytesTotal, tensor);
  s->pull_bytes = metrics_.GetCounter(n::kServerPullBytesTotal, tensor);
  s->push_dense_bytes = metrics_.GetCounter(n::kServerPushDenseBytesTotal, tensor);
  s->pull_dense_bytes = metrics_.GetCounter(n::kServerPullDenseBytesTotal, tensor);
  s->steps = metrics_.GetCounter(n::kServerStepsTotal, tensor);
  s->step_work = metrics_.GetHistogram(n::kServerStepWorkSeconds, tensor);
  return slices_.emplace(shard.key(), std::move(s)).first->second.get();
}

ServerMetrics::Work ServerMetrics::Time(const Shard& shard, Op op) {
  Work w;
  if (!enabled() || !bound()) return w;
  w.slice_ = For(shard);
  w.op_ = op == Op::kPush ? &push_work_ : &pull_work_;
  w.shard_ = &shard;
  w.version_ = shard.version();
  w.start_ = absl::Now();
  return w;
}

void ServerMetrics::Pushed(const Shard& shard, size_t wire_bytes) {
  if (!enabled() || !bound()) return;
  Slice* s = For(shard);
  s->pushes.Increment();
  s->push_bytes.Increment(static_cast<double>(wire_bytes));
  s->push_dense_bytes.Increment(uint64_t{shard.length()} * sizeof(float));
}

void ServerMetrics::PullRequested(const Shard& shard, size_t wire_bytes) {
  if (!enabled() || !bound()) return;
  For(shard)->pull_bytes.Increment(static_cast<double>(wire_bytes));
}

void ServerMetrics::PullAnswered(const Shard& shard, Shard::Format format, size_t wire_bytes) {
  if (!enabled() || !bound()) return;
  const int f = static_cast<int>(format);
  answers_[f].Increment();
  answer_bytes_[f].Increment(static_cast<double>(wire_bytes));
  Slice* s = For(shard);
  s->pulls.Increment();
  s->pull_bytes.Increment(static_cast<double>(wire_bytes));
  s->pull_dense_bytes.Increment(uint64_t{shard.length()} * sizeof(float));
}

Counter& ServerMetrics::RejectedCounter(const char* reason) {
  auto it = rejected_.find(reason);
  if (it == rejected_.end()) {
    it =
        rejected_
            .emplace(reason, metrics_.GetCounter(n::kRejectedMessagesTotal, {{l::kReason, reason}}))
            .first;
  }
  return it->second;
}

void ServerMetrics::Rejected(const absl::Status& status) {
  if (!enabled() || !bound()) return;
  absl::MutexLock lock(&mu_);
  RejectedCounter(ReasonOf(status)).Increment();
}

void ServerMetrics::Checkpointed() {
  if (!enabled()) return;
  last_checkpoint_ns_.store(absl::ToUnixNanos(absl::Now()));
  checkpoints_.Increment();
}

void ServerMetrics::Tick(const TransportStats& now) {
  if (!enabled() || !bound()) return;
  const int64_t last = last_checkpoint_ns_.load();
  const absl::Time since = last == 0 ? started_ : absl::FromUnixNanos(last);
  checkpoint_age_.Set(absl::ToDoubleSeconds(absl::Now() - since));
  absl::MutexLock lock(&mu_);
  RejectedCounter(l::kReasonMalformed).Increment(Delta(now.dropped_invalid, last_.dropped_invalid));
  messages_in_.Increment(Delta(now.messages_in, last_.messages_in));
  messages_out_.Increment(Delta(now.messages_out, last_.messages_out));
  bytes_in_.Increment(Delta(now.bytes_in, last_.bytes_in));
  bytes_out_.Increment(Delta(now.bytes_out, last_.bytes_out));
  last_ = now;
}

}  // namespace adaps
