#include "scheduler/server_optimizer.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/optimizer.h"

namespace adaps {

ServerOptimizerRule::ServerOptimizerRule(const Roster& roster) : roster_(roster) {}

std::string ServerOptimizerRule::Of(const msg::Register& reg) {
  return reg.role() == msg::Role::Server && reg.optimizer() ? reg.optimizer()->str() : "";
}

absl::Status ServerOptimizerRule::Check(const std::string& optimizer,
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
  for (const auto& n : roster_.nodes()) {
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
