#include "common/main_flags.h"

#include "absl/flags/flag.h"
#include "common/logging.h"

ABSL_FLAG(std::string, config, "", "Config file of 'name = value' lines (also ADAPS_CONFIG)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical, off");
ABSL_FLAG(int, metrics_port, -1,
          "Serve Prometheus metrics on http://metrics_host:PORT/metrics; -1: off, 0: the OS "
          "picks (see --metrics_port_file)");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0", "Address the metrics endpoint listens on");
ABSL_FLAG(std::string, metrics_port_file, "",
          "Write the metrics endpoint's port here (atomically) once it listens");

namespace adaps {

absl::Status CheckSharedFlags() {
  return FirstError({
      ValidateLogLevel(absl::GetFlag(FLAGS_log_level)),
      absl::GetFlag(FLAGS_metrics_port) == -1
          ? absl::OkStatus()
          : CheckPort("metrics_port", absl::GetFlag(FLAGS_metrics_port)),
  });
}

MetricsOptions MetricsOptionsFromFlags(const std::string& role, int rank) {
  MetricsOptions options;
  options.port = absl::GetFlag(FLAGS_metrics_port);
  options.host = absl::GetFlag(FLAGS_metrics_host);
  options.port_file = absl::GetFlag(FLAGS_metrics_port_file);
  options.role = role;
  options.rank = rank;
  return options;
}

}  // namespace adaps
