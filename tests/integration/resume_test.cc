// Resume after a server restart, with many operations in flight: a real adaps-server with
// an identity and timed checkpoints is SIGKILLed while two library workers have a PushPull
// of each of many tensors in flight, and restarted from its checkpoint.
//
// The race this guards: the old server completed a tensor's step k and answered worker A's
// pull, but worker B's answer was lost with it. A then pushes step k+1 while B retries step
// k; the restored shard (at its checkpoint's step c <= k) must not make both of them one
// step of the restored slice (B would then be one operation behind A for good: its last
// PushPull waits for a push A never sends). The servers run the sum-only optimizer with
// all-ones pushes, so each parameter counts the pushes applied.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
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
using ::adaps::testing::Process;

constexpr size_t kLen = 64;
constexpr int kTensors = 32;
constexpr int kKills = 8;

WorkerOptions Options(const std::string& scheduler, bool fuse = true) {
  WorkerOptions o;
  o.scheduler = scheduler;
  if (!fuse) o.fusion_threshold_bytes = 0;
  o.emulate_devices = true;  // (for the tensors declared on a device)
  o.register_timeout = absl::Seconds(20);
  o.request_timeout = absl::Seconds(5);
  o.log_level = "error";
  return o;
}

// What one worker saw: per tensor, p[0] after each PushPull.
using Seen = std::vector<std::vector<float>>;

// How the 32 small tensors travel: in fusion buckets (the default), one slice each, or on
// a device (emulated in host memory: the worker library's device path, AdaComp there; an
// all-ones gradient is sent whole and exactly, so the arithmetic is the dense one).
enum class Path { kFused, kOneSlice, kDevice };

void TrainThroughKills(int kills, Path path, Seen* seen0, Seen* seen1, std::string* log) {
  const bool fuse = path == Path::kFused;
  ClusterOptions options;
  options.num_servers = 0;  // started here, with an identity and checkpoints
  options.num_workers = 2;
  options.scheduler_args = {"--dead_timeout_ms=1000", "--num_servers=1"};
  LocalCluster cluster(options);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  const std::vector<std::string> args =
      CheckpointedServerArgs(cluster, {"--checkpoint_interval_s=1"});
  ASSERT_FALSE(args.empty());
  std::vector<std::unique_ptr<Process>> servers;
  servers.push_back(std::make_unique<Process>(ADAPS_SERVER_BIN, args, cluster.dir() + "/s0.log"));
  std::atomic<bool> done{false};
  std::atomic<bool> killed_all{false};
  std::atomic<bool> stepping{false};  // rank 0 completed a step: every tensor is declared
  // Kills the server (while both workers are in their steps) once it checkpointed every
  // tensor (a checkpoint written after the first step; a restored server's first one holds
  // what it restored), and starts it again; `kills` times.
  std::thread killer([&] {
    for (int k = 0; k < kills && !done; ++k) {
      size_t from = 0;
      if (k == 0) {
        while (!stepping && !done) absl::SleepFor(absl::Milliseconds(5));
        from = servers.back()->Log().size();
      }
      while (servers.back()->Log().find("checkpoint of ", from) == std::string::npos && !done) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      if (done) return;
      absl::SleepFor(absl::Milliseconds(std::rand() % 50));
      servers.back()->Kill();
      servers.push_back(std::make_unique<Process>(
          ADAPS_SERVER_BIN, args, absl::StrCat(cluster.dir(), "/s", k + 1, ".log")));
    }
    absl::SleepFor(absl::Seconds(1));
    killed_all = true;
  });
  std::vector<Seen> seen(2, Seen(kTensors));
  std::atomic<int> last_step{-1};  // both workers stop after it (set by rank 0)
  std::vector<std::thread> workers;
  for (int i = 0; i < 2; ++i) {
    workers.emplace_back([&, i] {
      auto w = Worker::Create(Options(cluster.scheduler_address(), fuse));
      ASSERT_TRUE(w.ok()) << w.status();
      std::vector<std::vector<float>> p(kTensors, std::vector<float>(kLen, 0.0f));
      const std::vector<float> g(kLen, 1.0f);
      const bool device = path == Path::kDevice;
      for (int t = 0; t < kTensors; ++t) {
        TensorSpec spec{absl::StrCat("t", t), {kLen}, 16,
                        device ? Compression::kAdaComp : Compression::kDense};
        spec.device = device ? 0 : -1;
        ASSERT_TRUE((*w)->Declare(spec, absl::MakeSpan(p[t]))
                        .ok());
      }
      // Both workers run the same number of steps: rank 0 sets the last one, far enough
      // ahead of both, once every kill is 1 s behind.
      const int rank = (*w)->rank();
      for (int s = 0; s != last_step; ++s) {
        if (rank == 0 && killed_all && last_step < 0) last_step = s + 200;
        std::vector<std::future<absl::Status>> pending;
        for (int t = 0; t < kTensors; ++t) {
          const std::string name = absl::StrCat("t", t);
          pending.push_back(device ? (*w)->PushPullOnDevice(name, g.data(), p[t].data())
                                   : (*w)->PushPull(name, g, absl::MakeSpan(p[t])));
        }
        for (int t = 0; t < kTensors; ++t) {
          absl::Status st = pending[t].get();
          ASSERT_TRUE(st.ok()) << "rank " << rank << " step " << s << " tensor " << t << ": "
                               << st;
          seen[rank][t].push_back(p[t][0]);
        }
        if (rank == 0) stepping = true;
      }
      EXPECT_TRUE((*w)->Stop().ok());
    });
  }
  for (auto& t : workers) t.join();
  done = true;
  killer.join();
  *seen0 = seen[0];
  *seen1 = seen[1];
  for (auto& s : servers) absl::StrAppend(log, s->Log());
}

