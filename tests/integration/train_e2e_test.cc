// End to end through real processes: adaps-scheduler, one adaps-server and two adaps-worker
// processes train the Fashion-MNIST MLP on a subset of the data for a bounded number of
// steps. With AdaComp the test accuracy must reach 0.80 while the fully-connected layers
// send at least 100x fewer bytes than dense; the same run with dense must reach the same
// accuracy within tolerance.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace adaps::testing {
namespace {

constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";

struct TrainResult {
  bool ok = false;
  double test_acc = 0.0;
  double fc_rate = 0.0;
  std::string log;
};

// The main command's recipe (deploy/run-local.sh, docs/accuracy.md): momentum on the
// workers, plain SGD and recompressed pulls at bin size 100 on the servers.
const std::vector<std::string> kRecipeServer = {"--optimizer=sgd", "--pull_bin_size=100"};
const std::vector<std::string> kRecipeWorker = {"--pull=recompressed", "--local_momentum=0.9",
                                                "--compress_bias", "--bin_size_bias=100"};

// With `kill_server`, the server runs with an identity and timed checkpoints, and once it
// checkpointed the model it is killed (SIGKILL) and started again with the same flags.
// `server_args` replace the servers' optimizer flags; `worker_args` go after the workers'.
TrainResult Train(const std::string& compressor, bool kill_server = false,
                  std::vector<std::string> server_args = {"--optimizer=momentum",
                                                          "--momentum=0.9"},
                  const std::vector<std::string>& worker_args = {}) {
  TrainResult result;
  ClusterOptions options;
  options.num_servers = 1;
  options.num_workers = 2;
  options.server_args = std::move(server_args);
  const std::string ckpt = MakeTempDir();
  if (kill_server) {
    options.server_args.insert(options.server_args.end(),
                               {"--identity=s0", "--checkpoint_dir=" + ckpt,
                                "--checkpoint_interval_s=1", "--log_level=info"});
    // Over the harness's 3 s: the workers are stopped while the server checkpoints (below).
    options.scheduler_args = {"--dead_timeout_ms=30000"};
  }
  LocalCluster cluster(options);
  if (cluster.scheduler_address().empty()) {
    result.log = "scheduler did not start: " + cluster.scheduler().Log();
    return result;
  }
  std::vector<std::unique_ptr<Process>> workers;
  for (int w = 0; w < 2; ++w) {
    std::vector<std::string> args = {"--scheduler=" + cluster.scheduler_address(), "--mode=train",
                                     "--model=mlp", "--compressor=" + compressor,
                                     "--train_limit=16000", "--epochs=2", "--batch=32",
                                     "--lr=0.05", "--log_level=warn",
                                     absl::StrCat("--data_dir=", kDataDir)};
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    workers.push_back(std::make_unique<Process>(
        ADAPS_WORKER_BIN, args, absl::StrCat(cluster.dir(), "/worker", w, ".log")));
  }
  std::unique_ptr<Process> restarted;
  if (kill_server) {
    // The kill must come after a checkpoint that holds the model. The training takes a few
    // seconds and a checkpoint's fsync can take longer on a loaded disk, so the two are not
    // raced: once training is under way (a worker reports progress, every tensor is
    // declared) the workers are stopped, the now idle server writes its timed checkpoint of
    // the model (6 tensors; 2 slices with fusion of small tensors, the default: fc1.weight
    // and one bucket; 3 with a 64 KiB threshold), and the
    // workers go on as the server is killed.
    const std::regex progress(R"(step [0-9]+/[0-9]+ )");
    const std::regex model_checkpoint("checkpoint of (6|3|2) slices");
    const auto count = [](const std::string& log, const std::regex& re) {
      return std::distance(std::sregex_iterator(log.begin(), log.end(), re),
                           std::sregex_iterator());
    };
    // (Only the worker of rank 0, either process, reports progress.)
    const auto progressed = [&] {
      return count(workers[0]->Log(), progress) + count(workers[1]->Log(), progress) > 0;
    };
    // (Minutes: at load 40 the workers loaded the data set and declared after about 60 s.)
    absl::Time end = absl::Now() + absl::Minutes(5);
    while (!progressed() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(20));
    if (!progressed()) {
      result.log = "no progress from the workers within 5 minutes\n" + workers[0]->Log() +
                   workers[1]->Log();
      return result;
    }
    for (auto& w : workers) w->Signal(SIGSTOP);
    const auto before = count(cluster.server(0).Log(), model_checkpoint);
    end = absl::Now() + absl::Seconds(20);  // the scheduler's dead timeout is 30 s here
    while (count(cluster.server(0).Log(), model_checkpoint) == before && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    for (auto& w : workers) w->Signal(SIGCONT);
    if (count(cluster.server(0).Log(), model_checkpoint) == before) {
      result.log = "no checkpoint of the model within 20 s of stopping the workers\n" +
                   cluster.server(0).Log();
      return result;
    }
    cluster.server(0).Kill();
    std::vector<std::string> args = {"--scheduler=" + cluster.scheduler_address(),
                                     "--register_timeout_ms=20000"};
    args.insert(args.end(), options.server_args.begin(), options.server_args.end());
    restarted = std::make_unique<Process>(ADAPS_SERVER_BIN, args, cluster.dir() + "/s-b.log");
  }
  bool all_ok = true;
  for (auto& w : workers) {
    // A hang's deadline: a run took over 240 s at load 40 (163 s of training), ~10 s idle.
    const int code = w->WaitExit(absl::Minutes(10));
    if (code != 0) all_ok = false;
    if (code != 0) absl::StrAppend(&result.log, "worker exit ", code, "\n");
  }
  for (auto& w : workers) result.log += w->Log();
  if (restarted) {
    const std::string log = restarted->Log();
    result.log += log;
    if (log.find("restored at step") == std::string::npos) all_ok = false;
  }
  const std::regex final_line(R"(final: .* test_acc ([0-9.]+) .* rate: fc ([0-9.]+)x)");
  std::smatch m;
  if (all_ok && std::regex_search(result.log, m, final_line)) {
    result.ok = true;
    result.test_acc = std::stod(m[1]);
    result.fc_rate = std::stod(m[2]);
  }
  return result;
}

class TrainEndToEnd : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(kDataDir))) {
      GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
    }
  }
};

