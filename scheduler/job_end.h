// The end of the job: when it ends and why (every worker left or died, an operator's
// Shutdown, the fail policy), and the exit status the scheduler reports afterwards.
//
// Owned by the Scheduler. Thread-safe: its I/O thread ends the job, any thread waits for the
// end or reads the exit status. It sends nothing: the Scheduler tells the nodes.
#ifndef ADAPS_SCHEDULER_JOB_END_H_
#define ADAPS_SCHEDULER_JOB_END_H_

#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/roster.h"

namespace adaps {

class JobEnd {
 public:
  struct Reason {
    std::string text;
    absl::StatusCode code = absl::StatusCode::kOk;  // kOk: the job completed
  };

  // An operator's Shutdown must carry `admin_token`; empty: no Shutdown request is accepted.
  explicit JobEnd(std::string admin_token);

  // OK when an operator's Shutdown carrying `token` may end the job; kPermissionDenied
  // otherwise (never quoting the token).
  absl::Status CheckOperator(const std::string& token) const;
  // The end an operator's Shutdown asks for: its reason, and its code when it is one of
  // absl's (else kOk).
  static Reason OperatorRequested(const std::string& reason, int code);
  // Once the job formed and no worker is live: completed when every worker left, kAborted
  // naming the nodes still dead otherwise. nullopt before.
  static std::optional<Reason> WhenNoWorkerIsLive(const Roster& roster);

  bool ended() const;
  // The job ends for `reason` (the first end counts).
  void End(const Reason& reason);
  // Waits until the job ended. false when `timeout` passed first.
  bool Wait(absl::Duration timeout);
  // OK when the job completed (or has not ended); else the end's code and reason.
  absl::Status exit_status() const;

 private:
  const std::string admin_token_;
  mutable absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status exit_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaps

#endif  // ADAPS_SCHEDULER_JOB_END_H_
