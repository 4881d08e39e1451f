// Starts real adaps executables on 127.0.0.1 with OS-assigned ports, for integration tests.
// Every process is killed (SIGKILL) and reaped in the destructor, so a failing test leaves
// nothing behind.
#ifndef ADAPS_TESTS_INTEGRATION_CLUSTER_HARNESS_H_
#define ADAPS_TESTS_INTEGRATION_CLUSTER_HARNESS_H_

#include <signal.h>
#include <spawn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

extern char** environ;

namespace adaps::testing {

class Process {
 public:
  // Starts `path args...` with stdout and stderr appended to `log`.
  Process(const std::string& path, const std::vector<std::string>& args, const std::string& log)
      : log_(log) {
    std::vector<std::string> all = {path};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    if (posix_spawn(&pid_, path.c_str(), &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~Process() { Kill(); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  bool started() const { return pid_ > 0; }
  int pid() const { return pid_; }
  // The exit code, -1 when still running after `timeout` (or killed by a signal: 128+sig).
  int WaitExit(absl::Duration timeout) {
    if (exited_) return code_;
    const absl::Time end = absl::Now() + timeout;
    while (true) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return code_;
      }
      if (absl::Now() > end) return -1;
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  // Waits until the log holds `text`: true. False when the process ended without writing it,
  // or at `timeout` (waits for a condition should be generous: a loaded machine starts and
  // runs processes many times slower than an idle one).
  bool WaitForLog(const std::string& text, absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (true) {
      if (Log().find(text) != std::string::npos) return true;
      if (WaitExit(absl::ZeroDuration()) != -1) return Log().find(text) != std::string::npos;
      if (absl::Now() > end) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  // Sends `sig` (SIGSTOP, SIGCONT) to a process still running.
  void Signal(int sig) {
    if (pid_ > 0 && !exited_) ::kill(pid_, sig);
  }
  // Waits until every thread of the process is stopped (a SIGSTOP takes effect after kill()
  // returns: a busy process may still answer a request sent just after it). False at the
  // deadline.
  bool WaitStopped(absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    const std::string tasks = absl::StrCat("/proc/", pid_, "/task");
    while (absl::Now() < end) {
      bool all = true, any = false;
      std::error_code ec;
      for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
        std::ifstream in(t.path() / "stat");
        std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const size_t close = stat.rfind(')');  // the state follows "(comm) "
        const char state = close != std::string::npos && close + 2 < stat.size()
                               ? stat[close + 2] : '?';
        any = true;
        all = all && (state == 'T' || state == 't');
      }
      if (!ec && any && all) return true;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return false;
  }
  void Kill() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      int status;
      waitpid(pid_, &status, 0);
      exited_ = true;
      code_ = 128 + SIGKILL;
    }
  }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  std::string log_;
  bool exited_ = false;
  int code_ = -1;
};

inline std::string MakeTempDir() {
  std::string tmpl = absl::StrCat(::testing::TempDir(), "/adaps-XXXXXX");
  char* dir = mkdtemp(tmpl.data());
  return dir ? std::string(dir) : std::string("/tmp");
}

// Reads the port the scheduler wrote to `path`; empty after `timeout`.
inline std::string WaitForPortFile(const std::string& path, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    std::ifstream in(path);
    std::string port;
    if (in >> port && !port.empty()) return port;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return "";
}

struct ClusterOptions {
  int num_servers = 2;
  int num_workers = 4;
  std::vector<std::string> scheduler_args;
  std::vector<std::string> server_args;
};

// 1 adaps-scheduler and N adaps-server processes; workers are up to the test.
class LocalCluster {
 public:
  explicit LocalCluster(const ClusterOptions& options) : dir_(MakeTempDir()) {
    std::vector<std::string> args = {absl::StrCat("--num_servers=", options.num_servers),
                                     absl::StrCat("--num_workers=", options.num_workers),
                                     "--port_file=" + dir_ + "/port", "--heartbeat_ms=100",
                                     "--dead_timeout_ms=3000", "--log_level=warn",
                                     // Loopback delivers the last messages at once; tests
                                     // wait for the scheduler's exit against deadlines.
                                     "--shutdown_grace_ms=500"};
    args.insert(args.end(), options.scheduler_args.begin(), options.scheduler_args.end());
    scheduler_ = std::make_unique<Process>(ADAPS_SCHEDULER_BIN, args, dir_ + "/scheduler.log");
    const std::string port = WaitForPortFile(dir_ + "/port", absl::Minutes(2));
    if (port.empty()) return;
    address_ = "tcp://127.0.0.1:" + port;
    for (int s = 0; s < options.num_servers; ++s) {
      std::vector<std::string> sargs = {"--scheduler=" + address_, "--log_level=warn",
                                        "--register_timeout_ms=120000"};
      sargs.insert(sargs.end(), options.server_args.begin(), options.server_args.end());
      servers_.push_back(std::make_unique<Process>(ADAPS_SERVER_BIN, sargs,
                                                   absl::StrCat(dir_, "/server", s, ".log")));
    }
  }

  const std::string& scheduler_address() const { return address_; }
  const std::string& dir() const { return dir_; }
  Process& scheduler() { return *scheduler_; }
  Process& server(int i) { return *servers_[i]; }
  int num_servers() const { return static_cast<int>(servers_.size()); }

  // True when the scheduler and every server exited with status 0 within `timeout`.
  bool AllExitCleanly(absl::Duration timeout, std::string* why) {
    bool ok = true;
    int code = scheduler_->WaitExit(timeout);
    if (code != 0) {
      ok = false;
      absl::StrAppend(why, "scheduler exit ", code, ": ", scheduler_->Log(), "\n");
    }
    for (size_t i = 0; i < servers_.size(); ++i) {
      code = servers_[i]->WaitExit(timeout);
      if (code != 0) {
        ok = false;
        absl::StrAppend(why, "server ", i, " exit ", code, ": ", servers_[i]->Log(), "\n");
      }
    }
    return ok;
  }

 private:
  std::string dir_;
  std::string address_;
  std::unique_ptr<Process> scheduler_;
  std::vector<std::unique_ptr<Process>> servers_;
};

// The command line of a server a test starts itself (to kill and restart it): sum-only,
// identity shard0, checkpoints in the cluster's directory "ckpt" (created here; empty on
// failure), then `more`.
inline std::vector<std::string> CheckpointedServerArgs(const LocalCluster& cluster,
                                                       std::vector<std::string> more = {}) {
  const std::string ckpt = cluster.dir() + "/ckpt";
  if (::mkdir(ckpt.c_str(), 0755) != 0) return {};
  std::vector<std::string> args = {"--scheduler=" + cluster.scheduler_address(),
                                   "--optimizer=sum", "--identity=shard0",
                                   "--checkpoint_dir=" + ckpt, "--log_level=info"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

}  // namespace adaps::testing

#endif  // ADAPS_TESTS_INTEGRATION_CLUSTER_HARNESS_H_
