// Checkpoints of the server shard: atomic, checksummed, the previous one kept, and complete
// (parameters, optimizer state, step), so a restarted server continues exactly where the
// checkpoint was taken.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "adaps/worker.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/checkpoint.h"
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

SliceRecord Record(uint64_t key, std::string name) {
  SliceRecord r;
  r.key = key;
  r.length = 2;
  r.bin_size = 1;
  r.version = 5;
  r.adam_t = 4;
  r.down_base = 3;
  r.down_version = 5;
  r.name = std::move(name);
  r.params = {1.5f, -2.0f};
  r.m = {0.25f, 0.5f};
  r.published = {1.0f, -1.0f};
  r.residue = {0.5f, -1.0f};
  return r;  // v left empty: an optimizer without a second moment
}

template <typename T>
void Append(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

void AppendFloats(std::vector<uint8_t>& out, const std::vector<float>& v) {
  Append<uint64_t>(out, v.size());
  for (float x : v) Append(out, x);
}

TEST(CheckpointFormat, BytesFollowTheDocumentedLayoutSoOldFilesStayReadable) {
  std::vector<uint8_t> expected = {'A', 'D', 'A', 'P', 'S', 'C', 'K', '2'};
  Append<uint64_t>(expected, 1);
  const SliceRecord r = Record(9, "w");
  Append<uint64_t>(expected, 9);
  Append<uint32_t>(expected, 2);
  Append<uint32_t>(expected, 1);
  for (uint64_t x : {5, 4, 3, 5}) Append<uint64_t>(expected, x);
  Append<uint64_t>(expected, 1);
  expected.push_back('w');
  for (const auto* v : {&r.params, &r.m, &r.v, &r.published, &r.residue}) {
    AppendFloats(expected, *v);
  }
  Append<uint32_t>(expected, Crc32(expected));
  EXPECT_EQ(EncodeCheckpoint({r}), expected);
  EXPECT_EQ(Crc32(std::vector<uint8_t>{'1', '2', '3', '4', '5', '6', '7', '8', '9'}),
            0xCBF43926u);  // the standard CRC-32 check value
}

TEST(CheckpointFormat, DecodeGivesBackEveryRecordInOrder) {
  const std::vector<SliceRecord> in = {Record(3, "a"), Record(1, "bb")};
  auto out = DecodeCheckpoint(EncodeCheckpoint(in), "x");
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0].key, 3u);
  EXPECT_EQ((*out)[1].name, "bb");
  EXPECT_EQ((*out)[1].params, in[1].params);
  EXPECT_EQ((*out)[1].m, in[1].m);
  EXPECT_TRUE((*out)[1].v.empty());
  EXPECT_EQ((*out)[1].residue, in[1].residue);
  EXPECT_EQ((*out)[1].down_base, 3u);
}

TEST(CheckpointFormat, EveryFlippedByteIsDataLoss) {
  const std::vector<uint8_t> good = EncodeCheckpoint({Record(3, "a")});
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<uint8_t> bad = good;
    bad[i] ^= 0x10;
    EXPECT_EQ(DecodeCheckpoint(bad, "x").status().code(), absl::StatusCode::kDataLoss) << i;
  }
  std::vector<uint8_t> shorter(good.begin(), good.end() - 1);
  EXPECT_EQ(DecodeCheckpoint(shorter, "x").status().code(), absl::StatusCode::kDataLoss);
}

TEST(CheckpointFormat, InconsistentRecordWithAValidChecksumIsDataLoss) {
  SliceRecord r = Record(3, "a");
  r.published = {1.0f};  // shorter than the slice
  const absl::Status s = DecodeCheckpoint(EncodeCheckpoint({r}), "x").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("inconsistent"), std::string::npos) << s;
}

TEST(CheckpointFile, WriteKeepsThePreviousAndReadFallsBackToItWhenTheNewestIsDamaged) {
  const std::string path = FreshDir("file") + "/server-0.ckpt";
  ASSERT_TRUE(WriteCheckpointFile(path, {Record(1, "first")}).ok());
  ASSERT_TRUE(WriteCheckpointFile(path, {Record(1, "second")}).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto newest = ReadCheckpointWithFallback(path);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_TRUE(newest->found);
  EXPECT_FALSE(newest->from_previous);
  EXPECT_EQ(newest->slices[0].name, "second");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x5a');
  }
  auto fallback = ReadCheckpointWithFallback(path);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_TRUE(fallback->from_previous);
  EXPECT_EQ(fallback->refused.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(fallback->slices[0].name, "first");
}

TEST(CheckpointFile, NoFileMeansStartFreshAndOnlyDamagedCopiesMeanDataLoss) {
  const std::string path = FreshDir("none") + "/server-0.ckpt";
  auto none = ReadCheckpointWithFallback(path);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->found);
  EXPECT_EQ(ReadCheckpointFile(path).status().code(), absl::StatusCode::kNotFound);
  std::ofstream(path) << "garbage";
  EXPECT_EQ(ReadCheckpointWithFallback(path).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(CheckpointPath("/d", 3), "/d/server-3.ckpt");
}

}  // namespace
}  // namespace adaps
