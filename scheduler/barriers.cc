#include "scheduler/barriers.h"

#include <algorithm>
#include <utility>

namespace adaps {

void Barriers::Arrive(uint64_t seq, Waiter waiter) {
  waiting_[seq].push_back(std::move(waiter));
}

std::vector<Barriers::Waiter> Barriers::Release(const std::vector<Roster::Node>& nodes) {
  std::vector<Waiter> released;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    int arrived = 0, expected = 0;
    for (const auto& n : nodes) {
      if (n.role != msg::Role::Worker || !n.alive || n.left) continue;
      if (n.first_barrier > it->first) continue;  // joined while the others waited here
      if (!n.barrier_seen) continue;  // joined, and has not called a barrier yet
      ++expected;
      for (const auto& w : it->second) {
        if (w.rank == n.rank) {
          ++arrived;
          break;
        }
      }
    }
    if (arrived >= expected) {
      for (auto& w : it->second) released.push_back(std::move(w));
      next_ = std::max(next_, it->first + 1);
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  return released;
}

uint64_t Barriers::FirstForJoiner() const {
  // The barriers the others wait at now complete without it; it meets them at the next.
  return waiting_.empty() ? next_ : std::max(next_, waiting_.rbegin()->first + 1);
}

}  // namespace adaps
