// The pipelined worker (WorkerOptions::compression_threads) against an in-process cluster
// (a Scheduler, two Servers with the sum-only optimizer, one Worker::Impl) over inproc://:
// Run returns before the push is compressed, a NaN still fails its future and keeps every
// residue, the results are bit-identical to compressing on the caller's thread, and Stop
// with queued work returns.
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "adaps/worker.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "tests/worker/inproc_cluster.h"
#include "worker/worker_impl.h"

namespace adaps {
namespace {

constexpr int kServers = 2;

// One in-process cluster with one worker.
class Cluster {
 public:
  explicit Cluster(int compression_threads) : threads_(compression_threads) {}

  absl::Status Start() {
    testing::InprocServersOptions o;
    o.servers = kServers;
    o.split_threshold = 16;  // every tensor of 16 elements or more gets a slice per server
    if (auto s = cluster_.Start(o); !s.ok()) return s;
    WorkerOptions wo;
    wo.scheduler = testing::InprocServers::kScheduler;
    wo.context = cluster_.context();
    wo.request_timeout = absl::Seconds(5);
    wo.log_level = "warn";
    wo.compression_threads = threads_;
    worker_ = std::make_unique<Worker::Impl>(wo);
    absl::Status status = worker_->Init();
    if (auto s = cluster_.JoinServers(); !s.ok()) return s;
    return status;
  }

  ~Cluster() {
    if (worker_) {
      EXPECT_TRUE(worker_->Stop().ok());
      worker_.reset();
    }
  }

  Worker::Impl& worker() { return *worker_; }

  void Declare(const std::string& name, size_t n, Compression c, PullFormat pull) {
    std::vector<float> init(n, 0.0f);
    TensorSpec spec{name, {static_cast<int64_t>(n)}, 8, c, 0.25, pull};
    ASSERT_TRUE(worker_->Declare(spec, absl::MakeSpan(init)).ok());
  }

  // Blocks the pool's only thread until the returned notification is notified.
  std::shared_ptr<absl::Notification> BlockPool() {
    auto release = std::make_shared<absl::Notification>();
    auto started = std::make_shared<absl::Notification>();
    EXPECT_TRUE(worker_->pool_for_testing()->Post([release, started] {
      started->Notify();
      release->WaitForNotification();
    }));
    started->WaitForNotification();
    return release;
  }

