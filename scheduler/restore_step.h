// The scheduler's part of step checkpoints (common/step_checkpoint.h): which step a
// (re)starting server restores, from the step files every server reported (Register and
// Heartbeat carry them; Roster::Node::checkpoint_steps).
//
// Owned by the Scheduler and used only on its I/O thread (the Scheduler checks); it reads
// and trims the roster's servers' lists, and sends nothing.
#ifndef ADAPS_SCHEDULER_RESTORE_STEP_H_
#define ADAPS_SCHEDULER_RESTORE_STEP_H_

#include <cstdint>
#include <vector>

#include "common/logging.h"
#include "scheduler/roster.h"

namespace adaps {

class RestoreStep {
 public:
  // `roster` and `log` must outlive this object.
  RestoreStep(int num_servers, Roster& roster, const RoleLog& log);

  // A message's list of steps (null: none) as a vector.
  static std::vector<uint64_t> StepList(const flatbuffers::Vector<uint64_t>* steps);
  // The latest step every server reported (server/checkpoint.h); 0: none, or not every
  // server registered yet.
  uint64_t Common() const;
  // The step `server` (a node of the roster) restores: Common(). When `answering` its
  // registration, it also drops the server's reported steps after that one (the server
  // removes those files), so the next restarting server meets the list as it will be.
  uint64_t For(Roster::Node& server, bool answering);

 private:
  const int num_servers_;
  Roster& roster_;
  const RoleLog& log_;
};

}  // namespace adaps

#endif  // ADAPS_SCHEDULER_RESTORE_STEP_H_
