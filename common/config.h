// Layered configuration for adaps executables: defaults < config file < ADAPS_* environment
// < command-line flags (docs/operations.md). This is the only place that reads the
// environment.
//
// Each executable declares its absl flags (the defaults), then calls LoadLayeredFlags
// before absl::ParseCommandLine: it finds the config file (`--config=PATH` on the command
// line, else ADAPS_CONFIG), applies its `name = value` lines to the named flags, then every
// ADAPS_<NAME> variable (upper-case flag name), so that parsing the command line last gives
// the flags the final word.
#ifndef ADAPS_COMMON_CONFIG_H_
#define ADAPS_COMMON_CONFIG_H_

#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace adaps {

// Reads "name = value" lines ('#' starts a comment; blank lines ignored; a leading "--" on
// the name is allowed). kNotFound when the file cannot be read, kInvalidArgument with the
// line number for a malformed line.
absl::StatusOr<std::map<std::string, std::string>> ReadConfigFile(const std::string& path);

// Applies the config file and the environment to the flags named in `flag_names`.
// kInvalidArgument for an unknown name in the file or a value a flag rejects (the message
// names the source). `sources`, when given, gets one "name=value (source)" per value set.
absl::Status LoadLayeredFlags(int argc, char** argv, absl::Span<const std::string> flag_names,
                              std::vector<std::string>* sources = nullptr);

// Sets the program's usage message and makes --help list the flags defined in files named
// main.cc (absl would otherwise look for a file named after the program).
void InstallUsage(const std::string& usage);

// "name=value, name=value ..." for the named flags: the effective config, for the start log.
std::string DescribeFlags(absl::Span<const std::string> flag_names);

// ---- Flag checks, run on the parsed flags before any network activity. Each returns OK or
// kInvalidArgument whose message starts with the flag and its value ("--port=70000: ...").

// A TCP port to listen on: 0 (the OS chooses) to 65535.
absl::Status CheckPort(absl::string_view flag, int64_t port);

// value > 0 (counts, sizes, timeouts) and value >= 0 (limits where 0 means "none").
template <typename T>
absl::Status CheckPositive(absl::string_view flag, T value) {
  if (value > T{0}) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": must be > 0"));
}
template <typename T>
absl::Status CheckNonNegative(absl::string_view flag, T value) {
  if (value >= T{0}) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": must be >= 0"));
}

// 0 < value <= 1.
absl::Status CheckFraction(absl::string_view flag, double value);

// The address to bind for `--host`: "*", a numeric IPv4 or IPv6 address or a network
// interface name (what ZeroMQ binds) come back unchanged; a host name is resolved to its
// first IPv4 address. kInvalidArgument naming the flag for anything else.
absl::StatusOr<std::string> ResolveListenHost(absl::string_view flag, const std::string& host);

// "tcp://HOST:PORT" with a non-empty host and a port 1..65535 (ipc:// and inproc://
// endpoints are accepted as they are). Not resolved: the peer may not be up yet.
absl::Status CheckConnectEndpoint(absl::string_view flag, const std::string& endpoint);

// An existing, readable directory.
absl::Status CheckReadableDir(absl::string_view flag, const std::string& path);

// The first error of `checks`, or OK.
absl::Status FirstError(std::initializer_list<absl::Status> checks);

// ZeroMQ CURVE keys (Z85 text, 40 characters each) of one process. Empty server_secret_key
// and client_secret_key: plaintext. See docs/reliability.md, "Access".
struct CurveKeys {
  std::string server_public_key;   // the cluster's server key: what DEALERs expect
  std::string server_secret_key;   // scheduler and servers: their ROUTER's secret
  std::string client_public_key;   // this node's own pair, for its DEALERs
  std::string client_secret_key;
  std::vector<std::string> allowed_clients;  // ROUTER side: the only client keys accepted
  bool enabled() const { return !server_public_key.empty(); }
};

// Key file: "public = Z85" and (optional) "secret = Z85" lines, as adaps-keygen writes them.
// Allowed-clients file: one Z85 public key per line ('#' comments). kNotFound for an
// unreadable file, kInvalidArgument for a malformed key (the message names the file).
absl::StatusOr<CurveKeys> LoadCurveKeys(const std::string& server_key_file,
                                        const std::string& client_key_file,
                                        const std::string& allowed_clients_file,
                                        bool serving);

// Writes the port of `endpoint` ("tcp://host:port") to `path` atomically (temporary file,
// rename), for launchers and tests that let the OS choose the port. kUnavailable when the
// file cannot be written.
absl::Status WritePortFile(const std::string& path, const std::string& endpoint);

// Replaces `path` with `text` atomically (temporary file, rename). kUnavailable on failure.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text);

}  // namespace adaps

#endif  // ADAPS_COMMON_CONFIG_H_
