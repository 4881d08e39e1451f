// What the three executables' main() share: usage and --help, the layered flags (defaults <
// config file < ADAPS_* environment < command line, common/config.h) with every flag defined
// once (the list of an executable's flags comes from absl's flag registry), exit codes,
// SIGINT/SIGTERM, the effective-config line and the port file.
#ifndef ADAPS_COMMON_MAIN_UTIL_H_
#define ADAPS_COMMON_MAIN_UTIL_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace adaps {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // a runtime error: the cluster failed, a port in use
inline constexpr int kExitUsage = 2;    // a bad flag, config file or environment value

// Names of the flags defined in source files whose directory is named `source_dir`
// ("scheduler" for scheduler/main.cc) and of the shared flags the executable compiled in
// (common/main_flags.cc, common/serving_flags.cc), sorted, without --config (it names the
// config file).
std::vector<std::string> FlagsDefinedIn(absl::string_view source_dir);

// Checks argv the way absl::ParseCommandLine will read it, so that an unknown flag, a bad
// value or a stray argument is a usage error (absl itself would exit 1): `--name=value`,
// `--name value`, `--bool`, `--nobool`, one or two dashes. Values of the flags named in
// `own` are parsed (and set: the command line is parsed again after, to the same values).
absl::Status CheckCommandLine(int argc, char** argv, const std::vector<std::string>& own);

// The --help text: `summary`, how flags are set, every flag in `names` as
// "  --name (help); default: value;" and the exit codes. No build paths.
std::string HelpText(absl::string_view program, absl::string_view summary,
                     const std::vector<std::string>& names);

class MainProgram {
 public:
  // `program`: "adaps-scheduler"; `source_dir`: the name of the directory of its main.cc
  // ("scheduler", "server", "app" for worker/app/).
  MainProgram(std::string program, std::string source_dir, std::string summary);

  // --help/--helpshort/--helpfull: prints HelpText on stdout and returns kExitOk. Else
  // applies the config file and the environment, then the command line; a usage error is
  // printed and returns kExitUsage. nullopt: main goes on.
  std::optional<int> Init(int argc, char** argv);

  // Print "program: message" on stderr and return kExitUsage / kExitFailure.
  int UsageError(const absl::Status& status) const;
  int Fail(const absl::Status& status) const;

  const std::vector<std::string>& flag_names() const { return names_; }
  // "name=value ..." of every flag: for the start log.
  std::string EffectiveConfig() const;

  // Records SIGINT and SIGTERM (the handler only stores the number).
  static void CatchStopSignals();
  // The stop signal caught so far (SIGINT or SIGTERM), 0 if none.
  static int StopSignal();
  // Calls wait(200 ms) until it returns true (0) or a stop signal was caught (its number).
  static int WaitForShutdownOrSignal(const std::function<bool(absl::Duration)>& wait);
  // Sleeps for `at_least`, then on until this process's TCP connections hold no byte their
  // peers have not acknowledged (UnacknowledgedTcpBytes, twice 50 ms apart) or `at_most`
  // has passed since the call, unless a stop signal is caught first (its number, else 0).
  // `*left`: the bytes still unacknowledged when it returned (0 when drained).
  static int DrainUnlessSignalled(absl::Duration at_least, absl::Duration at_most,
                                  int64_t* left);

 private:
  std::string program_;
  std::string summary_;
  std::vector<std::string> names_;
};

// "tcp://HOST:PORT" to bind, HOST already checked (ResolveListenHost).
// The bytes this process's TCP connections have queued or sent that their peers have not
// acknowledged yet (Linux: SIOCOUTQ of every TCP socket in /proc/self/fd); -1 when it cannot
// tell. A process that exits with such bytes (closing a socket with unread input resets it)
// may never deliver them: the scheduler's last Acks and Shutdowns on a slow link.
int64_t UnacknowledgedTcpBytes();

std::string BindEndpoint(const std::string& host, int port);

// Writes the port of `endpoint` to `path` (WritePortFile); nothing when path is empty.
absl::Status WritePortFileIfSet(const std::string& path, const std::string& endpoint);

}  // namespace adaps

#endif  // ADAPS_COMMON_MAIN_UTIL_H_
