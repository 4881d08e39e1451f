// The flags every adaps executable has, defined once (common/main_flags.cc, compiled into
// each executable, never into a library a trainer links): --config, --log_level and the
// metrics endpoint's --metrics_port, --metrics_host, --metrics_port_file. The scheduler and
// the server, which accept connections, also share the CURVE flags of
// common/serving_flags.cc. MainProgram lists these with the executable's own flags in
// --help (FlagsDefinedIn).
#ifndef ADAPS_COMMON_MAIN_FLAGS_H_
#define ADAPS_COMMON_MAIN_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/metrics.h"

ABSL_DECLARE_FLAG(std::string, config);
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(int, metrics_port);
ABSL_DECLARE_FLAG(std::string, metrics_host);
ABSL_DECLARE_FLAG(std::string, metrics_port_file);

namespace adaps {

// Range checks of the shared flags, before anything touches the network: the log level
// and the metrics port (-1: off, else 0..65535).
absl::Status CheckSharedFlags();

// The metrics endpoint the flags ask for, labelled with `role` and `rank`.
MetricsOptions MetricsOptionsFromFlags(const std::string& role, int rank);

// The scheduler's and the server's CURVE keys from --curve_server_key, --curve_client_key
// and --curve_allowed_clients (common/serving_flags.cc; LoadCurveKeys with serving=true).
absl::StatusOr<CurveKeys> ServingCurveKeysFromFlags();

}  // namespace adaps

#endif  // ADAPS_COMMON_MAIN_FLAGS_H_
