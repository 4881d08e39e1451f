// The scheduler's check of the servers' --optimizer (Register.optimizer): it goes into every
// cluster view, where workers read what a pull answers (a mean gradient, or parameters).
#include <string>

#include "absl/strings/str_cat.h"
#include "common/optimizer.h"
#include "scheduler/scheduler.h"

namespace adaps {

std::string Scheduler::ServerOptimizerOf(const msg::Register& reg) {
  return reg.role() == msg::Role::Server && reg.optimizer() ? reg.optimizer()->str() : "";
}

absl::Status Scheduler::CheckServerOptimizer(const std::string& optimizer,
                                             const std::string& identity) const {
  if (optimizer.empty()) return absl::OkStatus();
  // A name the servers know, or nothing: it goes into every view.
  if (!ParseOptimizerKind(optimizer).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a server registered with optimizer '", optimizer.substr(0, 64),
        optimizer.size() > 64 ? "...'" : "'",
        ": expected sum, mean, sgd, momentum, nesterov or adam"));
  }
  // One job, one optimizer. (A restarted server is compared with the others.)
  for (const auto& n : nodes_) {
    if (n.role != msg::Role::Server || n.optimizer.empty() || n.optimizer == optimizer ||
        (!identity.empty() && n.identity == identity)) {
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "this server runs --optimizer=", optimizer, " but server ", n.rank,
        " of the job runs --optimizer=", n.optimizer,
        ": every server of a job must run the same optimizer"));
  }
  return absl::OkStatus();
}

}  // namespace adaps
