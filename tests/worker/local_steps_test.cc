// adaps::LocalSteps (a C++ trainer's exchange every H local steps) and its C API, against
// in-process clusters with mean servers: every replica becomes its anchor plus the outer
// step of the workers' mean change (the mean itself, or DiLoCo's Nesterov step), with
// AdaComp what is held back arrives later (nothing lost), and misuse is an error that
// changes nothing.
#include "adaps/local_steps.h"

#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "adaps/adaps_c.h"
#include "adaps/worker.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "tests/worker/inproc_cluster.h"

namespace adaps {
namespace {

// Runs `body(worker)` on `workers` threads against a fresh cluster of 2 servers.
void RunCluster(OptimizerKind kind, int workers, const std::function<void(Worker&)>& body) {
  testing::InprocServers cluster;
  testing::InprocServersOptions o;
  o.servers = 2;
  o.workers = workers;
  o.split_threshold = 3000;  // the long tensors span both servers
  o.optimizer.kind = kind;
  ASSERT_TRUE(cluster.Start(o).ok());
  std::vector<std::unique_ptr<Worker>> made(workers);
  std::vector<std::thread> threads;
  for (int i = 0; i < workers; ++i) {
    threads.emplace_back([&, i] {
      WorkerOptions wo;
      wo.scheduler = testing::InprocServers::kScheduler;
      wo.context = cluster.context();
      wo.request_timeout = absl::Seconds(60);
      wo.log_level = "error";
      auto w = Worker::Create(wo);
      ASSERT_TRUE(w.ok()) << w.status();
      made[i] = *std::move(w);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(cluster.JoinServers().ok());
  threads.clear();
  for (int i = 0; i < workers; ++i) {
    if (made[i] == nullptr) continue;
    threads.emplace_back([&, i] {
      body(*made[i]);
      EXPECT_TRUE(made[i]->Stop().ok());
    });
  }
  for (auto& t : threads) t.join();
}

// The change rank r's local steps make at exchange e, element i (exact in float).
float Change(int rank, int exchange, size_t i) {
  return 0.125f * static_cast<float>((rank + 1) * (exchange + 1)) *
         static_cast<float>(static_cast<int>(i % 7) - 3);
}

// Three exchanges of `spec` (5000 elements) by 2 workers whose local steps add
// change(rank, exchange, element): after each, every replica and anchor is the anchor
// before plus the mean change, bit for bit.
void ExpectAnchorPlusMeanChange(TensorSpec spec,
                                const std::function<float(int, int, size_t)>& change) {
  constexpr size_t kLength = 5000;
  spec.shape = {int64_t{kLength}};
  std::mutex mu;
  std::vector<std::vector<float>> finals(2);
  RunCluster(OptimizerKind::kMean, 2, [&](Worker& w) {
    auto steps = LocalSteps::Create(&w, {});
    ASSERT_TRUE(steps.ok()) << steps.status();
    std::vector<float> params(kLength, 1.0f + w.rank());  // rank 0's values win
    ASSERT_TRUE((*steps)->Declare(spec, absl::MakeSpan(params)).ok());
    std::vector<float> anchor(kLength, 1.0f);
    for (int e = 0; e < 3; ++e) {
      for (size_t i = 0; i < kLength; ++i) params[i] += change(w.rank(), e, i);
      ASSERT_TRUE((*steps)->Exchange("w", absl::MakeSpan(params)).get().ok());
      for (size_t i = 0; i < kLength; ++i) {
        anchor[i] += (change(0, e, i) + change(1, e, i)) / 2;
        ASSERT_EQ(params[i], anchor[i]) << "exchange " << e << " element " << i;
      }
      absl::StatusOr<absl::Span<const float>> a = (*steps)->Anchor("w");
      ASSERT_TRUE(a.ok());
      EXPECT_EQ(std::vector<float>(a->begin(), a->end()), params);
    }
    std::lock_guard<std::mutex> lock(mu);
    finals[w.rank()] = params;
  });
  EXPECT_EQ(finals[0], finals[1]);
}

TEST(LocalSteps, EveryReplicaBecomesTheAnchorPlusTheMeanChange) {
  ExpectAnchorPlusMeanChange({"w", {}, 500, Compression::kDense}, Change);
}

// With recompressed pulls the servers answer the running sum of the means added to the
// declared values (the model itself), not the step's mean: the anchor must follow it, not
// add it (the code before added the sum, the model doubled at the first exchange). Both
// ranks make the same change, of one magnitude everywhere, so the downlink at bin 1 carries
// the mean exactly.
TEST(LocalSteps, RecompressedPullsMoveTheAnchorByTheMeanChange) {
  TensorSpec spec{"w", {}, 500, Compression::kDense};
  spec.pull = PullFormat::kRecompressed;
  spec.pull_bin_divisor = 500;
  ExpectAnchorPlusMeanChange(spec, [](int, int e, size_t i) {
    return (i % 3 == 0 ? -0.25f : 0.25f) * static_cast<float>(e + 1);
  });
}

TEST(LocalSteps, NesterovOuterStepIsDiLoCos) {
  constexpr size_t kLength = 64;
  RunCluster(OptimizerKind::kMean, 2, [&](Worker& w) {
    LocalStepsOptions o;
    o.outer = LocalStepsOptions::Outer::kNesterov;
    o.outer_lr = 0.5f;
    o.outer_momentum = 0.75f;
    auto steps = LocalSteps::Create(&w, o);
    ASSERT_TRUE(steps.ok()) << steps.status();
    std::vector<float> params(kLength, 0.0f);
    ASSERT_TRUE((*steps)->Declare({"w", {int64_t{kLength}}, 500, Compression::kDense},
                                  absl::MakeSpan(params)).ok());
    std::vector<double> anchor(kLength, 0.0), b(kLength, 0.0);
    for (int e = 0; e < 3; ++e) {
      for (size_t i = 0; i < kLength; ++i) params[i] += Change(w.rank(), e, i);
      ASSERT_TRUE((*steps)->Exchange("w", absl::MakeSpan(params)).get().ok());
      for (size_t i = 0; i < kLength; ++i) {
        const double mean = (Change(0, e, i) + Change(1, e, i)) / 2.0;
        b[i] = 0.75 * b[i] + mean;
        anchor[i] += 0.5 * (mean + 0.75 * b[i]);
        ASSERT_NEAR(params[i], anchor[i], 1e-5) << "exchange " << e << " element " << i;
      }
    }
  });
}

// With AdaComp, what one exchange holds back goes in the residue and arrives later: after
// the last exchange the anchor has moved by the workers' mean change minus the mean of what
// their residues still hold, element by element.
TEST(LocalSteps, AdaCompHoldsBackChangesInTheResidueAndLosesNone) {
  constexpr size_t kLength = 6000;
  constexpr int kExchanges = 6;
  std::mutex mu;
  std::vector<std::vector<double>> sums(2), residues(2);
  std::vector<std::vector<float>> moved(2);
  RunCluster(OptimizerKind::kMean, 2, [&](Worker& w) {
    auto steps = LocalSteps::Create(&w, {});
    ASSERT_TRUE(steps.ok()) << steps.status();
    std::vector<float> params(kLength, 0.5f);
    ASSERT_TRUE((*steps)->Declare({"w", {int64_t{kLength}}, 50, Compression::kAdaComp},
                                  absl::MakeSpan(params)).ok());
    const std::vector<float> start = params;
    std::mt19937 rng(11 + w.rank());
    std::normal_distribution<float> normal(0.0f, 0.01f);
    std::vector<double> sum(kLength, 0.0);
    for (int e = 0; e < kExchanges; ++e) {
      for (size_t i = 0; i < kLength; ++i) {
        const float d = normal(rng);
        params[i] += d;
        sum[i] += d;
      }
      ASSERT_TRUE((*steps)->Exchange("w", absl::MakeSpan(params)).get().ok());
    }
    TrafficCounters t = *w.Traffic("w");
    EXPECT_LT(t.push_wire_bytes * 5, t.push_dense_bytes) << "AdaComp sent most of it";
    std::vector<float> residue(kLength);
    ASSERT_TRUE(w.Residue("w", absl::MakeSpan(residue)).ok());
    std::lock_guard<std::mutex> lock(mu);
    sums[w.rank()] = sum;
    residues[w.rank()].assign(residue.begin(), residue.end());
    moved[w.rank()].resize(kLength);
    for (size_t i = 0; i < kLength; ++i) moved[w.rank()][i] = params[i] - start[i];
  });
  ASSERT_EQ(moved[0], moved[1]);  // the replicas agree
  double worst = 0;
  for (size_t i = 0; i < kLength; ++i) {
    const double want = (sums[0][i] - residues[0][i] + sums[1][i] - residues[1][i]) / 2;
    worst = std::max(worst, std::fabs(moved[0][i] - want));
  }
  EXPECT_LT(worst, 1e-5);
}

TEST(LocalSteps, MisuseIsAnErrorThatChangesNothing) {
  RunCluster(OptimizerKind::kSgd, 1, [&](Worker& w) {
    auto steps = LocalSteps::Create(&w, {});
    ASSERT_EQ(steps.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StrContains(steps.status().message(), "--optimizer=mean"));
  });
  RunCluster(OptimizerKind::kMean, 1, [&](Worker& w) {
    LocalStepsOptions bad;
    bad.outer_momentum = 1.0f;
    EXPECT_EQ(LocalSteps::Create(&w, bad).status().code(), absl::StatusCode::kInvalidArgument);
    auto steps = LocalSteps::Create(&w, {});
    ASSERT_TRUE(steps.ok());
    std::vector<float> params(10, 2.0f);
    ASSERT_TRUE((*steps)->Declare({"w", {10}, 500, Compression::kDense},
                                  absl::MakeSpan(params)).ok());
    EXPECT_EQ((*steps)->Declare({"w", {10}, 500, Compression::kDense}, absl::MakeSpan(params))
                  .code(),
              absl::StatusCode::kInvalidArgument);
    std::vector<float> other(10, 3.0f);
    EXPECT_EQ((*steps)->Exchange("nope", absl::MakeSpan(other)).get().code(),
              absl::StatusCode::kNotFound);
    std::vector<float> short_params(9, 3.0f);
    EXPECT_EQ((*steps)->Exchange("w", absl::MakeSpan(short_params)).get().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(short_params, std::vector<float>(9, 3.0f));
    EXPECT_EQ(std::vector<float>((*steps)->Anchor("w")->begin(), (*steps)->Anchor("w")->end()),
              std::vector<float>(10, 2.0f));
  });
}

TEST(LocalSteps, TheCApiExchangesEveryHSteps) {
  SchedulerConfig sc;
  sc.log_level = "warn";
  Scheduler scheduler(sc);
  ASSERT_TRUE(scheduler.Start().ok());
  ServerConfig vc;
  vc.scheduler = scheduler.endpoint();
  vc.optimizer.kind = OptimizerKind::kMean;
  vc.log_level = "warn";
  Server server(vc);
  absl::Status server_status;
  std::thread start([&] { server_status = server.Start(); });
  char error[256] = {0};
  adaps_worker* w = adaps_worker_create(scheduler.endpoint().c_str(), 20000, error, sizeof(error));
  start.join();
  ASSERT_NE(w, nullptr) << error;
  ASSERT_TRUE(server_status.ok());
  std::vector<float> params = {1, 2, 3, 4};
  EXPECT_EQ(adaps_worker_exchange(w, "w", params.data(), 4), 9);  // before local_steps
  EXPECT_EQ(adaps_worker_local_steps(w, 2), 3);
  ASSERT_EQ(adaps_worker_local_steps(w, 0), 0) << adaps_worker_last_error(w);
  const int64_t shape[] = {4};
  adaps_tensor_spec spec{"w", shape, 1, 500, /*dense*/ 0, 0.01, /*dense pull*/ 0};
  ASSERT_EQ(adaps_worker_declare(w, &spec, params.data(), 4), 0) << adaps_worker_last_error(w);
  EXPECT_EQ(adaps_worker_local_steps(w, 0), 9);  // after a declaration
  for (float& p : params) p += 0.5f;  // this worker's local steps
  ASSERT_EQ(adaps_worker_exchange(w, "w", params.data(), 4), 0) << adaps_worker_last_error(w);
  EXPECT_EQ(params, (std::vector<float>{1.5f, 2.5f, 3.5f, 4.5f}));  // one worker: its change
  EXPECT_EQ(adaps_worker_exchange(w, "w", params.data(), 3), 3);
  adaps_worker_destroy(w);
}

}  // namespace
}  // namespace adaps
