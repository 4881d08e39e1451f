// Integration tests: the real adaps-scheduler and adaps-server executables on loopback with
// OS-assigned ports, and four workers (threads using the worker library, or adaps-worker
// processes).
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "adaps/worker.h"
#include "common/compressor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace adaps {
namespace {

using ::adaps::testing::ClusterOptions;
using ::adaps::testing::LocalCluster;
using ::adaps::testing::Process;

constexpr int kWorkers = 4;

WorkerOptions Options(const LocalCluster& cluster, absl::Duration request_timeout) {
  WorkerOptions o;
  o.scheduler = cluster.scheduler_address();
  o.register_timeout = absl::Seconds(20);
  o.request_timeout = request_timeout;
  o.log_level = "warn";
  return o;
}

// Runs `body(worker)` on kWorkers threads, each with its own Worker, then stops them.
void RunWorkers(const LocalCluster& cluster, absl::Duration request_timeout,
                const std::function<void(Worker&)>& body) {
  std::vector<std::thread> threads;
  for (int i = 0; i < kWorkers; ++i) {
    threads.emplace_back([&] {
      auto worker = Worker::Create(Options(cluster, request_timeout));
      ASSERT_TRUE(worker.ok()) << worker.status();
      body(**worker);
      EXPECT_TRUE((*worker)->Stop().ok());
    });
  }
  for (auto& t : threads) t.join();
}

void ExpectCleanExit(LocalCluster& cluster) {
  std::string why;
  EXPECT_TRUE(cluster.AllExitCleanly(absl::Seconds(10), &why)) << why;
}

// Dyadic values: every sum and product below is exact in float32.
float Grad(int rank, int step, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 3 + step * 5) % 16) - 8) / 8.0f;
}
float Init(size_t i) { return static_cast<float>(i % 5) * 0.25f; }

struct TensorCase {
  std::string name;
  size_t length;
};
const std::vector<TensorCase> kTensors = {{"conv", 3000}, {"fc", 20000}, {"bias", 10}};

ClusterOptions SgdCluster(const std::string& mode = "sync") {
  ClusterOptions c;
  c.scheduler_args = {"--split_threshold=5000"};  // "fc" is split over both servers
  c.server_args = {"--optimizer=sgd", "--learning_rate=0.5", "--mode=" + mode};
  return c;
}

TEST(Cluster, SyncDenseParametersEqualIndependentComputation) {
  LocalCluster cluster(SgdCluster());
  ASSERT_FALSE(cluster.scheduler_address().empty()) << cluster.scheduler().Log();
  constexpr int kSteps = 3;
  std::vector<std::vector<std::vector<float>>> results(kWorkers);
  RunWorkers(cluster, absl::Seconds(10), [&](Worker& w) {
    std::vector<std::vector<float>> params;
    for (const auto& t : kTensors) {
      TensorSpec spec{t.name, {static_cast<int64_t>(t.length)}, 50, Compression::kDense};
      std::vector<float> values(t.length);
      for (size_t i = 0; i < t.length; ++i) values[i] = w.rank() == 0 ? Init(i) : -1.0f;
      ASSERT_TRUE(w.Declare(spec, absl::MakeSpan(values)).ok());
      params.push_back(std::move(values));
    }
    if (w.rank() == 0) {
      auto slices = w.Slices("fc");
      ASSERT_TRUE(slices.ok());
      EXPECT_EQ(slices->size(), 2u);
    }
    for (int step = 0; step < kSteps; ++step) {
      std::vector<std::vector<float>> grads;
      std::vector<std::future<absl::Status>> futures;
      for (size_t k = 0; k < kTensors.size(); ++k) {
        std::vector<float> g(kTensors[k].length);
        for (size_t i = 0; i < g.size(); ++i) g[i] = Grad(w.rank(), step, i);
        grads.push_back(std::move(g));
      }
      for (size_t k = 0; k < kTensors.size(); ++k) {
        futures.push_back(w.PushPull(kTensors[k].name, grads[k], absl::MakeSpan(params[k])));
      }
      for (auto& f : futures) ASSERT_TRUE(f.get().ok());
    }
    auto traffic = w.Traffic("fc");
    ASSERT_TRUE(traffic.ok());
    EXPECT_EQ(traffic->pushes, uint64_t{kSteps});
    EXPECT_EQ(traffic->push_dense_bytes, uint64_t{kSteps} * 20000 * 4);
    EXPECT_GT(traffic->push_wire_bytes, traffic->push_dense_bytes);  // headers counted
    results[w.rank()] = std::move(params);
  });
  for (size_t k = 0; k < kTensors.size(); ++k) {
    std::vector<float> expected(kTensors[k].length);
    for (size_t i = 0; i < expected.size(); ++i) {
      float p = Init(i);
      for (int step = 0; step < kSteps; ++step) {
        float sum = 0;
        for (int r = 0; r < kWorkers; ++r) sum += Grad(r, step, i);
        p -= 0.5f * (sum * 0.25f);
      }
      expected[i] = p;
    }
    for (int r = 0; r < kWorkers; ++r) {
      ASSERT_EQ(results[r].size(), kTensors.size());
      EXPECT_EQ(results[r][k], expected) << kTensors[k].name << " on worker " << r;
    }
  }
  ExpectCleanExit(cluster);
}

