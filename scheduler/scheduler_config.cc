#include "scheduler/scheduler_config.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace adaps {

absl::Status ValidateSchedulerConfig(const SchedulerConfig& c) {
  ADAPS_RET_CHECK(c.num_servers >= 1, absl::StatusCode::kInvalidArgument,
                  "num_servers must be at least 1");
  ADAPS_RET_CHECK(c.num_workers >= 1, absl::StatusCode::kInvalidArgument,
                  "num_workers must be at least 1");
  ADAPS_RET_CHECK(c.max_workers == 0 || c.max_workers >= c.num_workers,
                  absl::StatusCode::kInvalidArgument,
                  absl::StrCat("max_workers (", c.max_workers, ") must be 0 or at least "
                               "num_workers (", c.num_workers, ")"));
  ADAPS_RET_CHECK(c.heartbeat_interval > absl::ZeroDuration(),
                  absl::StatusCode::kInvalidArgument, "heartbeat interval must be positive");
  ADAPS_RET_CHECK(c.dead_timeout > c.heartbeat_interval, absl::StatusCode::kInvalidArgument,
                  "dead timeout must exceed the heartbeat interval");
  ADAPS_RET_CHECK(c.reform_timeout > absl::ZeroDuration(), absl::StatusCode::kInvalidArgument,
                  "reform timeout must be positive");
  ADAPS_RET_CHECK(!c.bind.empty(), absl::StatusCode::kInvalidArgument, "empty bind address");
  return ValidateLogLevel(c.log_level);
}

}  // namespace adaps
