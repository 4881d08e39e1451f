#include "scheduler/job_end.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace adaps {

JobEnd::JobEnd(std::string admin_token) : admin_token_(std::move(admin_token)) {}

absl::Status JobEnd::CheckOperator(const std::string& token) const {
  if (admin_token_.empty()) {
    return absl::PermissionDeniedError(
        "this scheduler accepts no Shutdown requests (start it with --admin_token)");
  }
  if (token != admin_token_) {
    return absl::PermissionDeniedError("Shutdown refused: wrong or missing token");
  }
  return absl::OkStatus();
}

JobEnd::Reason JobEnd::OperatorRequested(const std::string& reason, int code) {
  return {absl::StrCat("an operator requested shutdown", reason.empty() ? "" : ": ", reason),
          code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
              ? static_cast<absl::StatusCode>(code)
              : absl::StatusCode::kOk};
}

std::optional<JobEnd::Reason> JobEnd::WhenNoWorkerIsLive(const Roster& roster) {
  if (!roster.formed() || roster.AliveWorkers() > 0) return std::nullopt;
  // Completed only if no node is still dead (one that came back with its identity is not).
  const std::string dead = roster.DeadNodes();
  if (!dead.empty()) {
    return Reason{absl::StrCat("every worker has left, but the job did not complete: ", dead,
                               " declared dead"),
                  absl::StatusCode::kAborted};
  }
  return Reason{"every worker has left"};
}

bool JobEnd::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

void JobEnd::End(const Reason& reason) {
  absl::MutexLock lock(&mu_);
  if (ended_) return;
  ended_ = true;
  if (reason.code != absl::StatusCode::kOk) exit_status_ = absl::Status(reason.code, reason.text);
}

bool JobEnd::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_; };
  return mu_.AwaitWithTimeout(absl::Condition(&ended), timeout);
}

absl::Status JobEnd::exit_status() const {
  absl::MutexLock lock(&mu_);
  return exit_status_;
}

}  // namespace adaps
