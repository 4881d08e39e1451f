// Checkpoints of the server shard: atomic, checksummed, the previous one kept, and complete
// (parameters, optimizer state, step), so a restarted server continues exactly where the
// checkpoint was taken.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "adaps/worker.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/server.h"

namespace adaps {
namespace {

struct MiniCluster {
  MiniCluster(const std::string& dir, OptimizerKind kind) {
    SchedulerConfig sc;
    sc.log_level = "off";
    scheduler = std::make_unique<Scheduler>(sc);
    EXPECT_TRUE(scheduler->Start().ok());
    ServerConfig vc;
    vc.scheduler = scheduler->endpoint();
    vc.optimizer.kind = kind;
    vc.optimizer.learning_rate = 0.5f;
    vc.optimizer.momentum = 0.5f;
    vc.checkpoint_dir = dir;
    vc.log_level = "off";
    server = std::make_unique<Server>(vc);
    std::thread start([&] { server_status = server->Start(); });
    WorkerOptions wo;
    wo.scheduler = scheduler->endpoint();
    wo.log_level = "off";
    wo.register_timeout = absl::Seconds(5);
    auto w = Worker::Create(wo);
    start.join();
    if (w.ok()) worker = *std::move(w);
  }
  ~MiniCluster() {
    if (worker) worker->Stop().IgnoreError();
    scheduler->Stop();
    server->Stop();
  }
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Server> server;
  absl::Status server_status;
  std::unique_ptr<Worker> worker;
};

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/adaps-ckpt-" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<float> Grad(int step) {
  return {0.5f * step + 1.0f, -2.0f, 0.25f, static_cast<float>(step)};
}

// Runs `steps` momentum steps from the checkpoint in `dir` (or from {1,2,3,4}), optionally
// checkpointing after `checkpoint_after` steps; returns the parameters.
std::vector<float> Train(const std::string& dir, int first, int steps, int checkpoint_after = -1) {
  MiniCluster c(dir, OptimizerKind::kMomentum);
  EXPECT_TRUE(c.server_status.ok()) << c.server_status;
  if (!c.worker) return {};
  std::vector<float> v = {1, 2, 3, 4};
  EXPECT_TRUE(c.worker->Declare({"t", {4}, 2, Compression::kDense}, absl::MakeSpan(v)).ok());
  for (int s = first; s < first + steps; ++s) {
    EXPECT_TRUE(c.worker->PushPull("t", Grad(s), absl::MakeSpan(v)).get().ok());
    if (s + 1 - first == checkpoint_after) {
      EXPECT_TRUE(c.worker->Checkpoint("").ok());
    }
  }
  return v;
}

TEST(Checkpoint, RestoresOptimizerStateAndStepSoTheRunContinuesExactly) {
  const std::string dir = FreshDir("exact");
  const std::vector<float> straight = Train(dir, 0, 5, /*checkpoint_after=*/3);
  // Restart from the checkpoint taken after step 3 and replay steps 3 and 4.
  const std::vector<float> resumed = Train(dir, 3, 2);
  EXPECT_EQ(resumed, straight);  // bitwise: momentum buffers came back too
}

TEST(Checkpoint, DamagedCheckpointIsRefusedAndThePreviousOneUsed) {
  const std::string dir = FreshDir("damaged");
  Train(dir, 0, 2, /*checkpoint_after=*/1);  // server-0.ckpt at step 1
  const std::vector<float> after2 = Train(dir, 1, 1, /*checkpoint_after=*/1);  // step 2; .prev = 1
  ASSERT_TRUE(std::filesystem::exists(dir + "/server-0.ckpt.prev"));
  {  // Flip one byte in the middle of the newest checkpoint.
    std::fstream f(dir + "/server-0.ckpt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x5a');
  }
  MiniCluster c(dir, OptimizerKind::kMomentum);
  ASSERT_TRUE(c.server_status.ok()) << c.server_status;
  ASSERT_TRUE(c.worker);
  std::vector<float> v = {0, 0, 0, 0};
  ASSERT_TRUE(c.worker->Declare({"t", {4}, 2, Compression::kDense}, absl::MakeSpan(v)).ok());
  EXPECT_NE(v, after2);  // not the damaged step-2 state ...
  EXPECT_NE(v, (std::vector<float>{0, 0, 0, 0}));  // ... but the step-1 one, not fresh values
}

TEST(Checkpoint, EveryCopyDamagedMeansTheServerRefusesToStart) {
  const std::string dir = FreshDir("bothbad");
  std::ofstream(dir + "/server-0.ckpt") << "ADAPSCK2 but nothing sensible after it";
  std::ofstream(dir + "/server-0.ckpt.prev") << "garbage";
  MiniCluster c(dir, OptimizerKind::kMomentum);
  EXPECT_EQ(c.server_status.code(), absl::StatusCode::kDataLoss) << c.server_status;
  EXPECT_NE(c.server_status.message().find("damaged"), std::string::npos) << c.server_status;
}

}  // namespace
}  // namespace adaps
