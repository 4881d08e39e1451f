// A closable multi-producer queue that one consumer drains in batches (the engine threads'
// and the checkpoint writer's inboxes, server/engine.h).
//
// Push after Close is refused (false). PopAll blocks until something is queued or the queue
// is closed, then takes everything queued at once (one lock per batch, not per item); it
// returns false only when the queue is closed and empty, so a consumer that loops on it
// finishes what was queued before Close. Thread-safety: all methods are thread-safe.
// std::mutex, not absl::Mutex: Debian's abseil is not built for ThreadSanitizer, which then
// cannot see absl::Mutex synchronise (tests/tsan.supp); with the pthread-based std::mutex
// the engine's hand-overs stay checkable under TSan.
#ifndef ADAPS_SERVER_ENGINE_QUEUE_H_
#define ADAPS_SERVER_ENGINE_QUEUE_H_

#include <condition_variable>
#include <deque>
#include <mutex>
#include <utility>

namespace adaps {

template <typename T>
class ClosableQueue {
 public:
  bool Push(T item) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
      items_.push_back(std::move(item));
    }
    cv_.notify_one();
    return true;
  }

  // Replaces `batch` with everything queued; false when closed and nothing is left.
  bool PopAll(std::deque<T>& batch) {
    batch.clear();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return closed_ || !items_.empty(); });
    if (items_.empty()) return false;
    batch.swap(items_);
    return true;
  }

  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> items_;  // guarded by mu_
  bool closed_ = false;  // guarded by mu_
};

}  // namespace adaps

#endif  // ADAPS_SERVER_ENGINE_QUEUE_H_
