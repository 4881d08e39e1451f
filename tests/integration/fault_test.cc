// Faults with real processes and real signals (SIGKILL), asserting on the parameters:
// a worker dies mid-step (continue or fail policy; a replacement with the same identity
// rejoins), a server dies and is restarted from its checkpoint, the scheduler dies and is
// restarted while training goes on.
//
// The servers run the sum-only optimizer with dense pushes of all-ones gradients, so every
// parameter counts how many pushes were applied: an increment per step larger than the
// number of pushers means something was applied twice, a smaller one that something was
// lost.
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adaps/worker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace adaps {
namespace {

using ::adaps::testing::ClusterOptions;
using ::adaps::testing::LocalCluster;
using ::adaps::testing::MakeTempDir;
using ::adaps::testing::Process;
using ::adaps::testing::WaitForPortFile;
using ::testing::HasSubstr;

constexpr size_t kLen = 1000;
// A deadline for a wait that only a failure reaches (a process that never exits, a line that
// never comes): minutes, so that a loaded machine (load 20 on 2 cores) does not reach it.
constexpr absl::Duration kGenerous = absl::Minutes(2);

WorkerOptions Options(const std::string& scheduler, const std::string& identity = "") {
  WorkerOptions o;
  o.scheduler = scheduler;
  o.identity = identity;
  o.register_timeout = kGenerous;
  o.request_timeout = absl::Seconds(30);
  o.log_level = "warn";
  return o;
}

// A worker of `options`' cluster with tensor "t" declared from `p` (kLen elements, dense,
// bin 100): what most cases here train.
absl::StatusOr<std::unique_ptr<Worker>> WorkerWithT(const WorkerOptions& options,
                                                    std::vector<float>& p) {
  absl::StatusOr<std::unique_ptr<Worker>> w = Worker::Create(options);
  if (!w.ok()) return w;
  absl::Status declared = (*w)->Declare({"t", {kLen}, 100, Compression::kDense}, absl::MakeSpan(p));
  if (!declared.ok()) return declared;
  return w;
}

// A worker "w0" of the cluster at `address` whose requests wait 3 minutes (a restart at load
// 20 stays inside them; the code before some fixes waited all of it), with "t" declared from
// `p` and `steps` steps of gradient 1 taken.
absl::StatusOr<std::unique_ptr<Worker>> PatientWorkerAfterSteps(const std::string& address,
                                                                std::vector<float>& p,
                                                                int steps) {
  WorkerOptions options = Options(address, "w0");
  options.request_timeout = absl::Minutes(3);
  absl::StatusOr<std::unique_ptr<Worker>> w = WorkerWithT(options, p);
  if (!w.ok()) return w;
  const std::vector<float> g(kLen, 1.0f);
  for (int s = 0; s < steps; ++s) {
    absl::Status st = (*w)->PushPull("t", g, absl::MakeSpan(p)).get();
    if (!st.ok()) return st;
  }
  return w;
}

// A scheduler for `servers` servers and `workers` workers on `port` ("0": any free one, which
// it writes to dir/port), heartbeats every 100 ms, logging to dir/`log`, with `extra` flags.
std::unique_ptr<Process> StartScheduler(const std::string& dir, const std::string& port,
                                        const std::string& log, int servers, int workers,
                                        const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {absl::StrCat("--num_servers=", servers),
                                   absl::StrCat("--num_workers=", workers), "--port=" + port,
                                   "--port_file=" + dir + "/port", "--heartbeat_ms=100",
                                   "--log_level=info"};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<Process>(ADAPS_SCHEDULER_BIN, args, dir + "/" + log);
}

// What FaultChild prints once its first step completed.
constexpr char kFirstStepDone[] = "fault child: step 1 done";

// Declares tensor "t" (zeros) and pushes ones every step until killed or `steps` done.
// Run as a child process: the test binary re-executed with --child_scheduler=ADDR.
TEST(FaultChild, DISABLED_PushOnesForever) {
  std::string scheduler, identity;
  int steps = 1 << 30;
  for (const std::string& a : ::testing::internal::GetArgvs()) {
    if (a.rfind("--child_scheduler=", 0) == 0) scheduler = a.substr(18);
    if (a.rfind("--child_identity=", 0) == 0) identity = a.substr(17);
    if (a.rfind("--child_steps=", 0) == 0) steps = std::stoi(a.substr(14));
  }
  ASSERT_FALSE(scheduler.empty());
  std::vector<float> p(kLen, 0.0f), g(kLen, 1.0f);
  auto w = WorkerWithT(Options(scheduler, identity), p);
  ASSERT_TRUE(w.ok()) << w.status();
  for (int s = 0; s < steps; ++s) {
    absl::Status st = (*w)->PushPull("t", g, absl::MakeSpan(p)).get();
    if (!st.ok()) break;
    // The parent waits for this line (Process::WaitForLog): a step completed, so the cluster
    // formed and every worker of it pushed.
    if (s == 0) {
      std::printf("%s\n", kFirstStepDone);
      std::fflush(stdout);
    }
  }
  (*w)->Stop().IgnoreError();
}

// A worker `identity` in a child process (FaultChild.DISABLED_PushOnesForever) of the job at
// `scheduler`, pushing ones for `steps` steps, logging to `log_path`.
std::unique_ptr<Process> StartChildAt(const std::string& scheduler, const std::string& identity,
                                      const std::string& log_path, int steps = 1 << 30) {
  return std::make_unique<Process>(
      ::testing::internal::GetArgvs()[0],
      std::vector<std::string>{"--gtest_also_run_disabled_tests",
                               "--gtest_filter=FaultChild.DISABLED_PushOnesForever",
                               "--child_scheduler=" + scheduler, "--child_identity=" + identity,
                               absl::StrCat("--child_steps=", steps)},
      log_path);
}

std::unique_ptr<Process> StartChild(const LocalCluster& cluster, const std::string& identity,
                                    const std::string& log, int steps = 1 << 30) {
  return StartChildAt(cluster.scheduler_address(), identity, cluster.dir() + "/" + log, steps);
}

ClusterOptions SumCluster(int workers, std::vector<std::string> scheduler_args) {
  ClusterOptions c;
  c.num_servers = 1;
  c.num_workers = workers;
  c.scheduler_args = std::move(scheduler_args);
  c.server_args = {"--optimizer=sum"};
  return c;
}

TEST(Faults, KilledWorkerIsDroppedAndAReplacementWithItsIdentityRejoins) {
  LocalCluster cluster(SumCluster(3, {"--dead_timeout_ms=1000"}));
  ASSERT_FALSE(cluster.scheduler_address().empty());
  auto victim = StartChild(cluster, "victim", "victim.log");
  std::unique_ptr<Process> replacement;
  // The library workers train until 5 steps after the replacement's first step (a step
  // all three pushed), however long it takes to start and join: set by thread 0, which is
  // never behind the other thread by more than the step it is in.
  std::atomic<int> last_step{-1};
  const absl::Time give_up = absl::Now() + kGenerous;
  std::vector<std::vector<float>> seen(2);  // per library worker: parameter 0 after each step
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      std::vector<float> p(kLen, 0.0f), g(kLen, 1.0f);
      auto w = WorkerWithT(Options(cluster.scheduler_address()), p);
      ASSERT_TRUE(w.ok()) << w.status();
      for (int s = 0; s != last_step.load(); ++s) {
        if (i == 0 && s == 5) victim->Kill();  // mid-run; it may be inside its step 5 push
        if (i == 0 && s == 20) replacement = StartChild(cluster, "victim", "replacement.log", 15);
        if (i == 0 && s > 20 && last_step.load() < 0) {
          if (replacement->Log().find(kFirstStepDone) != std::string::npos) {
            last_step = s + 5;
          } else if (absl::Now() > give_up) {
            ADD_FAILURE() << "the replacement never stepped\n" << replacement->Log();
            last_step = s + 1;
          }
        }
        absl::Status st = (*w)->PushPull("t", g, absl::MakeSpan(p)).get();
        ASSERT_TRUE(st.ok()) << "step " << s << ": " << st;
        for (size_t k = 1; k < kLen; ++k) ASSERT_EQ(p[k], p[0]);
        seen[i].push_back(p[0]);
        // Slow down while the replacement starts: fewer steps to check.
        if (s >= 20) absl::SleepFor(absl::Milliseconds(50));
      }
      EXPECT_TRUE((*w)->Stop().ok());
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(replacement);
  EXPECT_EQ(replacement->WaitExit(kGenerous), 0) << replacement->Log();
  EXPECT_EQ(seen[0], seen[1]);
  // Per step: 3 pushes before the kill, 2 after it was declared dead, 2 or 3 in between
  // (the victim's last step may have reached the server), 3 again once the replacement is
  // in. Never more than 3: nothing applied twice. Never fewer than 2: nothing lost.
  float prev = 0.0f;
  int threes_after_rejoin = 0, twos = 0;
  for (size_t s = 0; s < seen[0].size(); ++s) {
    const float inc = seen[0][s] - prev;
    prev = seen[0][s];
    EXPECT_TRUE(inc == 2.0f || inc == 3.0f) << "step " << s << " added " << inc;
    if (s < 5) {
      EXPECT_EQ(inc, 3.0f) << s;
    }
    if (inc == 2.0f) ++twos;
    if (s > 20 && inc == 3.0f) ++threes_after_rejoin;
  }
  EXPECT_GT(twos, 0) << "the dead worker was never dropped";
  EXPECT_GT(threes_after_rejoin, 0) << "the replacement never contributed";
  EXPECT_THAT(cluster.scheduler().Log(), HasSubstr("declared dead"));
  std::string why;
  EXPECT_TRUE(cluster.AllExitCleanly(kGenerous, &why)) << why;
}

TEST(Faults, FailPolicyStopsTheClusterWithAClearError) {
  LocalCluster cluster(
      SumCluster(2, {"--dead_timeout_ms=1000", "--on_worker_death=fail", "--log_level=info"}));
  ASSERT_FALSE(cluster.scheduler_address().empty());
  auto victim = StartChild(cluster, "victim", "victim.log");
  const WorkerOptions options = Options(cluster.scheduler_address());
  std::vector<float> p(kLen, 0.0f), g(kLen, 1.0f);
  auto w = WorkerWithT(options, p);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->PushPull("t", g, absl::MakeSpan(p)).get().ok());
  victim->Kill();
  const absl::Time start = absl::Now();
  absl::Status st;
  for (int s = 0; s < 100 && st.ok(); ++s) st = (*w)->PushPull("t", g, absl::MakeSpan(p)).get();
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("died"));
  // The abort comes with the death (1 s here), not at the request deadline (30 s): half of
  // it tells them apart with room for a loaded machine.
  EXPECT_LT(absl::Now() - start, options.request_timeout / 2)
      << "no hang until the request deadline";
  (*w)->Stop().IgnoreError();
  EXPECT_EQ(cluster.server(0).WaitExit(kGenerous), 1) << cluster.server(0).Log();
  EXPECT_THAT(cluster.server(0).Log(), HasSubstr("died"));
}

