#include "server/step_members.h"

#include <utility>

namespace adaps {

bool StepMembers::OnView(int num_workers, const std::vector<ViewWorker>& workers) {
  num_workers_ = num_workers;
  std::set<int> live;
  for (const ViewWorker& w : workers) {
    if (w.rank < 0) continue;
    if (w.alive) live.insert(w.rank);
    // A worker first shown by a later view, or not stepping yet, is counted by Count.
    if (seen_.insert(w.rank).second && first_view_ && w.stepping) counted_.insert(w.rank);
  }
  first_view_ = false;
  view_live_ = std::move(live);
  return Update();
}

bool StepMembers::Count(int rank) {
  if (!counted_.insert(rank).second) return false;
  Update();
  return true;
}

bool StepMembers::Update() {
  std::set<int> counted;
  for (int w : view_live_) {
    if (counted_.count(w)) counted.insert(w);
  }
  bool lost = false;
  for (int w : live_) lost |= counted.count(w) == 0;
  live_ = std::move(counted);
  return lost;
}

}  // namespace adaps