TEST_F(TrainEndToEnd, AdaCompReachesAccuracyWithHundredfoldLessTrafficAndMatchesDense) {
  const TrainResult ada = Train("adacomp");
  ASSERT_TRUE(ada.ok) << ada.log;
  EXPECT_GE(ada.test_acc, 0.80) << ada.log;
  EXPECT_GE(ada.fc_rate, 100.0) << "fully-connected layers were not compressed enough\n"
                                << ada.log;

  const TrainResult dense = Train("dense");
  ASSERT_TRUE(dense.ok) << dense.log;
  EXPECT_LT(dense.fc_rate, 1.5) << "dense must send every element";
  EXPECT_NEAR(ada.test_acc, dense.test_acc, 0.03)
      << "AdaComp " << ada.test_acc << " vs dense " << dense.test_acc;
  RecordProperty("adacomp_test_acc", std::to_string(ada.test_acc));
  RecordProperty("dense_test_acc", std::to_string(dense.test_acc));
  RecordProperty("adacomp_fc_rate", std::to_string(ada.fc_rate));
}

// The same run with the main command's recipe: pushes of the workers' velocity to SGD
// servers train as well as the servers' momentum on dense pushes.
TEST_F(TrainEndToEnd, MainCommandRecipeReachesDenseAccuracyWithHundredfoldLessTraffic) {
  const TrainResult recipe = Train("adacomp", false, kRecipeServer, kRecipeWorker);
  ASSERT_TRUE(recipe.ok) << recipe.log;
  EXPECT_GE(recipe.fc_rate, 100.0) << recipe.log;
  const TrainResult dense = Train("dense");
  ASSERT_TRUE(dense.ok) << dense.log;
  // Measured: recipe 0.851, dense 0.849; with the velocity not pushed (plain SGD on the
  // servers) 0.834.
  EXPECT_GE(recipe.test_acc, dense.test_acc - 0.01)
      << "recipe " << recipe.test_acc << " vs dense " << dense.test_acc << "\n" << recipe.log;
  RecordProperty("recipe_test_acc", std::to_string(recipe.test_acc));
  RecordProperty("dense_test_acc", std::to_string(dense.test_acc));
}

// --max_steps stops at that step even mid-epoch (it ran whole epochs: 2 x 250 = 500 steps
// for --max_steps=300 here), and rank 0's last evaluation is at that step.
TEST_F(TrainEndToEnd, MaxStepsStopsAtThatStepMidEpoch) {
  const TrainResult run =
      Train("adacomp", false, kRecipeServer, {"--max_steps=300", "--eval_every=50"});
  ASSERT_TRUE(run.ok) << run.log;
  const std::regex eval_line(R"(step ([0-9]+)  test_acc)");
  int last = 0;
  for (auto it = std::sregex_iterator(run.log.begin(), run.log.end(), eval_line);
       it != std::sregex_iterator(); ++it) {
    last = std::max(last, std::stoi((*it)[1]));
  }
  EXPECT_EQ(last, 300) << run.log;
  EXPECT_NE(run.log.find("epoch 2/2"), std::string::npos) << run.log;
}

// Fusion of small tensors (the default: fc3.weight and the biases travel as one bucket)
// changes the messages, not the math: the run ends with the same accuracy as without it.
TEST_F(TrainEndToEnd, FusionOnAndOffEndWithTheSameAccuracy) {
  const TrainResult fused = Train("adacomp");
  ASSERT_TRUE(fused.ok) << fused.log;
  const TrainResult unfused = Train("adacomp", false, {"--optimizer=momentum", "--momentum=0.9"},
                                       {"--fusion_threshold=0"});
  ASSERT_TRUE(unfused.ok) << unfused.log;
  EXPECT_EQ(fused.test_acc, unfused.test_acc) << fused.log << unfused.log;
  RecordProperty("fused_test_acc", std::to_string(fused.test_acc));
}

// Resume, not restart: the server is killed mid-training and restarted from its last
// checkpoint; both adaps-worker processes carry on and finish (exit 0) with the accuracy of
// an undisturbed run. Lost: at most the steps since that checkpoint (1 s). (Was disabled
// for the resume race: a worker whose answer of a step was lost with the server retried it
// as one step of the restored shard with the other worker's next step, and the two stayed
// one step apart; tests/integration/resume_test.cc.)
TEST_F(TrainEndToEnd, KilledServerIsResumedAndTheRunEndsWithTheAccuracyOfAnUndisturbedOne) {
  const TrainResult undisturbed = Train("adacomp");
  ASSERT_TRUE(undisturbed.ok) << undisturbed.log;
  const TrainResult resumed = Train("adacomp", /*kill_server=*/true);
  ASSERT_TRUE(resumed.ok) << resumed.log;
  EXPECT_NE(resumed.log.find("restarted at"), std::string::npos) << resumed.log;
  EXPECT_NEAR(resumed.test_acc, undisturbed.test_acc, 0.03)
      << "resumed " << resumed.test_acc << " vs undisturbed " << undisturbed.test_acc;
  RecordProperty("undisturbed_test_acc", std::to_string(undisturbed.test_acc));
  RecordProperty("resumed_test_acc", std::to_string(resumed.test_acc));
}

}  // namespace
}  // namespace adaps::testing
