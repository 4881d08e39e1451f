// Logging for adaps processes and libraries: spdlog loggers that are not registered
// globally (several roles may live in one process), each line tagged "[role rank]".
//
// RoleLog is thread-safe: the rank becomes known after registration (on the I/O thread)
// while other threads log; SetRank swaps the logger under a mutex.
#ifndef ADAPS_COMMON_LOGGING_H_
#define ADAPS_COMMON_LOGGING_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"

namespace adaps {

// A logger writing to stderr with "[time] [level] [role rank] message". `level` is a spdlog
// level name (trace, debug, info, warn, error, critical, off); unknown names mean info.
std::shared_ptr<spdlog::logger> MakeLogger(const std::string& role, int rank,
                                           const std::string& level);

// kInvalidArgument unless `level` is a spdlog level name.
absl::Status ValidateLogLevel(const std::string& level);

class RoleLog {
 public:
  RoleLog(std::string role, std::string level);
  void SetRank(int rank);
  std::shared_ptr<spdlog::logger> get() const;

 private:
  const std::string role_;
  const std::string level_;
  mutable absl::Mutex mu_;
  std::shared_ptr<spdlog::logger> logger_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaps

#endif  // ADAPS_COMMON_LOGGING_H_