// Exit codes say whether the job completed: a worker killed under --on_worker_death=
// continue lets the other finish, but the job did not complete, so the scheduler and the
// server exit 1 (old code: 0 everywhere); the surviving worker did its part: 0.
TEST(Faults, AJobThatLostAWorkerEndsWithExitCodeOneForSchedulerAndServer) {
  LocalCluster cluster(SumCluster(2, {"--dead_timeout_ms=1000"}));
  ASSERT_FALSE(cluster.scheduler_address().empty());
  auto killed = StartChild(cluster, "", "killed.log");
  auto survivor = StartChild(cluster, "", "survivor.log", /*steps=*/200);
  // Killed only once the cluster formed and both train: a step completes only when both
  // pushed it. (A fixed 500 ms was too short under ASan: the victim was killed before it
  // registered, the cluster never formed and the survivor's registration timed out.)
  ASSERT_TRUE(killed->WaitForLog(kFirstStepDone, kGenerous)) << killed->Log() << survivor->Log();
  ASSERT_TRUE(survivor->WaitForLog(kFirstStepDone, kGenerous)) << survivor->Log();
  killed->Kill();
  EXPECT_EQ(survivor->WaitExit(kGenerous), 0) << survivor->Log();
  EXPECT_EQ(cluster.scheduler().WaitExit(kGenerous), 1) << cluster.scheduler().Log();
  EXPECT_THAT(cluster.scheduler().Log(), HasSubstr("did not complete: Worker"));
  EXPECT_EQ(cluster.server(0).WaitExit(kGenerous), 1) << cluster.server(0).Log();
}

