// The CURVE flags of the executables that accept connections (the scheduler and the
// server), defined once; declared and read through common/main_flags.h.
#include <string>

#include "absl/flags/flag.h"
#include "common/main_flags.h"

ABSL_FLAG(std::string, curve_server_key, "",
          "CURVE: key file of the cluster's server key pair (adaps-keygen); enables encryption");
ABSL_FLAG(std::string, curve_client_key, "", "CURVE: this node's client key pair file");
ABSL_FLAG(std::string, curve_allowed_clients, "",
          "CURVE: file of client public keys allowed to connect, one per line");

namespace adaps {

absl::StatusOr<CurveKeys> ServingCurveKeysFromFlags() {
  return LoadCurveKeys(absl::GetFlag(FLAGS_curve_server_key),
                       absl::GetFlag(FLAGS_curve_client_key),
                       absl::GetFlag(FLAGS_curve_allowed_clients), /*serving=*/true);
}

}  // namespace adaps
