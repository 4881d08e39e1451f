#include "common/main_util.h"

#include <dirent.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <csignal>
#include <cstdio>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/config.h"

namespace adaps {
namespace {

volatile std::sig_atomic_t g_signal = 0;  // the one thing a signal handler may touch
void OnSignal(int sig) { g_signal = sig; }

// The directory name of a flag's source file: "scheduler" for "../scheduler/main.cc".
absl::string_view SourceDirName(absl::string_view file) {
  const size_t slash = file.rfind('/');
  if (slash == absl::string_view::npos) return "";
  file = file.substr(0, slash);
  const size_t parent = file.rfind('/');
  return parent == absl::string_view::npos ? file : file.substr(parent + 1);
}

bool IsHelpFlag(absl::string_view arg) {
  if (!absl::ConsumePrefix(&arg, "--")) absl::ConsumePrefix(&arg, "-");
  return arg == "help" || arg == "helpshort" || arg == "helpfull";
}

}  // namespace

std::vector<std::string> FlagsDefinedIn(absl::string_view source_dir) {
  std::vector<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    const std::string file = flag->Filename();  // by value: absl returns a new string
    const bool shared = SourceDirName(file) == "common" &&
                        (absl::EndsWith(file, "/main_flags.cc") ||
                         absl::EndsWith(file, "/serving_flags.cc"));
    if (name != "config" && (shared || SourceDirName(file) == source_dir)) {
      names.emplace_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status CheckCommandLine(int argc, char** argv, const std::vector<std::string>& own) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      if (i + 1 < argc) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", argv[i + 1], "'"));
      }
      break;
    }
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", argv[i], "'"));
    }
    const size_t eq = arg.find('=');
    const absl::string_view name = arg.substr(0, eq);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && eq == absl::string_view::npos && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) continue;
    }
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    std::string value;
    if (eq != absl::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      value = "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
    }
    if (std::find(own.begin(), own.end(), name) == own.end()) continue;  // absl's own flags
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "='", value, "': ", error));
    }
  }
  return absl::OkStatus();
}

std::string HelpText(absl::string_view program, absl::string_view summary,
                     const std::vector<std::string>& names) {
  std::string out = absl::StrCat(
      program, ": ", summary, "\n\nUsage: ", program,
      " [--flag=value ...]\nEvery flag can also be set in a config file of 'name = value' "
      "lines (--config=PATH or ADAPS_CONFIG) or as an ADAPS_<FLAG> environment variable; "
      "the command line wins.\n\nFlags:\n");
  std::vector<std::string> all = names;
  all.push_back("config");
  std::sort(all.begin(), all.end());
  for (const std::string& name : all) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    const bool quote = flag->IsOfType<std::string>();
    absl::StrAppend(&out, "  --", name, " (", flag->Help(), "); default: ",
                    quote ? "\"" : "", flag->DefaultValue(), quote ? "\"" : "", ";\n");
  }
  absl::StrAppend(&out,
                  "\nExit codes: 0 success, 1 runtime failure, 2 usage error (a bad flag, "
                  "config file or environment value; nothing was started).\n");
  return out;
}

MainProgram::MainProgram(std::string program, std::string source_dir, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)),
      names_(FlagsDefinedIn(source_dir)) {}

std::optional<int> MainProgram::Init(int argc, char** argv) {
  InstallUsage(absl::StrCat(program_, ": ", summary_));
  for (int i = 1; i < argc && absl::string_view(argv[i]) != "--"; ++i) {
    if (IsHelpFlag(argv[i])) {
      std::fputs(HelpText(program_, summary_, names_).c_str(), stdout);
      return kExitOk;
    }
  }
  if (auto s = LoadLayeredFlags(argc, argv, names_); !s.ok()) return UsageError(s);
  if (auto s = CheckCommandLine(argc, argv, names_); !s.ok()) return UsageError(s);
  absl::ParseCommandLine(argc, argv);
  return std::nullopt;
}

int MainProgram::UsageError(const absl::Status& status) const {
  std::fprintf(stderr, "%s: %s (see --help)\n", program_.c_str(),
               std::string(status.message()).c_str());
  return kExitUsage;
}

int MainProgram::Fail(const absl::Status& status) const {
  std::fprintf(stderr, "%s: %s\n", program_.c_str(), status.ToString().c_str());
  return kExitFailure;
}

std::string MainProgram::EffectiveConfig() const { return DescribeFlags(names_); }

void MainProgram::CatchStopSignals() {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
}

int MainProgram::StopSignal() { return g_signal; }

int MainProgram::WaitForShutdownOrSignal(const std::function<bool(absl::Duration)>& wait) {
  while (!wait(absl::Milliseconds(200))) {
    if (g_signal != 0) return g_signal;
  }
  return 0;
}

int64_t UnacknowledgedTcpBytes() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int64_t total = 0;
  while (const dirent* entry = readdir(dir)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == dirfd(dir)) continue;
    // (Another thread may close or reuse an fd meanwhile: each check stands on its own.)
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int type = 0, domain = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    len = sizeof(domain);
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 ||
        (domain != AF_INET && domain != AF_INET6)) {
      continue;
    }
    int queued = 0;  // a listening socket answers EINVAL: nothing queued
    if (ioctl(fd, SIOCOUTQ, &queued) == 0 && queued > 0) total += queued;
  }
  closedir(dir);
  return total;
}

int MainProgram::DrainUnlessSignalled(absl::Duration at_least, absl::Duration at_most,
                                      int64_t* left) {
  const absl::Time start = absl::Now();
  *left = -1;
  int quiet = 0;
  while (g_signal == 0) {
    const absl::Duration spent = absl::Now() - start;
    if (spent >= at_least) {
      *left = UnacknowledgedTcpBytes();
      quiet = *left <= 0 ? quiet + 1 : 0;  // (-1, cannot tell: as drained)
      if (quiet >= 2 || spent >= at_most) return 0;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return g_signal;
}

std::string BindEndpoint(const std::string& host, int port) {
  return absl::StrCat("tcp://", host, ":", port);
}

absl::Status WritePortFileIfSet(const std::string& path, const std::string& endpoint) {
  if (path.empty()) return absl::OkStatus();
  return WritePortFile(path, endpoint);
}

}  // namespace adaps