TEST(Cluster, SyncAdaCompEqualsApplyingTheDecodedUpdates) {
  LocalCluster cluster(SgdCluster());
  ASSERT_FALSE(cluster.scheduler_address().empty());
  constexpr int kSteps = 4;
  constexpr size_t kLen = 20000;
  constexpr uint32_t kBin = 50;
  std::vector<std::vector<float>> results(kWorkers);
  std::vector<SliceInfo> slices;
  auto grad = [](int rank, int step, size_t i) {
    return std::sin(0.001f * static_cast<float>(i * (rank + 1)) + step) * 0.01f;
  };
  RunWorkers(cluster, absl::Seconds(10), [&](Worker& w) {
    TensorSpec spec{"fc", {static_cast<int64_t>(kLen)}, kBin, Compression::kAdaComp};
    std::vector<float> params(kLen);
    for (size_t i = 0; i < kLen; ++i) params[i] = Init(i);
    ASSERT_TRUE(w.Declare(spec, absl::MakeSpan(params)).ok());
    if (w.rank() == 0) slices = *w.Slices("fc");
    for (int step = 0; step < kSteps; ++step) {
      std::vector<float> g(kLen);
      for (size_t i = 0; i < kLen; ++i) g[i] = grad(w.rank(), step, i);
      ASSERT_TRUE(w.PushPull("fc", g, absl::MakeSpan(params)).get().ok());
    }
    auto traffic = w.Traffic("fc");
    ASSERT_TRUE(traffic.ok());
    EXPECT_LT(traffic->push_wire_bytes * 5, traffic->push_dense_bytes);  // compressed
    results[w.rank()] = std::move(params);
  });
  ASSERT_EQ(slices.size(), 2u);
  // Independently: each worker's residues and compressor per slice, decoded and averaged.
  std::vector<float> expected(kLen);
  for (size_t i = 0; i < kLen; ++i) expected[i] = Init(i);
  CompressorOptions copts;
  copts.kind = CompressorKind::kAdaComp;
  copts.bin_size = kBin;
  auto compressor = *MakeCompressor(copts);
  std::vector<std::vector<SliceState>> residues(kWorkers);
  for (int r = 0; r < kWorkers; ++r) {
    for (const auto& s : slices) residues[r].emplace_back(s.length);
  }
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> sum(kLen, 0.0f);
    for (int r = 0; r < kWorkers; ++r) {
      std::vector<float> g(kLen);
      for (size_t i = 0; i < kLen; ++i) g[i] = grad(r, step, i);
      for (size_t s = 0; s < slices.size(); ++s) {
        CompressedUpdate u;
        ASSERT_TRUE(compressor
                        ->Compress(absl::MakeConstSpan(g).subspan(slices[s].offset,
                                                                  slices[s].length),
                                   residues[r][s], u)
                        .ok());
        ASSERT_TRUE(DecompressAdd(u, 1.0f,
                                  absl::MakeSpan(sum).subspan(slices[s].offset, slices[s].length))
                        .ok());
      }
    }
    for (size_t i = 0; i < kLen; ++i) expected[i] -= 0.5f * (sum[i] * 0.25f);
  }
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_EQ(results[r].size(), kLen);
    EXPECT_EQ(results[r], results[0]) << "worker " << r << " differs from worker 0";
    for (size_t i = 0; i < kLen; ++i) {
      ASSERT_NEAR(results[r][i], expected[i], 1e-6f + 1e-6f * std::abs(expected[i]))
          << "element " << i;
    }
  }
  ExpectCleanExit(cluster);
}

