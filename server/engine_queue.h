// A closable multi-producer queue that one consumer drains in batches (the engine threads'
// and the checkpoint writer's inboxes, server/engine.h).
//
// Push after Close is refused (false). PopAll blocks until something is queued or the queue
// is closed, then takes everything queued at once (one lock per batch, not per item); it
// returns false only when the queue is closed and empty, so a consumer that loops on it
// finishes what was queued before Close. Thread-safety: all methods are thread-safe.
#ifndef ADAPS_SERVER_ENGINE_QUEUE_H_
#define ADAPS_SERVER_ENGINE_QUEUE_H_

#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace adaps {

template <typename T>
class ClosableQueue {
 public:
  bool Push(T item) {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    items_.push_back(std::move(item));
    return true;
  }

  // Replaces `batch` with everything queued; false when closed and nothing is left.
  bool PopAll(std::deque<T>& batch) {
    batch.clear();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &ClosableQueue::ReadyLocked));
    if (items_.empty()) return false;
    batch.swap(items_);
    return true;
  }

  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

  void Reopen() {
    absl::MutexLock lock(&mu_);
    closed_ = false;
  }

 private:
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !items_.empty();
  }

  absl::Mutex mu_;
  std::deque<T> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace adaps

#endif  // ADAPS_SERVER_ENGINE_QUEUE_H_