std::string Around(const std::vector<float>& v, size_t s) {
  std::string out;
  for (size_t k = s < 3 ? 0 : s - 3; k < std::min(v.size(), s + 4); ++k) {
    absl::StrAppend(&out, k == s ? "[" : "", v[k], k == s ? "] " : " ");
  }
  return out;
}

// Run with fusion buckets (the default), with one slice per tensor and on a device.
class Resume : public ::testing::TestWithParam<Path> {};

TEST_P(Resume, ServerKilledWithManyTensorsInFlightKeepsBothWorkersInStep) {
  Seen a, b;
  std::string log;
  TrainThroughKills(kKills, GetParam(), &a, &b, &log);
  ASSERT_FALSE(HasFailure()) << log;
  ASSERT_EQ(a.size(), static_cast<size_t>(kTensors));
  // Each kill may end one operation of a worker differently: the one whose step the old
  // server completed and answered for only the other worker. That worker saw the old
  // server's result; this one the restored parameters (the step it pushed is lost with
  // the old server). From the next operation on, both see the same again: in step.
  for (int t = 0; t < kTensors; ++t) {
    ASSERT_EQ(a[t].size(), b[t].size()) << "tensor " << t;
    int differing = 0;
    for (size_t s = 0; s < a[t].size(); ++s) {
      if (a[t][s] == b[t][s]) continue;
      ++differing;
      ASSERT_LT(s + 1, a[t].size());
      ASSERT_EQ(a[t][s + 1], b[t][s + 1])
          << "tensor " << t << " operation " << s << ": out of step, worker 0 saw "
          << Around(a[t], s) << ", worker 1 " << Around(b[t], s);
      EXPECT_EQ(std::min(a[t][s], b[t][s]) + 2.0f, a[t][s + 1])
          << "tensor " << t << " operation " << s << ": worker 0 saw " << Around(a[t], s)
          << ", worker 1 " << Around(b[t], s);
    }
    EXPECT_LE(differing, kKills) << "tensor " << t;
    // Every step adds both pushes once, but at a restart (the fall back to the checkpoint).
    int falls = 0;
    for (size_t s = 1; s < a[t].size(); ++s) {
      if (a[t][s] != a[t][s - 1] + 2.0f) ++falls;
    }
    EXPECT_LE(falls, kKills) << "tensor " << t;
  }
}