TEST(Cluster, AsyncSumsEveryPushExactlyOnce) {
  ClusterOptions c;
  c.server_args = {"--mode=async", "--optimizer=sum"};
  c.scheduler_args = {"--split_threshold=1000"};
  LocalCluster cluster(c);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  constexpr int kSteps = 5;
  constexpr size_t kLen = 4000;
  std::vector<std::vector<float>> results(kWorkers);
  RunWorkers(cluster, absl::Seconds(10), [&](Worker& w) {
    TensorSpec spec{"t", {static_cast<int64_t>(kLen)}, 100, Compression::kDense};
    std::vector<float> params(kLen);
    for (size_t i = 0; i < kLen; ++i) params[i] = Init(i);
    ASSERT_TRUE(w.Declare(spec, absl::MakeSpan(params)).ok());
    std::vector<float> out(kLen);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<float> g(kLen);
      for (size_t i = 0; i < kLen; ++i) g[i] = Grad(w.rank(), step, i);
      ASSERT_TRUE(w.PushPull("t", g, absl::MakeSpan(out)).get().ok());
    }
    ASSERT_TRUE(w.Barrier().ok());
    ASSERT_TRUE(w.Pull("t", absl::MakeSpan(out)).get().ok());
    results[w.rank()] = out;
  });
  std::vector<float> expected(kLen);
  for (size_t i = 0; i < kLen; ++i) {
    float p = Init(i);
    for (int r = 0; r < kWorkers; ++r) {
      for (int step = 0; step < kSteps; ++step) p += Grad(r, step, i);
    }
    expected[i] = p;
  }
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(results[r], expected) << "worker " << r;
  ExpectCleanExit(cluster);
}

TEST(Cluster, RecompressedPullsKeepEveryReplicaBitwiseIdentical) {
  LocalCluster cluster(SgdCluster());
  ASSERT_FALSE(cluster.scheduler_address().empty());
  constexpr int kSteps = 6;
  constexpr size_t kLen = 12000;
  std::vector<std::vector<float>> results(kWorkers);
  std::vector<uint64_t> pull_wire(kWorkers);
  RunWorkers(cluster, absl::Seconds(10), [&](Worker& w) {
    TensorSpec spec{"fc", {static_cast<int64_t>(kLen)}, 50, Compression::kAdaComp,
                    0.001, PullFormat::kRecompressed};
    std::vector<float> params(kLen);
    for (size_t i = 0; i < kLen; ++i) params[i] = Init(i);
    ASSERT_TRUE(w.Declare(spec, absl::MakeSpan(params)).ok());
    for (int step = 0; step < kSteps; ++step) {
      std::vector<float> g(kLen);
      for (size_t i = 0; i < kLen; ++i) {
        g[i] = std::cos(0.01f * static_cast<float>(i) * (w.rank() + 1) + step) * 0.1f;
      }
      ASSERT_TRUE(w.PushPull("fc", g, absl::MakeSpan(params)).get().ok());
    }
    pull_wire[w.rank()] = w.Traffic("fc")->pull_wire_bytes;
    results[w.rank()] = std::move(params);
  });
  std::vector<float> init(kLen);
  for (size_t i = 0; i < kLen; ++i) init[i] = Init(i);
  EXPECT_NE(results[0], init) << "the parameters never moved";
  for (int r = 1; r < kWorkers; ++r) {
    ASSERT_EQ(results[r].size(), kLen);
    EXPECT_EQ(0, std::memcmp(results[r].data(), results[0].data(), kLen * sizeof(float)))
        << "replica of worker " << r << " differs";
  }
  EXPECT_LT(pull_wire[0] * 4, uint64_t{kSteps} * kLen * 4) << "pulls were not compressed";
  ExpectCleanExit(cluster);
}

