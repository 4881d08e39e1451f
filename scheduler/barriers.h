// The scheduler's barriers: positions in the job, numbered by the workers' calls (Barrier.seq),
// each released when every live worker that takes part in it has arrived. A worker that
// joined a running job takes part from the barrier after those the others wait at, and only
// once it called one (Roster::Node::first_barrier, barrier_seen).
//
// Owned by the Scheduler and used only on its I/O thread (the Scheduler checks), so it has
// no lock; it sends nothing: the Scheduler answers the waiters Release returns.
#ifndef ADAPS_SCHEDULER_BARRIERS_H_
#define ADAPS_SCHEDULER_BARRIERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "scheduler/roster.h"

namespace adaps {

class Barriers {
 public:
  struct Waiter {
    std::string route;
    uint64_t request_id = 0;
    int rank = -1;
  };

  // Worker `waiter.rank` arrived at barrier `seq`.
  void Arrive(uint64_t seq, Waiter waiter);
  // Removes every barrier that each live worker of `nodes` taking part in it has reached,
  // and returns their waiters (to answer), in barrier order.
  std::vector<Waiter> Release(const std::vector<Roster::Node>& nodes);
  // One past the highest barrier released.
  uint64_t next() const { return next_; }
  // The first barrier a worker joining now takes part in: after those the others wait at.
  uint64_t FirstForJoiner() const;

 private:
  std::map<uint64_t, std::vector<Waiter>> waiting_;
  uint64_t next_ = 0;
};

}  // namespace adaps

#endif  // ADAPS_SCHEDULER_BARRIERS_H_
