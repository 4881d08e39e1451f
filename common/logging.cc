#include "common/logging.h"

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace adaps {

std::shared_ptr<spdlog::logger> MakeLogger(const std::string& role, int rank,
                                           const std::string& level) {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  std::string name = rank >= 0 ? absl::StrCat(role, " ", rank) : absl::StrCat(role, " ?");
  auto logger = std::make_shared<spdlog::logger>(name, std::move(sink));
  logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] [%n] %v");
  spdlog::level::level_enum lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") lvl = spdlog::level::info;
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::warn);
  return logger;
}

absl::Status ValidateLogLevel(const std::string& level) {
  if (level == "off" || spdlog::level::from_str(level) != spdlog::level::off) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown log level '", level, "' (trace, debug, info, warn, error, critical, off)"));
}

RoleLog::RoleLog(std::string role, std::string level)
    : role_(std::move(role)), level_(std::move(level)), logger_(MakeLogger(role_, -1, level_)) {}

void RoleLog::SetRank(int rank) {
  auto logger = MakeLogger(role_, rank, level_);
  absl::MutexLock lock(&mu_);
  logger_ = std::move(logger);
}

std::shared_ptr<spdlog::logger> RoleLog::get() const {
  absl::MutexLock lock(&mu_);
  return logger_;
}

}  // namespace adaps
