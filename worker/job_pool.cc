#include "worker/job_pool.h"

#include <utility>

namespace adaps {

void JobPool::Start() {
  absl::MutexLock lock(&mu_);
  if (started_ || closed_) return;
  started_ = true;
  for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { Loop(); });
}

bool JobPool::Post(Job job) {
  absl::MutexLock lock(&mu_);
  if (closed_ || !started_) return false;
  queue_.push_back(Entry{std::move(job), nullptr, 0});
  return true;
}

bool JobPool::PostOrdered(OrderedJob job) {
  absl::MutexLock lock(&mu_);
  if (closed_ || !started_) return false;
  queue_.push_back(Entry{nullptr, std::move(job), next_ticket_++});
  return true;
}

void JobPool::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

void JobPool::Stop() {
  Close();
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
}

void JobPool::Loop() {
  while (true) {
    Entry entry;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closed_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // closed and drained
      entry = std::move(queue_.front());
      queue_.pop_front();
    }
    if (entry.ordered) {
      InOrder(entry.ticket, entry.ordered());
    } else if (entry.job) {
      entry.job();
    }
  }
}

void JobPool::InOrder(uint64_t ticket, Job stage) {
  absl::MutexLock lock(&order_mu_);
  early_.emplace(ticket, std::move(stage));
  if (staging_) return;  // the thread running stages takes this one when its turn comes
  staging_ = true;
  while (!early_.empty() && early_.begin()->first == next_stage_) {
    Job next = std::move(early_.begin()->second);
    early_.erase(early_.begin());
    ++next_stage_;
    order_mu_.Unlock();
    if (next) next();
    order_mu_.Lock();
  }
  staging_ = false;
}

}  // namespace adaps