TEST(Cluster, UndeclaredTensorAndWrongLengthGiveClearErrorsAndChangeNothing) {
  LocalCluster cluster(SgdCluster());
  ASSERT_FALSE(cluster.scheduler_address().empty());
  constexpr size_t kLen = 3000;
  std::vector<std::vector<float>> results(kWorkers);
  RunWorkers(cluster, absl::Seconds(10), [&](Worker& w) {
    TensorSpec spec{"t", {static_cast<int64_t>(kLen)}, 50, Compression::kDense};
    std::vector<float> params(kLen);
    for (size_t i = 0; i < kLen; ++i) params[i] = Init(i);
    ASSERT_TRUE(w.Declare(spec, absl::MakeSpan(params)).ok());
    std::vector<float> big(kLen + 1, 1.0f);
    absl::Status undeclared = w.Push("nope", big).get();
    EXPECT_EQ(undeclared.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(undeclared.message()), ::testing::HasSubstr("not declared"));
    absl::Status wrong = w.PushPull("t", big, absl::MakeSpan(big)).get();
    EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(wrong.message()), ::testing::HasSubstr("3000 elements"));
    // Re-declaring with another length is refused by the scheduler.
    TensorSpec other{"t2", {10}, 50, Compression::kDense};
    std::vector<float> ten(10);
    EXPECT_TRUE(w.Declare(other, absl::MakeSpan(ten)).ok());
    ASSERT_TRUE(w.Barrier().ok());
    std::vector<float> g(kLen);
    for (size_t i = 0; i < kLen; ++i) g[i] = Grad(w.rank(), 0, i);
    ASSERT_TRUE(w.PushPull("t", g, absl::MakeSpan(params)).get().ok());
    results[w.rank()] = std::move(params);
  });
  std::vector<float> expected(kLen);
  for (size_t i = 0; i < kLen; ++i) {
    float sum = 0;
    for (int r = 0; r < kWorkers; ++r) sum += Grad(r, 0, i);
    expected[i] = Init(i) - 0.5f * (sum * 0.25f);
  }
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(results[r], expected) << "worker " << r;
  ExpectCleanExit(cluster);
}

TEST(Cluster, MissingWorkerInSyncModeGivesDeadlineErrorNotAHang) {
  LocalCluster cluster(SgdCluster());
  ASSERT_FALSE(cluster.scheduler_address().empty());
  constexpr size_t kLen = 1000;
  std::atomic<int> deadline_errors{0};
  RunWorkers(cluster, absl::Milliseconds(1500), [&](Worker& w) {
    TensorSpec spec{"t", {static_cast<int64_t>(kLen)}, 50, Compression::kAdaComp};
    std::vector<float> params(kLen, 0.0f);
    ASSERT_TRUE(w.Declare(spec, absl::MakeSpan(params)).ok());
    if (w.rank() == kWorkers - 1) {
      absl::SleepFor(absl::Seconds(2));  // alive (heartbeats) but never pushes
      return;
    }
    std::vector<float> g(kLen, 0.5f);
    const absl::Time start = absl::Now();
    absl::Status s = w.PushPull("t", g, absl::MakeSpan(params)).get();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(4));
    if (s.code() == absl::StatusCode::kDeadlineExceeded) ++deadline_errors;
  });
  EXPECT_EQ(deadline_errors.load(), kWorkers - 1);
  ExpectCleanExit(cluster);
}

TEST(Cluster, WorkerProcessesRunSyntheticModeAndShutDownCleanly) {
  LocalCluster cluster(SgdCluster());
  ASSERT_FALSE(cluster.scheduler_address().empty());
  std::vector<std::unique_ptr<Process>> workers;
  for (int i = 0; i < kWorkers; ++i) {
    workers.push_back(std::make_unique<Process>(
        ADAPS_WORKER_BIN,
        std::vector<std::string>{"--scheduler=" + cluster.scheduler_address(), "--tensors=200K",
                                 "--layers=3", "--steps=3", "--warmup=1",
                                 i % 2 ? "--compressor=topk" : "--compressor=topk",
                                 "--log_level=warn"},
        absl::StrCat(cluster.dir(), "/worker", i, ".log")));
  }
  bool summary = false;
  for (auto& w : workers) {
    EXPECT_EQ(w->WaitExit(absl::Seconds(30)), 0) << w->Log();
    summary = summary || w->Log().find("SUMMARY compressor=topk") != std::string::npos;
  }
  EXPECT_TRUE(summary);
  ExpectCleanExit(cluster);
}