// And a job in which every worker finished exits 0 everywhere.
TEST(Faults, ACompletedJobEndsWithExitCodeZeroEverywhere) {
  LocalCluster cluster(SumCluster(2, {"--dead_timeout_ms=1000"}));
  ASSERT_FALSE(cluster.scheduler_address().empty());
  auto a = StartChild(cluster, "", "a.log", /*steps=*/50);
  auto b = StartChild(cluster, "", "b.log", /*steps=*/50);
  EXPECT_EQ(a->WaitExit(kGenerous), 0) << a->Log();
  EXPECT_EQ(b->WaitExit(kGenerous), 0) << b->Log();
  EXPECT_EQ(cluster.scheduler().WaitExit(kGenerous), 0) << cluster.scheduler().Log();
  EXPECT_EQ(cluster.server(0).WaitExit(kGenerous), 0) << cluster.server(0).Log();
}

// One worker and one sum server (identity shard0) that checkpoints into a directory of its
// own every `interval_s` seconds.
ClusterOptions CheckpointingSumCluster(const std::string& interval_s) {
  ClusterOptions c = SumCluster(1, {});
  c.server_args = {"--optimizer=sum", "--identity=shard0", "--checkpoint_dir=" + MakeTempDir(),
                   "--checkpoint_interval_s=" + interval_s, "--log_level=info"};
  return c;
}

// Two workers, a scheduler, and no server: the test starts it (CheckpointedServerArgs) so
// that it can kill and restart it.
ClusterOptions RestartableServerCluster() {
  ClusterOptions options = SumCluster(2, {"--dead_timeout_ms=1000", "--num_servers=1"});
  options.num_servers = 0;
  return options;
}


