// The scheduler's rule for the servers' --optimizer (Register.optimizer): it goes into every
// cluster view, where workers read what a pull answers (a mean gradient, or parameters), so
// it must be a name the servers know, and one a job.
//
// Owned by the Scheduler and used only on its I/O thread (the Scheduler checks); it reads the
// roster's servers.
#ifndef ADAPS_SCHEDULER_SERVER_OPTIMIZER_H_
#define ADAPS_SCHEDULER_SERVER_OPTIMIZER_H_

#include <string>

#include "absl/status/status.h"
#include "common/messages.h"
#include "scheduler/roster.h"

namespace adaps {

class ServerOptimizerRule {
 public:
  // `roster` must outlive this object.
  explicit ServerOptimizerRule(const Roster& roster);

  // A server's --optimizer from its Register ("" for a worker's, or a server that did not
  // say).
  static std::string Of(const msg::Register& reg);
  // OK for "" or a name the servers know that no other server of the job contradicts (a
  // node with the same non-empty `identity`, restarting, is not compared with itself).
  // kInvalidArgument naming the optimizer (at most 64 characters of it) or both.
  absl::Status Check(const std::string& optimizer, const std::string& identity) const;

 private:
  const Roster& roster_;
};

}  // namespace adaps

#endif  // ADAPS_SCHEDULER_SERVER_OPTIMIZER_H_