// Every server killed at once (one a few milliseconds after the other, so their slices
// are at different steps) and restarted with --checkpoint_every_steps: each restores the
// latest step checkpoint both servers have, so the tensor split over them is one step of
// the model again (every element equal), and training goes on from it.
TEST(ResumeAllServers, KilledAndRestartedResumeAtOneStepAcrossShards) {
  ClusterOptions options;
  options.num_servers = 0;
  options.num_workers = 2;
  // Servers report their step checkpoints in heartbeats: the scheduler knows them when the
  // servers die. 40 steps (~120 ms here) outlast a heartbeat (~100 ms): see docs/reliability.md.
  options.scheduler_args = {"--dead_timeout_ms=1000", "--num_servers=2", "--split_threshold=64",
                            "--heartbeat_ms=50", "--log_level=info"};
  LocalCluster cluster(options);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  const std::string ckpt = cluster.dir() + "/ckpt";
  ASSERT_EQ(::mkdir(ckpt.c_str(), 0755), 0);
  auto args = [&](int s) {
    return std::vector<std::string>{"--scheduler=" + cluster.scheduler_address(),
                                    "--optimizer=sum", absl::StrCat("--identity=s", s),
                                    "--checkpoint_dir=" + ckpt, "--checkpoint_every_steps=40",
                                    "--log_level=info"};
  };
  std::vector<std::unique_ptr<Process>> servers, restarted(2);
  for (int s = 0; s < 2; ++s) {
    servers.push_back(std::make_unique<Process>(ADAPS_SERVER_BIN, args(s),
                                                absl::StrCat(cluster.dir(), "/s", s, ".log")));
  }
  constexpr int kSteps = 600, kKillAt = 420;
  constexpr size_t kElements = 256;
  std::vector<std::vector<float>> seen(2);
  std::vector<std::thread> workers;
  for (int i = 0; i < 2; ++i) {
    workers.emplace_back([&, i] {
      auto w = Worker::Create(Options(cluster.scheduler_address()));
      ASSERT_TRUE(w.ok()) << w.status();
      std::vector<float> p(kElements, 0.0f), g(kElements, 1.0f);
      ASSERT_TRUE((*w)->Declare({"t", {kElements}, 16, Compression::kDense}, absl::MakeSpan(p)).ok());
      auto slices = (*w)->Slices("t");
      ASSERT_TRUE(slices.ok() && slices->size() == 2u);
      for (int s = 0; s < kSteps; ++s) {
        if ((*w)->rank() == 0 && s == kKillAt) {
          std::thread([&] {  // while the other worker is in its step
            servers[0]->Kill();
            absl::SleepFor(absl::Milliseconds(3));
            servers[1]->Kill();
            for (int k = 0; k < 2; ++k) {
              restarted[k] = std::make_unique<Process>(
                  ADAPS_SERVER_BIN, args(k), absl::StrCat(cluster.dir(), "/s", k, "-b.log"));
            }
          }).join();
        }
        absl::Status st = (*w)->PushPull("t", g, absl::MakeSpan(p)).get();
        ASSERT_TRUE(st.ok()) << "step " << s << ": " << st;
        for (size_t k = 1; k < kElements; ++k) {
          ASSERT_EQ(p[k], p[0]) << "step " << s << ": the slices are at different steps";
        }
        seen[(*w)->rank()].push_back(p[0]);
        absl::SleepFor(absl::Milliseconds(2));
      }
      EXPECT_TRUE((*w)->Stop().ok());
    });
  }
  for (auto& t : workers) t.join();
  ASSERT_TRUE(restarted[0] && restarted[1]);
  std::vector<int> steps;
  for (auto& r : restarted) {
    const std::string log = r->Log();
    const size_t at = log.find(".step-");
    ASSERT_NE(at, std::string::npos)
        << "no step checkpoint restored:\n" << log << "\nbefore:\n" << servers[0]->Log()
        << servers[1]->Log() << "\nscheduler:\n" << cluster.scheduler().Log();
    ASSERT_NE(log.find("restored 1 slices from step checkpoint"), std::string::npos) << log;
    steps.push_back(std::atoi(log.c_str() + at + 6));
  }
  EXPECT_EQ(steps[0], steps[1]);
  EXPECT_GT(steps[0], 0);
  EXPECT_EQ(steps[0] % 40, 0);
  // The first operation after the restore: the checkpoint's step plus this one.
  bool fell = false;
  for (size_t s = 1; s < seen[0].size(); ++s) {
    if (seen[0][s] == seen[0][s - 1] + 2.0f) continue;
    EXPECT_FALSE(fell) << "fell back twice";
    fell = true;
    EXPECT_EQ(seen[0][s], 2.0f * (steps[0] + 1)) << "operation " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Fusion, Resume,
                         ::testing::Values(Path::kFused, Path::kOneSlice, Path::kDevice),
                         [](const ::testing::TestParamInfo<Path>& info) {
                           return info.param == Path::kFused      ? "Fused"
                                  : info.param == Path::kOneSlice ? "OneSlicePerTensor"
                                                                  : "OnADevice";
                         });

}  // namespace
}  // namespace adaps