 private:
  const int threads_;
  testing::InprocServers cluster_;  // waits for the scheduler and servers to end last
  std::unique_ptr<Worker::Impl> worker_;
};

bool IsReady(std::future<absl::Status>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

TEST(PipelinedWorker, PushPullReturnsBeforeTheGradientIsRead) {
  Cluster cluster(1);
  ASSERT_TRUE(cluster.Start().ok());
  cluster.Declare("t", 64, Compression::kDense, PullFormat::kDense);
  auto release = cluster.BlockPool();
  std::vector<float> g(64, 1.0f), out(64, -1.0f);
  auto future = cluster.worker().Run("t", g, absl::MakeSpan(out), true, true);
  // Nothing can complete while the pool is blocked: the push is not even encoded.
  EXPECT_EQ(future.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  // So the gradient is read after Run returned: what the buffer holds when the pool gets
  // to it is what gets pushed (the caller must not touch it; here it shows the pipeline).
  for (float& v : g) v = 2.0f;
  release->Notify();
  ASSERT_TRUE(future.get().ok());
  EXPECT_EQ(out, std::vector<float>(64, 2.0f));
}

TEST(PipelinedWorker, WithoutAPoolTheGradientIsReadBeforeRunReturns) {
  Cluster cluster(0);
  ASSERT_TRUE(cluster.Start().ok());
  ASSERT_EQ(cluster.worker().pool_for_testing(), nullptr);
  cluster.Declare("t", 64, Compression::kDense, PullFormat::kDense);
  std::vector<float> g(64, 1.0f), out(64);
  auto future = cluster.worker().Run("t", g, absl::MakeSpan(out), true, true);
  for (float& v : g) v = 2.0f;
  ASSERT_TRUE(future.get().ok());
  EXPECT_EQ(out, std::vector<float>(64, 1.0f));
}

TEST(PipelinedWorker, QueuedPushesOfManyTensorsCompleteInOrderAfterTheBlockedOne) {
  Cluster cluster(1);
  ASSERT_TRUE(cluster.Start().ok());
  constexpr int kTensors = 6;
  for (int k = 0; k < kTensors; ++k) {
    cluster.Declare("t" + std::to_string(k), 32, Compression::kAdaComp, PullFormat::kDense);
  }
  auto release = cluster.BlockPool();
  std::vector<std::vector<float>> g(kTensors), out(kTensors, std::vector<float>(32));
  std::vector<std::future<absl::Status>> futures;
  for (int k = 0; k < kTensors; ++k) {
    g[k].assign(32, static_cast<float>(k + 1));
    futures.push_back(cluster.worker().Run("t" + std::to_string(k), g[k],
                                           absl::MakeSpan(out[k]), true, true));
  }
  for (auto& f : futures) EXPECT_FALSE(IsReady(f));
  release->Notify();
  for (int k = 0; k < kTensors; ++k) {
    ASSERT_TRUE(futures[k].get().ok()) << k;
    // Equal values in a bin: AdaComp sends them all.
    EXPECT_EQ(out[k], g[k]) << k;
  }
}

// AdaComp, bins of 8, two slices: in slice 0 each bin holds [8, 1 x 7]: the 8 is sent and
// [0, 1 x 7] stays in the residue; a NaN anywhere must leave that residue alone.
TEST(PipelinedWorker, NanFailsItsFutureAndKeepsEveryResidue) {
  Cluster cluster(1);
  ASSERT_TRUE(cluster.Start().ok());
  cluster.Declare("t", 32, Compression::kAdaComp, PullFormat::kDense);
  auto slices = cluster.worker().Slices("t");
  ASSERT_TRUE(slices.ok());
  ASSERT_EQ(slices->size(), 2u);
  const uint32_t n0 = (*slices)[0].length;
  std::vector<float> g(32, 0.0f), out(32);
  for (uint32_t i = 0; i < n0; ++i) g[i] = i % 8 == 0 ? 8.0f : 1.0f;
  ASSERT_TRUE(cluster.worker().Run("t", g, absl::MakeSpan(out), true, true).get().ok());
  std::vector<float> bad(32, 0.0f);
  bad[31] = std::numeric_limits<float>::quiet_NaN();
  auto failed = cluster.worker().Run("t", bad, {}, true, false);
  EXPECT_EQ(failed.get().code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> zero(32, 0.0f);
  ASSERT_TRUE(cluster.worker().Run("t", zero, absl::MakeSpan(out), true, true).get().ok());
  for (uint32_t i = 0; i < n0; ++i) EXPECT_EQ(out[i], i % 8 == 0 ? 8.0f : 1.0f) << i;
}

// Many steps of AdaComp pushes and recompressed pulls over several tensors in flight at
// once; returns every tensor's parameters after each step.
std::vector<std::vector<float>> Train(int compression_threads) {
  Cluster cluster(compression_threads);
  EXPECT_TRUE(cluster.Start().ok());
  constexpr int kTensors = 5, kSteps = 30;
  const size_t kLen[kTensors] = {40, 200, 1000, 24, 4000};
  for (int k = 0; k < kTensors; ++k) {
    cluster.Declare("t" + std::to_string(k), kLen[k], Compression::kAdaComp,
                    k % 2 == 0 ? PullFormat::kRecompressed : PullFormat::kDense);
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<std::vector<float>> history;
  std::vector<std::vector<float>> g(kTensors), out(kTensors);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::future<absl::Status>> futures;
    for (int k = 0; k < kTensors; ++k) {
      g[k].resize(kLen[k]);
      out[k].resize(kLen[k]);
      for (float& v : g[k]) v = normal(rng);
      futures.push_back(cluster.worker().Run("t" + std::to_string(k), g[k],
                                             absl::MakeSpan(out[k]), true, true));
    }
    for (auto& f : futures) EXPECT_TRUE(f.get().ok()) << step;
    for (const auto& o : out) history.push_back(o);
  }
  return history;
}

TEST(PipelinedWorker, ResultsAreBitIdenticalToCompressingOnTheCallersThread) {
  const auto inline_result = Train(0);
  ASSERT_FALSE(inline_result.empty());
  for (int threads : {1, 2}) {
    const auto pooled = Train(threads);
    ASSERT_EQ(pooled.size(), inline_result.size());
    for (size_t k = 0; k < pooled.size(); ++k) {
      ASSERT_EQ(pooled[k].size(), inline_result[k].size());
      ASSERT_EQ(0, std::memcmp(pooled[k].data(), inline_result[k].data(),
                               pooled[k].size() * sizeof(float)))
          << "threads " << threads << ", entry " << k;
    }
  }
}

TEST(PipelinedWorker, StopWithQueuedWorkReturnsAndFailsIt) {
  Cluster cluster(1);
  ASSERT_TRUE(cluster.Start().ok());
  constexpr int kTensors = 4;
  for (int k = 0; k < kTensors; ++k) {
    cluster.Declare("t" + std::to_string(k), 32, Compression::kAdaComp, PullFormat::kDense);
  }
  auto release = cluster.BlockPool();
  std::vector<float> g(32, 1.0f);
  std::vector<std::vector<float>> out(kTensors, std::vector<float>(32));
  std::vector<std::future<absl::Status>> futures;
  for (int k = 0; k < kTensors; ++k) {
    futures.push_back(
        cluster.worker().Run("t" + std::to_string(k), g, absl::MakeSpan(out[k]), true, true));
  }
  std::thread stopper([&] { EXPECT_TRUE(cluster.worker().Stop().ok()); });
  // Once the worker says it stopped, let the pool go: the queued Runs fail, Stop returns.
  std::vector<float> probe(1);
  while (cluster.worker().Run("none", probe, {}, true, false).get().code() !=
         absl::StatusCode::kFailedPrecondition) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  release->Notify();
  stopper.join();
  for (auto& f : futures) {
    ASSERT_TRUE(IsReady(f));
    EXPECT_EQ(f.get().code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST(PipelinedWorker, ABadNumberOfThreadsIsInvalid) {
  for (int threads : {-1, 65}) {
    WorkerOptions wo;
    wo.scheduler = "inproc://nowhere";
    wo.compression_threads = threads;
    Worker::Impl impl(wo);
    EXPECT_EQ(impl.Init().code(), absl::StatusCode::kInvalidArgument) << threads;
  }
}

}  // namespace
}  // namespace adaps