TEST(Cluster, SilentWorkerIsDeclaredDeadAndTheOthersCarryOn) {
  ClusterOptions c = SgdCluster();
  c.scheduler_args.push_back("--dead_timeout_ms=1500");
  LocalCluster cluster(c);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  // One adaps-worker process (synthetic mode: two dense layers of 2000, endless steps) and
  // three library workers doing the same declarations; the process is killed mid-run.
  Process victim(ADAPS_WORKER_BIN,
                 {"--scheduler=" + cluster.scheduler_address(), "--tensors=4000", "--layers=2",
                  "--steps=1000000", "--warmup=0", "--compressor=dense", "--log_level=warn"},
                 cluster.dir() + "/victim.log");
  std::once_flag kill_once;
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWorkers - 1; ++i) {
    threads.emplace_back([&] {
      auto worker = Worker::Create(Options(cluster, absl::Seconds(8)));
      ASSERT_TRUE(worker.ok()) << worker.status();
      Worker& w = **worker;
      std::vector<std::vector<float>> params(2, std::vector<float>(2000));
      for (int l = 0; l < 2; ++l) {
        TensorSpec spec{absl::StrCat("layer", l), {2000}, 500, Compression::kDense};
        ASSERT_TRUE(w.Declare(spec, absl::MakeSpan(params[l])).ok());
      }
      ASSERT_TRUE(w.Barrier().ok());
      std::vector<float> g(2000, 0.25f);
      for (int step = 0; step < 12; ++step) {
        if (step == 5) std::call_once(kill_once, [&] { victim.Kill(); });
        auto f0 = w.PushPull("layer0", g, absl::MakeSpan(params[0]));
        auto f1 = w.PushPull("layer1", g, absl::MakeSpan(params[1]));
        absl::Status s0 = f0.get(), s1 = f1.get();
        ASSERT_TRUE(s0.ok() && s1.ok()) << "step " << step << ": " << s0 << " / " << s1;
      }
      ++finished;
      EXPECT_TRUE(w.Stop().ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(finished.load(), kWorkers - 1);
  // The job ended without the silent worker: not completed, so exit 1 (the exit codes
  // say whether the job completed; docs/operations.md).
  EXPECT_EQ(cluster.scheduler().WaitExit(absl::Seconds(10)), 1) << cluster.scheduler().Log();
  EXPECT_EQ(cluster.server(0).WaitExit(absl::Seconds(10)), 1) << cluster.server(0).Log();
  EXPECT_THAT(cluster.scheduler().Log(), ::testing::HasSubstr("declared dead"));
}

TEST(Cluster, DeadServerGivesUnavailableToWorkers) {
  ClusterOptions c = SgdCluster();
  c.scheduler_args.push_back("--dead_timeout_ms=1000");
  LocalCluster cluster(c);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  std::atomic<int> unavailable{0};
  std::once_flag kill_once;
  RunWorkers(cluster, absl::Seconds(20), [&](Worker& w) {
    TensorSpec spec{"fc", {20000}, 50, Compression::kAdaComp};
    std::vector<float> params(20000, 0.0f), g(20000, 0.1f);
    ASSERT_TRUE(w.Declare(spec, absl::MakeSpan(params)).ok());
    ASSERT_TRUE(w.PushPull("fc", g, absl::MakeSpan(params)).get().ok());
    ASSERT_TRUE(w.Barrier().ok());
    std::call_once(kill_once, [&] { cluster.server(1).Kill(); });
    const absl::Time start = absl::Now();
    absl::Status s = w.PushPull("fc", g, absl::MakeSpan(params)).get();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "waited for the request deadline";
    if (s.code() == absl::StatusCode::kUnavailable) ++unavailable;
  });
  EXPECT_EQ(unavailable.load(), kWorkers);
  // Server 1 is still dead when the workers leave: the job did not complete, exit 1.
  EXPECT_EQ(cluster.scheduler().WaitExit(absl::Seconds(10)), 1) << cluster.scheduler().Log();
  EXPECT_EQ(cluster.server(0).WaitExit(absl::Seconds(10)), 1) << cluster.server(0).Log();
}

TEST(Executables, FatalErrorsExitNonZeroWithOneLineReason) {
  const std::string dir = adaps::testing::MakeTempDir();
  {
    Process p(ADAPS_SCHEDULER_BIN, {"--no_such_flag=1"}, dir + "/badflag.log");
    EXPECT_NE(p.WaitExit(absl::Seconds(10)), 0);
    EXPECT_THAT(p.Log(), ::testing::HasSubstr("no_such_flag"));
  }
  {
    Process first(ADAPS_SCHEDULER_BIN, {"--port_file=" + dir + "/port", "--log_level=warn"},
                  dir + "/first.log");
    const std::string port = adaps::testing::WaitForPortFile(dir + "/port", absl::Seconds(10));
    ASSERT_FALSE(port.empty());
    Process second(ADAPS_SCHEDULER_BIN, {"--port=" + port}, dir + "/second.log");
    EXPECT_EQ(second.WaitExit(absl::Seconds(10)), 1);
    EXPECT_THAT(second.Log(), ::testing::HasSubstr("address in use"));
  }
  {
    Process server(ADAPS_SERVER_BIN,
                   {"--scheduler=tcp://127.0.0.1:1", "--register_timeout_ms=500"},
                   dir + "/unreachable.log");
    EXPECT_EQ(server.WaitExit(absl::Seconds(10)), 1);
    EXPECT_THAT(server.Log(), ::testing::HasSubstr("adaps-server: UNAVAILABLE"));
  }
  {
    Process worker(ADAPS_WORKER_BIN,
                   {"--scheduler=tcp://127.0.0.1:1", "--register_timeout_ms=500"},
                   dir + "/worker.log");
    EXPECT_EQ(worker.WaitExit(absl::Seconds(10)), 1);
    EXPECT_THAT(worker.Log(), ::testing::HasSubstr("adaps-worker: UNAVAILABLE"));
  }
  {
    setenv("ADAPS_NUM_SERVERS", "0", 1);
    Process p(ADAPS_SCHEDULER_BIN, {}, dir + "/env.log");
    unsetenv("ADAPS_NUM_SERVERS");
    EXPECT_EQ(p.WaitExit(absl::Seconds(10)), 2);  // a usage error
    EXPECT_THAT(p.Log(), ::testing::HasSubstr("--num_servers=0: must be > 0"));
  }
}

TEST(Executables, ConfigFileThenEnvironmentThenFlagsTakePrecedence) {
  const std::string dir = adaps::testing::MakeTempDir();
  {
    std::ofstream cfg(dir + "/sched.conf");
    cfg << "# scheduler settings\nnum_servers = 0\nlog_level = warn\n";
  }
  {  // file alone: its bad value is used
    Process p(ADAPS_SCHEDULER_BIN, {"--config=" + dir + "/sched.conf"}, dir + "/file.log");
    EXPECT_EQ(p.WaitExit(absl::Seconds(10)), 2);  // a usage error
    EXPECT_THAT(p.Log(), ::testing::HasSubstr("--num_servers=0: must be > 0"));
  }
  {  // the environment beats the file: starts and writes its port
    setenv("ADAPS_NUM_SERVERS", "2", 1);
    Process p(ADAPS_SCHEDULER_BIN,
              {"--config=" + dir + "/sched.conf", "--port_file=" + dir + "/port"},
              dir + "/env.log");
    unsetenv("ADAPS_NUM_SERVERS");
    EXPECT_FALSE(adaps::testing::WaitForPortFile(dir + "/port", absl::Seconds(10)).empty())
        << p.Log();
    p.Kill();
  }
  {  // a flag beats the environment
    setenv("ADAPS_NUM_SERVERS", "2", 1);
    Process p(ADAPS_SCHEDULER_BIN, {"--config=" + dir + "/sched.conf", "--num_servers=0"},
              dir + "/flag.log");
    unsetenv("ADAPS_NUM_SERVERS");
    EXPECT_EQ(p.WaitExit(absl::Seconds(10)), 2);
  }
  {  // an unknown setting in the file is a clear error
    std::ofstream cfg(dir + "/bad.conf");
    cfg << "no_such_setting = 1\n";
    cfg.close();
    Process p(ADAPS_SCHEDULER_BIN, {"--config=" + dir + "/bad.conf"}, dir + "/bad.log");
    EXPECT_EQ(p.WaitExit(absl::Seconds(10)), 2);
    EXPECT_THAT(p.Log(), ::testing::HasSubstr("unknown setting 'no_such_setting'"));
  }
}

}  // namespace
}  // namespace adaps