// A server with timed checkpoints writes one soon after new slices are declared, not a whole
// interval later: killed in between, it came back without them and every worker failed on
// "pull of undeclared slice". (Here the interval is ten minutes, and the test waits at
// most kGenerous for the checkpoint, which tells them apart.) And a pull of a slice a
// server does not hold says what that means.
TEST(Faults, NewSlicesAreCheckpointedWithoutWaitingForTheInterval) {
  LocalCluster cluster(CheckpointingSumCluster("600"));
  ASSERT_FALSE(cluster.scheduler_address().empty());
  std::vector<float> p(kLen, 0.0f), g(kLen, 1.0f);
  auto w = WorkerWithT(Options(cluster.scheduler_address()), p);
  ASSERT_TRUE(w.ok()) << w.status();
  const absl::Time declared = absl::Now();
  const absl::Time end = declared + kGenerous;
  while (cluster.server(0).Log().find("checkpoint of 1 slices") == std::string::npos &&
         absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(cluster.server(0).Log(), HasSubstr("checkpoint of 1 slices"));
  ASSERT_TRUE((*w)->PushPull("t", g, absl::MakeSpan(p)).get().ok());
  EXPECT_TRUE((*w)->Stop().ok());
}

// --checkpoint_interval_s takes fractions (the timer ticks every 100 ms): a restart loses at
// most that much training. It was an integer flag, and 0.25 was a usage error.
TEST(Faults, SubSecondCheckpointIntervalsAreKept) {
  LocalCluster cluster(CheckpointingSumCluster("0.25"));
  ASSERT_FALSE(cluster.scheduler_address().empty());
  WorkerOptions o = Options(cluster.scheduler_address());
  o.register_timeout = absl::Seconds(60);
  std::vector<float> p(kLen, 0.0f), g(kLen, 1.0f);
  auto w = WorkerWithT(o, p);
  ASSERT_TRUE(w.ok()) << w.status() << "\n" << cluster.server(0).Log();
  const auto count = [&] {
    const std::string log = cluster.server(0).Log();
    int n = 0;
    for (size_t at = log.find("checkpoint of 1 slices"); at != std::string::npos;
         at = log.find("checkpoint of 1 slices", at + 1)) {
      ++n;
    }
    return n;
  };
  const absl::Time start = absl::Now();
  while (count() < 4 && absl::Now() < start + absl::Seconds(10)) {
    ASSERT_TRUE((*w)->PushPull("t", g, absl::MakeSpan(p)).get().ok());
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(count(), 4) << cluster.server(0).Log();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "four checkpoints at 0.25 s intervals";
  EXPECT_TRUE((*w)->Stop().ok());
}

TEST(Faults, KilledServerRestartsFromItsCheckpointAndWorkersCarryOn) {
  LocalCluster cluster(RestartableServerCluster());
  ASSERT_FALSE(cluster.scheduler_address().empty());
  const std::vector<std::string> args = CheckpointedServerArgs(cluster);
  ASSERT_FALSE(args.empty());
  auto server = std::make_unique<Process>(ADAPS_SERVER_BIN, args, cluster.dir() + "/s-a.log");
  std::unique_ptr<Process> restarted;
  constexpr int kBefore = 8, kCheckpointAt = 5, kAfter = 6;
  std::vector<std::vector<float>> after_restart(2);
  std::vector<std::thread> threads;
  std::atomic<int> at_barrier{0};
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      std::vector<float> p(kLen, 0.0f), g(kLen, 1.0f);
      auto w = WorkerWithT(Options(cluster.scheduler_address()), p);
      ASSERT_TRUE(w.ok()) << w.status();
      for (int s = 0; s < kBefore; ++s) {
        ASSERT_TRUE((*w)->PushPull("t", g, absl::MakeSpan(p)).get().ok()) << s;
        if (s + 1 == kCheckpointAt) {
          ASSERT_TRUE((*w)->Barrier().ok());
          if ((*w)->rank() == 0) {
            ASSERT_TRUE((*w)->Checkpoint("").ok());
          }
          ASSERT_TRUE((*w)->Barrier().ok());
        }
      }
      ASSERT_EQ(p[0], 2.0f * kBefore);
      ASSERT_TRUE((*w)->Barrier().ok());
      if ((*w)->rank() == 0) {
        server->Kill();
        restarted = std::make_unique<Process>(ADAPS_SERVER_BIN, args, cluster.dir() + "/s-b.log");
      }
      ASSERT_TRUE((*w)->Barrier().ok());
      int done = 0;
      const absl::Time end = absl::Now() + kGenerous;
      while (done < kAfter && absl::Now() < end) {
        absl::Status st = (*w)->PushPull("t", g, absl::MakeSpan(p)).get();
        if (!st.ok()) {
          ASSERT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
          absl::SleepFor(absl::Milliseconds(100));
          continue;
        }
        after_restart[i].push_back(p[0]);
        ++done;
      }
      EXPECT_EQ(done, kAfter);
      EXPECT_TRUE((*w)->Stop().ok());
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(restarted);
  // Steps 5..7 were after the checkpoint and are lost with the server; the restored shard
  // goes on from step 5 exactly: each later step adds the two pushes once.
  std::vector<float> expected;
  for (int k = 1; k <= kAfter; ++k) expected.push_back(2.0f * (kCheckpointAt + k));
  EXPECT_EQ(after_restart[0], expected) << restarted->Log();
  EXPECT_EQ(after_restart[1], expected);
  EXPECT_THAT(restarted->Log(), HasSubstr("restored at step 5"));
  EXPECT_EQ(restarted->WaitExit(kGenerous), 0) << restarted->Log();
}

// Recompressed pulls across a server restart: a resynchronized slice takes the server's
// published state (a Replica pull), at its version, and the next recompressed answers are
// the change from it, so both workers' parameters are the same bits after every step. The
// old code took the server's parameters at its step; when the restored shard had taken one
// worker's step before the other resynchronized, the other's pull failed with
// FAILED_PRECONDITION ("the server can only send the change from version 8"), in about
// half the runs.
// Recompressed pulls take the published replica again after a server restart, and sparse
// pulls the parameters (their answers are then sparse again from the next tracked step):
// both workers see the same values at every step, and with sparse pulls those are the
// servers' parameters exactly.
void PullsFollowARestartedServer(PullFormat format) {
  LocalCluster cluster(RestartableServerCluster());
  ASSERT_FALSE(cluster.scheduler_address().empty());
  const std::vector<std::string> args = CheckpointedServerArgs(cluster);
  ASSERT_FALSE(args.empty());
  auto server = std::make_unique<Process>(ADAPS_SERVER_BIN, args, cluster.dir() + "/s-a.log");
  std::unique_ptr<Process> restarted;
  constexpr int kBefore = 8, kCheckpointAt = 5, kAfter = 6;
  // Per worker (by rank): its parameters after each successful step.
  std::vector<std::vector<std::vector<float>>> seen(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&] {
      WorkerOptions o = Options(cluster.scheduler_address());
      o.fusion_threshold_bytes = 0;  // a slice of its own, not a fusion bucket
      auto w = Worker::Create(o);
      ASSERT_TRUE(w.ok()) << w.status();
      const int rank = (*w)->rank();
      std::vector<float> p(kLen, 0.0f), g(kLen);
      ASSERT_TRUE((*w)->Declare({"t", {kLen}, 50, Compression::kAdaComp, 0.01, format},
                                absl::MakeSpan(p))
                      .ok());
      int step = 0;
      const auto next_grad = [&] {  // the same for both workers, step by step
        for (size_t j = 0; j < kLen; ++j) {
          g[j] = 1.0f + 0.1f * static_cast<float>((j * 7 + step) % 13);
        }
      };
      for (; step < kBefore; ++step) {
        next_grad();
        ASSERT_TRUE((*w)->PushPull("t", g, absl::MakeSpan(p)).get().ok()) << step;
        seen[rank].push_back(p);
        if (step + 1 == kCheckpointAt) {
          ASSERT_TRUE((*w)->Barrier().ok());
          if (rank == 0) {
            ASSERT_TRUE((*w)->Checkpoint("").ok());
          }
          ASSERT_TRUE((*w)->Barrier().ok());
        }
      }
      ASSERT_TRUE((*w)->Barrier().ok());
      if (rank == 0) {
        server->Kill();
        restarted = std::make_unique<Process>(ADAPS_SERVER_BIN, args, cluster.dir() + "/s-b.log");
      }
      ASSERT_TRUE((*w)->Barrier().ok());
      int done = 0;
      const absl::Time end = absl::Now() + kGenerous;
      while (done < kAfter && absl::Now() < end) {
        next_grad();
        absl::Status st = (*w)->PushPull("t", g, absl::MakeSpan(p)).get();
        if (!st.ok()) {
          ASSERT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
          absl::SleepFor(absl::Milliseconds(100));
          continue;
        }
        seen[rank].push_back(p);
        if (format == PullFormat::kSparse) {  // (the other worker may be a step ahead)
          ASSERT_TRUE((*w)->Barrier().ok());
          std::vector<float> exact(kLen);
          ASSERT_TRUE((*w)->PullParameters("t", absl::MakeSpan(exact)).ok());
          EXPECT_EQ(exact, p) << "after the restart, step " << step;
          ASSERT_TRUE((*w)->Barrier().ok());
        }
        ++done;
        ++step;
      }
      EXPECT_EQ(done, kAfter);
      if (format == PullFormat::kSparse) {
        std::vector<float> exact(kLen);
        ASSERT_TRUE((*w)->PullParameters("t", absl::MakeSpan(exact)).ok());
        EXPECT_EQ(exact, p) << "the output is not the restarted server's parameters";
        auto traffic = (*w)->Traffic("t");
        ASSERT_TRUE(traffic.ok());
        EXPECT_GT(traffic->pulls_answered_sparse, 0u);
      }
      EXPECT_TRUE((*w)->Stop().ok());
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(restarted);
  EXPECT_THAT(restarted->Log(), HasSubstr("restored at step 5"));
  ASSERT_EQ(seen[0].size(), seen[1].size());
  ASSERT_EQ(seen[0].size(), static_cast<size_t>(kBefore + kAfter));
  for (size_t k = 0; k < seen[0].size(); ++k) {
    EXPECT_EQ(seen[0][k], seen[1][k]) << "after step " << k << " (the restart after step "
                                      << kBefore - 1 << ")";
  }
  EXPECT_NE(seen[0][kBefore], seen[0][kBefore - 1]) << "the run should go on after the restart";
  EXPECT_EQ(restarted->WaitExit(kGenerous), 0) << restarted->Log();
}

TEST(Faults, RecompressedPullsTakeThePublishedReplicaAfterAServerRestart) {
  PullsFollowARestartedServer(PullFormat::kRecompressed);
}

TEST(Faults, SparsePullsStayTheServersParametersAcrossAServerRestart) {
  PullsFollowARestartedServer(PullFormat::kSparse);
}

// The step in flight when the server dies is not failed: the worker waits for the
// restarted server, resynchronizes the slice's step with the restored shard and sends the
// same update again. Every PushPull succeeds; the parameters fall back once, to the last
// timed checkpoint, and from there every step adds the two pushes exactly once.
// `split`: a second server (not killed) and the tensor laid out as 2 slices, one on each
// (the scheduler's --split_threshold=250): the killed server's slice is retried while the
// other slice's parts are still out.
void KillServerMidStepAndRestart(bool same_port, bool split = false) {
  std::vector<std::string> scheduler_args = {"--dead_timeout_ms=1000",
                                             split ? "--num_servers=2" : "--num_servers=1"};
  if (split) scheduler_args.push_back("--split_threshold=250");
  ClusterOptions options = SumCluster(2, scheduler_args);
  options.num_servers = split ? 1 : 0;
  LocalCluster cluster(options);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  const std::vector<std::string> args =
      CheckpointedServerArgs(cluster, {"--checkpoint_interval_s=1"});
  ASSERT_FALSE(args.empty());
  std::vector<std::string> first = args;
  if (same_port) first.push_back("--port_file=" + cluster.dir() + "/server.port");
  auto server = std::make_unique<Process>(ADAPS_SERVER_BIN, first, cluster.dir() + "/s-a.log");
  std::vector<std::string> second = args;
  std::unique_ptr<Process> restarted;
  // The kill comes at the first step from kKillAt on with a timed checkpoint of a later step
  // than the first on disk: the second one that holds the slice (the first may be of step 0,
  // the second starts after it ended). A checkpoint's fsync can take seconds on a loaded
  // disk, so the workers step on until then; both stop kAfterKill steps after the kill.
  constexpr int kKillAt = 60, kAfterKill = 30, kGiveUpAt = 2400;  // about 60 s
  const auto checkpoints = [&] {
    const std::string log = server->Log();
    int n = 0;
    for (size_t at = log.find("checkpoint of 1 slices"); at != std::string::npos;
         at = log.find("checkpoint of 1 slices", at + 1)) {
      ++n;
    }
    return n;
  };
  std::atomic<int> last_step{-1};  // set by rank 0; ahead of both workers
  // Per worker and slice: the slice's first value after every step.
  std::vector<std::vector<std::vector<float>>> seen(2, std::vector<std::vector<float>>(2));
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      std::vector<float> p(kLen, 0.0f), g(kLen, 1.0f);
      auto w = WorkerWithT(Options(cluster.scheduler_address()), p);
      ASSERT_TRUE(w.ok()) << w.status();
      for (int s = 0; s != last_step.load(); ++s) {
        if ((*w)->rank() == 0 && last_step.load() < 0 && s >= kKillAt) {
          if (checkpoints() >= 2) {
            if (same_port) {  // written once the cluster formed
              second.push_back("--port=" + WaitForPortFile(cluster.dir() + "/server.port",
                                                           absl::Seconds(1)));
            }
            server->Kill();  // the other worker is inside its step
            restarted =
                std::make_unique<Process>(ADAPS_SERVER_BIN, second, cluster.dir() + "/s-b.log");
            last_step = s + kAfterKill;
            // Split: the other worker's pull of the slice on the server that was not killed
            // stays held (it waits for this worker's push) while its other slice fails.
            if (split) absl::SleepFor(absl::Milliseconds(1500));
          } else if (s >= kGiveUpAt) {
            ADD_FAILURE() << "no two timed checkpoints by step " << s << "\n" << server->Log();
            last_step = s + 1;
          }
        }
        absl::Status st = (*w)->PushPull("t", g, absl::MakeSpan(p)).get();
        ASSERT_TRUE(st.ok()) << "step " << s << ": " << st;
        auto slices = (*w)->Slices("t");
        ASSERT_TRUE(slices.ok());
        ASSERT_EQ(slices->size(), split ? 2u : 1u);
        for (size_t j = 0; j < slices->size(); ++j) {
          const SliceInfo& info = (*slices)[j];
          for (size_t k = info.offset; k < info.offset + info.length; ++k) {
            ASSERT_EQ(p[k], p[info.offset]);
          }
          seen[i][j].push_back(p[info.offset]);
        }
        absl::SleepFor(absl::Milliseconds(25));
      }
      EXPECT_TRUE((*w)->Stop().ok());
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(restarted);
  EXPECT_EQ(restarted->WaitExit(kGenerous), 0) << restarted->Log();
  const std::string log = restarted->Log();
  const size_t at = log.find("restored at step ");
  ASSERT_NE(at, std::string::npos) << log;
  const int restored = std::atoi(log.c_str() + at + 17);
  ASSERT_GT(restored, 0) << "no timed checkpoint before the kill";
  EXPECT_EQ(seen[0], seen[1]);
  for (const std::vector<float>& slice : seen[0]) {
    int falls = 0;
    for (size_t s = 0; s < slice.size(); ++s) {
      const float prev = s == 0 ? 0.0f : slice[s - 1];
      if (slice[s] == prev + 2.0f) continue;
      ++falls;
      // The first step after the restore: the checkpoint's step plus this one, once.
      EXPECT_EQ(slice[s], 2.0f * (restored + 1)) << "step " << s;
    }
    // (No fall at all only if the last checkpoint was at the very step of the kill, and
    // never on the server that was not killed.)
    EXPECT_LE(falls, 1) << "steps were lost or doubled";
  }
}

TEST(Faults, ServerKilledMidStepIsResumedAndTheStepInFlightIsRetried) {
  KillServerMidStepAndRestart(/*same_port=*/false);
}

// The same with a tensor of 4 slices: a slice whose server went away is retried as soon as
// its own push and pull failed, while the other slices' parts are still out (worker/run.h);
// every step still adds each push once.
TEST(Faults, ServerKilledMidStepRetriesEachSliceOfASplitTensor) {
  KillServerMidStepAndRestart(/*same_port=*/false, /*split=*/true);
}

// The same when the restarted server listens on the same address (fixed --port, as on
// hosts): the scheduler shows it dead and alive again so that workers see the restart.
TEST(Faults, ServerRestartedAtTheSameAddressIsResumedToo) {
  KillServerMidStepAndRestart(/*same_port=*/true);
}

// The start of a job whose scheduler a test kills: its first scheduler (dir/sched-a.log, a
// free port, `extra` flags) for one server and `workers` workers, and server "s0" running sum
// (dir/server.log). A restarted scheduler listens on `port` again.
struct SchedulerAndServer {
  std::unique_ptr<Process> scheduler, server;
  std::string port, address;
};
void StartSchedulerAndServer(const std::string& dir, int workers,
                             const std::vector<std::string>& extra, SchedulerAndServer* job) {
  job->scheduler = StartScheduler(dir, "0", "sched-a.log", 1, workers, extra);
  job->port = WaitForPortFile(dir + "/port", kGenerous);
  ASSERT_FALSE(job->port.empty()) << job->scheduler->Log();
  job->address = "tcp://127.0.0.1:" + job->port;
  job->server = std::make_unique<Process>(
      ADAPS_SERVER_BIN,
      std::vector<std::string>{"--scheduler=" + job->address, "--optimizer=sum",
                               "--identity=s0", "--log_level=info"},
      dir + "/server.log");
}

TEST(Faults, TrainingGoesOnWhileTheSchedulerIsDownAndARestartedOneTakesNodesBack) {
  const std::string dir = testing::MakeTempDir();
  const std::vector<std::string> flags = {"--dead_timeout_ms=3000"};
  SchedulerAndServer job;
  ASSERT_NO_FATAL_FAILURE(StartSchedulerAndServer(dir, 2, flags, &job));
  const std::string port = job.port, address = job.address;
  std::unique_ptr<Process> restarted;
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      std::vector<float> p(kLen, 0.0f), g(kLen, 1.0f);
      auto w = WorkerWithT(Options(address, absl::StrCat("w", i)), p);
      ASSERT_TRUE(w.ok()) << w.status();
      for (int s = 0; s < 30; ++s) {
        if ((*w)->rank() == 0 && s == 5) job.scheduler->Kill();
        if ((*w)->rank() == 0 && s == 20) {
          std::remove((dir + "/port").c_str());
          restarted = StartScheduler(dir, port, "sched-b.log", 1, 2, flags);
        }
        ASSERT_TRUE((*w)->PushPull("t", g, absl::MakeSpan(p)).get().ok()) << "step " << s;
        ASSERT_EQ(p[0], 2.0f * (s + 1)) << "step " << s;
        absl::SleepFor(absl::Milliseconds(100));  // 3 s of training, 1.5 s without scheduler
      }
      // The restarted scheduler has the nodes back: a barrier needs it and every worker.
      ASSERT_TRUE((*w)->Barrier().ok());
      EXPECT_TRUE((*w)->Stop().ok());
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(restarted);
  EXPECT_EQ(restarted->WaitExit(kGenerous), 0) << restarted->Log();
  EXPECT_EQ(job.server->WaitExit(kGenerous), 0) << job.server->Log();
  EXPECT_THAT(job.server->Log(), HasSubstr("registered again"));
}

// A server and the scheduler killed together while a worker's push waits on the server: no
// view says the server died, and it comes back at the same address. The worker must send the
// step again to the new process once the new scheduler's view has it (another
// NodeInfo.instance), not wait for an answer the dead process never gives until the request
// deadline (found by tests/faults/netns_faults.py, seed 1045: 30 s, then DEADLINE_EXCEEDED).
// The server is stopped (SIGSTOP) first, so that the push is in flight when it is killed.
TEST(Faults, APushInFlightToAServerKilledWithTheSchedulerIsSentAgainToItsNewProcess) {
  const std::string dir = testing::MakeTempDir();
  auto start_scheduler = [&](const std::string& port, const std::string& log) {
    return StartScheduler(dir, port, log, 1, 1, {"--job_id=inflight"});
  };
  auto scheduler = start_scheduler("0", "sched-a.log");
  const std::string port = WaitForPortFile(dir + "/port", kGenerous);
  ASSERT_FALSE(port.empty());
  const std::string address = "tcp://127.0.0.1:" + port;
  ASSERT_EQ(::mkdir((dir + "/ckpt").c_str(), 0755), 0);
  const std::vector<std::string> server_args = {
      "--scheduler=" + address, "--optimizer=sum", "--identity=s0",
      "--checkpoint_dir=" + dir + "/ckpt", "--checkpoint_interval_s=0.2", "--log_level=info"};
  std::vector<std::string> first = server_args;
  first.push_back("--port_file=" + dir + "/server.port");
  auto server = std::make_unique<Process>(ADAPS_SERVER_BIN, first, dir + "/server-a.log");
  std::vector<float> p(kLen, 0.0f), g(kLen, 1.0f);
  auto w = PatientWorkerAfterSteps(address, p, 3);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string server_port = WaitForPortFile(dir + "/server.port", kGenerous);
  ASSERT_FALSE(server_port.empty());
  ASSERT_TRUE(server->WaitForLog("checkpoint of 1 slices", kGenerous)) << server->Log();
  server->Signal(SIGSTOP);
  ASSERT_TRUE(server->WaitStopped(kGenerous));
  const absl::Time sent = absl::Now();
  std::future<absl::Status> step = (*w)->PushPull("t", g, absl::MakeSpan(p));
  absl::SleepFor(absl::Milliseconds(300));  // (sent: the stopped server's socket holds it)
  server->Kill();
  scheduler->Kill();
  std::remove((dir + "/port").c_str());
  auto restarted_scheduler = start_scheduler(port, "sched-b.log");
  std::vector<std::string> second = server_args;
  second.push_back("--port=" + server_port);
  auto restarted = std::make_unique<Process>(ADAPS_SERVER_BIN, second, dir + "/server-b.log");
  const absl::Status st = step.get();
  EXPECT_TRUE(st.ok()) << st << " after " << absl::Now() - sent << "\n"
                       << restarted->Log() << restarted_scheduler->Log();
  EXPECT_THAT(restarted->Log(), HasSubstr("restored 1 slices"));
  EXPECT_TRUE((*w)->PushPull("t", g, absl::MakeSpan(p)).get().ok());
  EXPECT_TRUE((*w)->Stop().ok());
}

// Both servers killed while the scheduler is down (the fault harness's seeds 2154, 2211 and
// 2216): the restarted scheduler must give each restarted server the rank whose checkpoint
// its directory holds. The old code gave ranks in the order the servers came back: the one
// that had rank 1, back first, got rank 0; neither found a checkpoint of its new rank, and the
// worker's next step failed ("pull of undeclared slice ...: the slice's parameters are lost").
TEST(Faults, ServersRestartedWithTheSchedulerGetTheRanksOfTheirCheckpointsBack) {
  const std::string dir = testing::MakeTempDir();
  // --split_threshold: tensor "t" is two slices, one on each server.
  const std::vector<std::string> flags = {"--job_id=swap", "--split_threshold=250"};
  auto scheduler = StartScheduler(dir, "0", "sched-a.log", 2, 1, flags);
  const std::string port = WaitForPortFile(dir + "/port", kGenerous);
  ASSERT_FALSE(port.empty());
  const std::string address = "tcp://127.0.0.1:" + port;
  std::vector<std::vector<std::string>> args(2);
  std::vector<std::unique_ptr<Process>> servers(2);
  for (int s = 0; s < 2; ++s) {
    const std::string ckpt = absl::StrCat(dir, "/ckpt-s", s);
    ASSERT_EQ(::mkdir(ckpt.c_str(), 0755), 0);
    args[s] = {"--scheduler=" + address, "--optimizer=sum", absl::StrCat("--identity=s", s),
               "--checkpoint_dir=" + ckpt, "--checkpoint_interval_s=0.2", "--log_level=info"};
    std::vector<std::string> first = args[s];
    first.push_back(absl::StrCat("--port_file=", dir, "/server", s, ".port"));
    servers[s] = std::make_unique<Process>(ADAPS_SERVER_BIN, first,
                                           absl::StrCat(dir, "/server", s, "-a.log"));
  }
  std::vector<float> p(kLen, 0.0f), g(kLen, 1.0f);
  auto w = PatientWorkerAfterSteps(address, p, 3);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ((*w)->Slices("t")->size(), 2u);
  // Which process has rank 1 (they registered in either order), and each one's port.
  int second_rank = -1;
  std::vector<std::string> ports(2);
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(servers[s]->WaitForLog("checkpoint of 1 slices", kGenerous)) << servers[s]->Log();
    if (servers[s]->Log().find("registered as server 1 ") != std::string::npos) second_rank = s;
    ports[s] = WaitForPortFile(absl::StrCat(dir, "/server", s, ".port"), kGenerous);
    ASSERT_FALSE(ports[s].empty());
  }
  ASSERT_GE(second_rank, 0) << servers[0]->Log() << servers[1]->Log();
  scheduler->Kill();
  servers[0]->Kill();
  servers[1]->Kill();
  std::remove((dir + "/port").c_str());
  auto restarted_scheduler = StartScheduler(dir, port, "sched-b.log", 2, 1, flags);
  // The server that had rank 1 comes back first, the other once the scheduler took it in.
  std::vector<std::unique_ptr<Process>> restarted(2);
  for (int s : {second_rank, 1 - second_rank}) {
    std::vector<std::string> again = args[s];
    again.push_back("--port=" + ports[s]);
    restarted[s] = std::make_unique<Process>(ADAPS_SERVER_BIN, again,
                                             absl::StrCat(dir, "/server", s, "-b.log"));
    ASSERT_TRUE(restarted_scheduler->WaitForLog("registered at tcp://127.0.0.1:" + ports[s],
                                                kGenerous))
        << restarted_scheduler->Log();
  }
  const absl::Status st = (*w)->PushPull("t", g, absl::MakeSpan(p)).get();
  EXPECT_TRUE(st.ok()) << st << "\n" << restarted[0]->Log() << restarted[1]->Log()
                       << restarted_scheduler->Log();
  for (int s = 0; s < 2; ++s) {
    EXPECT_THAT(restarted[s]->Log(), HasSubstr("restored 1 slices")) << "server process " << s;
    EXPECT_THAT(restarted[s]->Log(), HasSubstr(absl::StrCat(
                                         "registered as server ", s == second_rank ? 1 : 0, " ")));
  }
  // Each slice went back to its checkpoint (1 to 3 pushes) and took this step once.
  for (size_t k = 0; k < kLen; ++k) {
    ASSERT_GE(p[k], 2.0f) << k;
    ASSERT_LE(p[k], 4.0f) << k;
  }
  EXPECT_TRUE((*w)->Stop().ok());
}

// The scheduler restarted twice: the second one waits for a worker that is stopped, and
// holds the other nodes' re-registrations unanswered until it is killed too. Those requests
// die with its connection; the nodes must register with the third scheduler, not wait for
// answers to them until the grace period has passed and give up (found by
// tests/faults/netns_faults.py, seed 1092: the third scheduler formed with nobody).
TEST(Faults, NodesWhoseReRegistrationDiedWithASchedulerRegisterWithTheNextOne) {
  const std::string dir = testing::MakeTempDir();
  auto start_scheduler = [&](const std::string& port, const std::string& log) {
    return StartScheduler(dir, port, log, 1, 2);
  };
  SchedulerAndServer job;
  ASSERT_NO_FATAL_FAILURE(StartSchedulerAndServer(dir, 2, {}, &job));
  const std::string port = job.port, address = job.address;
  std::unique_ptr<Process> stopped = StartChildAt(address, "w1", dir + "/stopped.log");
  std::vector<float> p(kLen, 0.0f), g(kLen, 1.0f);
  auto w = WorkerWithT(Options(address, "w0"), p);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->PushPull("t", g, absl::MakeSpan(p)).get().ok());
  ASSERT_TRUE(stopped->WaitForLog(kFirstStepDone, kGenerous)) << stopped->Log();
  stopped->Signal(SIGSTOP);
  ASSERT_TRUE(stopped->WaitStopped(kGenerous));
  job.scheduler->Kill();
  std::remove((dir + "/port").c_str());
  auto second = start_scheduler(port, "sched-b.log");
  // The server and this worker are back with the second scheduler; it waits for the other.
  ASSERT_TRUE(second->WaitForLog("Server 0 registered", kGenerous)) << second->Log();
  ASSERT_TRUE(second->WaitForLog(absl::StrCat("Worker ", (*w)->rank(), " registered"), kGenerous))
      << second->Log();
  second->Kill();
  std::remove((dir + "/port").c_str());
  auto third = start_scheduler(port, "sched-c.log");
  stopped->Signal(SIGCONT);
  // Every node registers with the third one (the old code: only the stopped worker did; the
  // others waited on their requests to the second until the 60 s grace ran out, and quit).
  EXPECT_TRUE(third->WaitForLog("cluster complete", kGenerous))
      << third->Log() << job.server->Log();
  EXPECT_TRUE((*w)->PushPull("t", g, absl::MakeSpan(p)).get().ok());
  EXPECT_TRUE((*w)->Stop().ok());
  stopped->Kill();
}

// A restarted scheduler re-forms the job only when every node it had is back. A worker killed
// with the scheduler never comes back: the restarted one must not wait for it forever. After
// --reform_timeout_ms (short here: only this failing side has a short deadline) it stops the
// nodes that came back and exits 1 naming the missing worker, as the nodes do on theirs.
TEST(Faults, ARestartedSchedulerWhoseWorkerNeverComesBackStopsTheJobNamingIt) {
  const std::string dir = testing::MakeTempDir();
  SchedulerAndServer job;
  ASSERT_NO_FATAL_FAILURE(StartSchedulerAndServer(dir, 2, {}, &job));
  const std::string port = job.port, address = job.address;
  Process& server = *job.server;
  std::unique_ptr<Process> victim = StartChildAt(address, "w1", dir + "/victim.log");
  auto w = Worker::Create(Options(address, "w0"));
  ASSERT_TRUE(w.ok()) << w.status();
  const int missing = 1 - (*w)->rank();
  // One step together: every node has its view from the first scheduler.
  std::vector<float> p(kLen, 0.0f), g(kLen, 1.0f);
  ASSERT_TRUE((*w)->Declare({"t", {kLen}, 100, Compression::kDense}, absl::MakeSpan(p)).ok());
  ASSERT_TRUE((*w)->PushPull("t", g, absl::MakeSpan(p)).get().ok());
  ASSERT_TRUE(victim->WaitForLog(kFirstStepDone, kGenerous)) << victim->Log();
  ASSERT_TRUE(server.WaitForLog("registered as server", kGenerous)) << server.Log();
  job.scheduler->Kill();
  victim->Kill();
  std::remove((dir + "/port").c_str());
  auto restarted = StartScheduler(dir, port, "sched-b.log", 1, 2, {"--reform_timeout_ms=2000"});
  EXPECT_EQ(restarted->WaitExit(kGenerous), 1) << restarted->Log();
  EXPECT_THAT(restarted->Log(), HasSubstr(absl::StrCat("never came back: worker ", missing)));
  // The server came back and is told to stop, with the reason.
  EXPECT_EQ(server.WaitExit(kGenerous), 1) << server.Log();
  EXPECT_THAT(server.Log(), HasSubstr("did not re-form"));
  (*w)->Stop().IgnoreError();
}

}  // namespace
}  // namespace adaps
