// The server's live metrics (common/metrics.h): per slice it holds (label tensor: the
// slice's name; the server's rank label is the shard) pushes, pulls, wire and dense bytes,
// steps completed and the server time per step; per op the time of one request; the live
// workers of its last view, rejected messages by reason, checkpoint age and the transport's
// traffic.
//
// Server time per step (adaps_server_step_work_seconds): every Work scope of a slice adds
// its duration to that slice's pending time (decoding and adding the pushes, the optimizer,
// encoding and sending the answers); when a scope sees the slice's version advance, the
// pending time is observed once per step and reset.
//
// Owned by the Server. The series of the whole server are made by OnView once the rank is
// known (the rank is a constant label); until then every update is a no-op. Thread-safety:
// every method may be called from any thread (handles are atomic; the per-slice map is
// locked); a Work scope and the pending time of a slice belong to the thread that owns the
// shard. With a disabled Metrics every call returns after one branch and reads no clock.
#ifndef ADAPS_SERVER_SERVER_METRICS_H_
#define ADAPS_SERVER_SERVER_METRICS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/transport.h"
#include "server/shard.h"

namespace adaps {

class ServerMetrics {
 public:
  enum class Op { kPush, kPull };

  // The series of one slice.
  struct Slice {
    Counter pushes, pulls, push_bytes, pull_bytes, push_dense_bytes, pull_dense_bytes, steps;
    Histogram step_work;
    absl::Duration pending;  // owned by the shard's thread
  };

  // Times one request on a slice (see the top of the file); inert when metrics are off or
  // the rank is not known yet.
  class Work {
   public:
    Work() = default;
    Work(Work&& other) noexcept;
    Work& operator=(Work&&) = delete;
    ~Work();

   private:
    friend class ServerMetrics;
    Slice* slice_ = nullptr;
    Histogram* op_ = nullptr;
    const Shard* shard_ = nullptr;
    uint64_t version_ = 0;
    absl::Time start_;
  };

  // `metrics` must outlive this object.
  explicit ServerMetrics(Metrics& metrics);

  bool enabled() const { return metrics_.enabled(); }

  // On every view: the first one with a rank >= 0 sets the rank label and makes the series
  // of the whole server; every one sets the live workers.
  void OnView(int rank, size_t live_workers);

  Work Time(const Shard& shard, Op op);
  // A push to `shard` was accepted: `wire_bytes` of envelope and payload.
  void Pushed(const Shard& shard, size_t wire_bytes);
  // A pull request of `wire_bytes` arrived for `shard` / its answer of `wire_bytes` left.
  // The two together are what the worker counts as its pull traffic.
  void PullRequested(const Shard& shard, size_t wire_bytes);
  void PullAnswered(const Shard& shard, Shard::Format format, size_t wire_bytes);
  // A request refused with `status` (the reason follows from its code).
  void Rejected(const absl::Status& status);
  // A checkpoint reached the disk.
  void Checkpointed();
  // Periodic: the checkpoint age and what the transport counted since the last call.
  void Tick(const TransportStats& now);

 private:
  bool bound() const { return bound_.load(std::memory_order_acquire); }
  Slice* For(const Shard& shard);
  Counter& RejectedCounter(const char* reason);

  Metrics& metrics_;
  std::atomic<bool> bound_{false};
  const absl::Time started_ = absl::Now();
  std::atomic<int64_t> last_checkpoint_ns_{0};  // 0: none yet (the age counts from start)

  absl::Mutex mu_;
  std::map<uint64_t, std::unique_ptr<Slice>> slices_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Counter> rejected_ ABSL_GUARDED_BY(mu_);
  Histogram push_work_, pull_work_;
  Gauge live_workers_, checkpoint_age_;
  Counter checkpoints_;
  static constexpr int kFormats = 5;  // Shard::Format's values
  Counter answers_[kFormats], answer_bytes_[kFormats];  // by Shard::Format
  Counter messages_in_, messages_out_, bytes_in_, bytes_out_;
  TransportStats last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaps

#endif  // ADAPS_SERVER_SERVER_METRICS_H_
