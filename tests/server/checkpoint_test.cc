// Checkpoints of the server shard: atomic, checksummed, the previous one kept, and complete
// (parameters, optimizer state, step), so a restarted server continues exactly where the
// checkpoint was taken.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "adaps/worker.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/checkpoint.h"
#include "server/server.h"

namespace adaps {
namespace {

struct MiniCluster {
  MiniCluster(const std::string& dir, OptimizerKind kind,
              const std::string& job_id = "checkpoint-test", const std::string& restore_from = "") {
    SchedulerConfig sc;
    sc.log_level = "off";
    sc.job_id = job_id;  // one job over several cluster starts
    scheduler = std::make_unique<Scheduler>(sc);
    EXPECT_TRUE(scheduler->Start().ok());
    ServerConfig vc;
    vc.scheduler = scheduler->endpoint();
    vc.optimizer.kind = kind;
    vc.optimizer.learning_rate = 0.5f;
    vc.optimizer.momentum = 0.5f;
    vc.checkpoint_dir = dir;
    vc.restore_from = restore_from;
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
  // The server stops first, as if killed: no final checkpoint (see CleanShutdown... below).
  ~MiniCluster() {
    server->Stop();
    if (worker) worker->Stop().IgnoreError();
    scheduler->Stop();
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

// A new job (another --job_id) does not silently resume an earlier run's model: the
// checkpoint is moved aside and the server starts fresh; --restore_from resumes it.
TEST(Checkpoint, AnotherJobsCheckpointIsNotRestoredButRestoreFromResumesIt) {
  const std::string dir = FreshDir("otherjob");
  const std::vector<float> trained = Train(dir, 0, 3, /*checkpoint_after=*/3);
  const std::vector<float> initial = {1, 2, 3, 4};
  {
    MiniCluster c(dir, OptimizerKind::kMomentum, "another-job");
    ASSERT_TRUE(c.server_status.ok()) << c.server_status;
    ASSERT_TRUE(c.worker);
    std::vector<float> v = initial;
    ASSERT_TRUE(c.worker->Declare({"t", {4}, 2, Compression::kDense}, absl::MakeSpan(v)).ok());
    EXPECT_EQ(v, initial) << "another job's model was restored";
  }
  const std::string aside = dir + "/server-0.ckpt.job-checkpoint-test";
  ASSERT_TRUE(std::filesystem::exists(aside));
  EXPECT_FALSE(std::filesystem::exists(dir + "/server-0.ckpt"));
  MiniCluster c(dir, OptimizerKind::kMomentum, "a-third-job", aside);
  ASSERT_TRUE(c.server_status.ok()) << c.server_status;
  ASSERT_TRUE(c.worker);
  std::vector<float> v = initial;
  ASSERT_TRUE(c.worker->Declare({"t", {4}, 2, Compression::kDense}, absl::MakeSpan(v)).ok());
  EXPECT_EQ(v, trained);
}

// Format 2 files (no job id) are still read, but restored only with --restore_from.
TEST(Checkpoint, FormatTwoFileIsRestoredOnlyWithRestoreFrom) {
  const std::string dir = FreshDir("format2");
  const std::vector<float> trained = Train(dir, 0, 3, /*checkpoint_after=*/3);
  std::vector<uint8_t> v3;
  {
    std::ifstream in(dir + "/server-0.ckpt", std::ios::binary);
    v3.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // The same checkpoint in format 2: magic ...K2, no job id (u64 size + 15 bytes), no
  // hyperparameters (a u64 count of 0: none were set) and no flags word in the record (after
  // the slice count, key, length, bin size and four u64s).
  const size_t job_bytes = 8 + std::string("checkpoint-test").size() + 8;
  ASSERT_GT(v3.size(), 8 + job_bytes + 4);
  std::vector<uint8_t> v2(v3.begin(), v3.begin() + 8);
  v2[7] = '2';
  v2.insert(v2.end(), v3.begin() + 8 + job_bytes, v3.end() - 4);
  const size_t flags_at = 8 + 8 + 8 + 4 + 4 + 4 * 8;
  ASSERT_GT(v2.size(), flags_at + 4);
  v2.erase(v2.begin() + flags_at, v2.begin() + flags_at + 4);
  const uint32_t crc = Crc32(v2);
  const auto* c4 = reinterpret_cast<const uint8_t*>(&crc);
  v2.insert(v2.end(), c4, c4 + 4);
  std::string job = "unset";
  auto decoded = DecodeCheckpoint(v2, "v2", &job);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(job, "");
  ASSERT_EQ(decoded->size(), 1u);
  EXPECT_EQ((*decoded)[0].params, trained);
  std::filesystem::remove(dir + "/server-0.ckpt.prev");
  std::ofstream(dir + "/server-0.ckpt", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(v2.data()), v2.size());
  const std::vector<float> initial = {1, 2, 3, 4};
  {
    MiniCluster c(dir, OptimizerKind::kMomentum);
    ASSERT_TRUE(c.worker);
    std::vector<float> v = initial;
    ASSERT_TRUE(c.worker->Declare({"t", {4}, 2, Compression::kDense}, absl::MakeSpan(v)).ok());
    EXPECT_EQ(v, initial) << "a checkpoint without a job id was restored without --restore_from";
  }
  MiniCluster c(dir, OptimizerKind::kMomentum, "checkpoint-test",
                dir + "/server-0.ckpt.job-none");
  ASSERT_TRUE(c.server_status.ok()) << c.server_status;
  ASSERT_TRUE(c.worker);
  std::vector<float> v = initial;
  ASSERT_TRUE(c.worker->Declare({"t", {4}, 2, Compression::kDense}, absl::MakeSpan(v)).ok());
  EXPECT_EQ(v, trained);
}

// A clean end of the job (every worker left, the scheduler's Shutdown) writes a last
// checkpoint: a later run of the same job resumes from the end, not from the last timer.
// A learning rate a worker set at run time (SetHyper) comes back with the checkpoint, over
// the server's flag (0.5 here). Old code: the restored server stepped with 0.5 again.
TEST(Checkpoint, HyperparametersSetAtRunTimeComeBackAfterARestore) {
  const std::string dir = FreshDir("hyper");
  const std::vector<float> ones = {1, 1, 1, 1};
  std::vector<float> v = {1, 2, 3, 4};
  {
    MiniCluster c(dir, OptimizerKind::kSgd);
    ASSERT_TRUE(c.server_status.ok()) << c.server_status;
    ASSERT_TRUE(c.worker);
    ASSERT_TRUE(c.worker->Declare({"t", {4}, 2, Compression::kDense}, absl::MakeSpan(v)).ok());
    ASSERT_TRUE(c.worker->SetHyper({{"learning_rate", 0.125}}).ok());
    ASSERT_TRUE(c.worker->PushPull("t", ones, absl::MakeSpan(v)).get().ok());
    ASSERT_EQ(v, (std::vector<float>{0.875f, 1.875f, 2.875f, 3.875f}));
    ASSERT_TRUE(c.worker->Checkpoint("").ok());
  }
  MiniCluster c(dir, OptimizerKind::kSgd);  // killed and restarted: restores
  ASSERT_TRUE(c.server_status.ok()) << c.server_status;
  ASSERT_TRUE(c.worker);
  std::vector<float> w = {1, 2, 3, 4};
  ASSERT_TRUE(c.worker->Declare({"t", {4}, 2, Compression::kDense}, absl::MakeSpan(w)).ok());
  EXPECT_EQ(w, v);  // the restored parameters
  ASSERT_TRUE(c.worker->PushPull("t", ones, absl::MakeSpan(w)).get().ok());
  EXPECT_EQ(w, (std::vector<float>{0.75f, 1.75f, 2.75f, 3.75f})) << "stepped with the flag's rate";
}

TEST(Checkpoint, CleanShutdownWritesAFinalCheckpoint) {
  const std::string dir = FreshDir("final");
  std::vector<float> v = {1, 2, 3, 4};
  {
    MiniCluster c(dir, OptimizerKind::kMomentum);
    ASSERT_TRUE(c.worker);
    ASSERT_TRUE(c.worker->Declare({"t", {4}, 2, Compression::kDense}, absl::MakeSpan(v)).ok());
    for (int s = 0; s < 4; ++s) {
      ASSERT_TRUE(c.worker->PushPull("t", Grad(s), absl::MakeSpan(v)).get().ok());
    }
    ASSERT_TRUE(c.worker->Stop().ok());
    ASSERT_TRUE(c.server->WaitForShutdown(absl::Seconds(10)));
  }
  std::string job;
  auto records = ReadCheckpointFile(dir + "/server-0.ckpt", &job);
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(job, "checkpoint-test");
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ((*records)[0].version, 4u);
  EXPECT_EQ((*records)[0].params, v);
}

TEST(Checkpoint, EveryCopyDamagedMeansTheServerRefusesToStart) {
  const std::string dir = FreshDir("bothbad");
  std::ofstream(dir + "/server-0.ckpt") << "ADAPSCK2 but nothing sensible after it";
  std::ofstream(dir + "/server-0.ckpt.prev") << "garbage";
  MiniCluster c(dir, OptimizerKind::kMomentum);
  EXPECT_EQ(c.server_status.code(), absl::StatusCode::kDataLoss) << c.server_status;
  EXPECT_NE(c.server_status.message().find("damaged"), std::string::npos) << c.server_status;
}

// A file error (here: the directory is gone) is the server's own problem, not a restart: the
// worker must not retry it for request_timeout (30 s by default) as it retries kUnavailable.
TEST(Checkpoint, FileErrorFailsFastWithThePathAndIsNotRetriedAsARestart) {
  const std::string dir = FreshDir("gone");
  MiniCluster c(dir, OptimizerKind::kMomentum);
  ASSERT_TRUE(c.worker);
  std::vector<float> v = {1, 2, 3, 4};
  ASSERT_TRUE(c.worker->Declare({"t", {4}, 2, Compression::kDense}, absl::MakeSpan(v)).ok());
  std::filesystem::remove_all(dir);
  const absl::Time start = absl::Now();
  const absl::Status st = c.worker->Checkpoint("");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << st;
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_NE(st.message().find(dir + "/server-0.ckpt"), std::string::npos) << st;
  EXPECT_NE(st.message().find(std::strerror(ENOENT)), std::string::npos) << st;
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
  std::vector<uint8_t> expected = {'A', 'D', 'A', 'P', 'S', 'C', 'K', '5'};
  Append<uint64_t>(expected, 3);
  for (char ch : std::string("job")) expected.push_back(ch);
  Append<uint64_t>(expected, 1);  // one hyperparameter
  Append<uint64_t>(expected, 2);
  expected.push_back('l');
  expected.push_back('r');
  Append<double>(expected, 0.25);
  const size_t hyper_end = expected.size();
  Append<uint64_t>(expected, 1);
  SliceRecord r = Record(9, "w");
  r.running_mean = true;
  r.down_bin_divisor = 10;
  Append<uint64_t>(expected, 9);
  Append<uint32_t>(expected, 2);
  Append<uint32_t>(expected, 1);
  for (uint64_t x : {5, 4, 3, 5}) Append<uint64_t>(expected, x);
  const size_t flags_at = expected.size();
  Append<uint32_t>(expected, 1 | (10 << 8));  // flags: running mean, downlink divisor 10
  Append<uint64_t>(expected, 1);
  expected.push_back('w');
  for (const auto* v : {&r.params, &r.m, &r.v, &r.published, &r.residue}) {
    AppendFloats(expected, *v);
  }
  // Format 4: no flags.
  std::vector<uint8_t> v4(expected.begin(), expected.begin() + flags_at);
  v4[7] = '4';
  v4.insert(v4.end(), expected.begin() + flags_at + 4, expected.end());
  std::vector<uint8_t> v3(v4.begin(), v4.begin() + 8 + 8 + 3);  // format 3:
  v3[7] = '3';                                                   // no hyper
  v3.insert(v3.end(), v4.begin() + hyper_end, v4.end());
  Append<uint32_t>(expected, Crc32(expected));
  EXPECT_EQ(EncodeCheckpoint({r}, "job", {{"lr", 0.25}}), expected);
  HyperValues hyper;
  auto v5 = DecodeCheckpoint(expected, "v5", nullptr, &hyper);
  ASSERT_TRUE(v5.ok()) << v5.status();
  EXPECT_TRUE((*v5)[0].running_mean);
  EXPECT_EQ((*v5)[0].down_bin_divisor, 10u);
  EXPECT_EQ(hyper, (HyperValues{{"lr", 0.25}}));
  Append<uint32_t>(v4, Crc32(v4));
  auto four = DecodeCheckpoint(v4, "v4", nullptr, &hyper);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_FALSE((*four)[0].running_mean);
  EXPECT_EQ((*four)[0].down_bin_divisor, 1u);
  EXPECT_EQ((*four)[0].params, r.params);
  EXPECT_EQ(hyper, (HyperValues{{"lr", 0.25}}));
  Append<uint32_t>(v3, Crc32(v3));
  std::string job;
  auto old = DecodeCheckpoint(v3, "v3", &job, &hyper);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(job, "job");
  EXPECT_TRUE(hyper.empty());
  EXPECT_EQ((*old)[0].params, r.params);
  // A flag this code does not know is refused, not dropped.
  std::vector<uint8_t> unknown(expected.begin(), expected.end() - 4);
  unknown[flags_at] = 1 | 8;  // (bits 1 and 2 are the running sum's)
  Append<uint32_t>(unknown, Crc32(unknown));
  EXPECT_EQ(DecodeCheckpoint(unknown, "x").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Crc32(std::vector<uint8_t>{'1', '2', '3', '4', '5', '6', '7', '8', '9'}),
            0xCBF43926u);  // the standard CRC-32 check value
}

// Shard::KeepSum: a slice that keeps the running sum writes flag bit 1 and the sum after
// the residue; one that lost it, bit 2 and an empty sum; one that keeps none, neither (its
// bytes as before).
TEST(CheckpointFormat, ARunningSumRoundTripsKeptOrLost) {
  SliceRecord kept = Record(1, "k");
  kept.keep_sum = true;
  kept.sum = {7.5f, -0.25f};
  SliceRecord lost = Record(2, "l");
  lost.keep_sum = true;
  lost.sum_lost = true;
  const SliceRecord none = Record(3, "n");
  const std::vector<uint8_t> bytes = EncodeCheckpoint({kept, lost, none});
  auto out = DecodeCheckpoint(bytes, "x");
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  EXPECT_TRUE((*out)[0].keep_sum);
  EXPECT_FALSE((*out)[0].sum_lost);
  EXPECT_EQ((*out)[0].sum, kept.sum);
  EXPECT_EQ((*out)[0].residue, kept.residue);
  EXPECT_TRUE((*out)[1].keep_sum);
  EXPECT_TRUE((*out)[1].sum_lost);
  EXPECT_TRUE((*out)[1].sum.empty());
  EXPECT_FALSE((*out)[2].keep_sum);
  EXPECT_EQ((*out)[2].params, none.params);
  // A kept sum adds its count and 2 floats; a lost one its count (0).
  EXPECT_EQ(bytes.size(),
            EncodeCheckpoint({none, none, none}).size() + (8 + 2 * sizeof(float)) + 8);
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

TEST(CheckpointFile, WriteIntoAMissingDirectoryIsInternalWithPathAndErrno) {
  const std::string dir = FreshDir("missing") + "/not-there";
  const absl::Status st = WriteCheckpointFile(dir + "/server-0.ckpt", {Record(1, "a")}, "job", {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_NE(st.message().find(dir + "/server-0.ckpt"), std::string::npos) << st;
  EXPECT_NE(st.message().find(std::strerror(ENOENT)), std::string::npos) << st;
}

}  // namespace
}  // namespace adaps
