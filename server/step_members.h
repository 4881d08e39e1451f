// Which workers a sync step of this server waits for (docs/reliability.md "Workers that
// join"): the workers that are live in the latest cluster view and counted here. Counted are
// the workers of this server's first view that take part in the steps (the job forming, or
// the running job a restarted server comes back to; not a joiner still starting up,
// NodeInfo.stepping), and any other worker from its first declaration or push to this server
// on (until then it has nothing to push to this server's slices).
//
// Pure: no sockets, no clock. Owned by the Server, used on its I/O thread only.
#ifndef ADAPS_SERVER_STEP_MEMBERS_H_
#define ADAPS_SERVER_STEP_MEMBERS_H_

#include <cstddef>
#include <set>
#include <vector>

namespace adaps {

class StepMembers {
 public:
  // A worker as a cluster view shows it.
  struct ViewWorker {
    int rank = -1;
    bool alive = true;
    bool stepping = true;  // NodeInfo.stepping
  };

  // A new cluster view: its workers and `num_workers` (one past the highest rank). True when
  // a worker the steps waited for is no longer live (steps held up by it can complete).
  bool OnView(int num_workers, const std::vector<ViewWorker>& workers);
  // Counts worker `rank` from now on (its declaration or push reached this server). True when
  // it was not counted before.
  bool Count(int rank);

  // Live and counted: what a sync step completes against.
  const std::set<int>& live() const { return live_; }
  // Live in the latest view, counted or not.
  size_t view_live() const { return view_live_.size(); }
  // One past the highest worker rank of the latest view (joined workers included).
  int num_workers() const { return num_workers_; }

 private:
  // live_ from view_live_ and counted_; true when a worker was dropped.
  bool Update();

  std::set<int> live_;
  std::set<int> view_live_;
  std::set<int> seen_;  // every worker rank a view has shown
  std::set<int> counted_;
  bool first_view_ = true;
  int num_workers_ = 0;
};

}  // namespace adaps

#endif  // ADAPS_SERVER_STEP_MEMBERS_H_
