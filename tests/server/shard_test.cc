// One server shard driven with plain spans: aggregation, step completion, pulls and the
// checkpoint record, without sockets.
#include "server/shard.h"

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "common/compressor.h"
#include "common/wire_codec.h"
#include "gtest/gtest.h"
#include "tests/server/parsed_push.h"

namespace adaps {
namespace {

std::vector<uint8_t> Dense(const std::vector<float>& values) {
  CompressedUpdate u;
  u.kind = CompressorKind::kDense;
  u.length = static_cast<uint32_t>(values.size());
  u.values = values;
  std::vector<uint8_t> bytes;
  EXPECT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &bytes).ok());
  return bytes;
}

std::vector<uint8_t> Raw(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::vector<float> Floats(const Shard::PayloadBytes& bytes) {
  std::vector<float> out(bytes->size() / sizeof(float));
  std::memcpy(out.data(), bytes->data(), bytes->size());
  return out;
}

OptimizerConfig Kind(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  return c;
}

Shard Make(uint32_t length = 4, uint32_t bin = 2) { return *Shard::Create(7, "t", length, bin); }

Shard::Pull DensePull(uint64_t min_version = 0) {
  return Shard::Pull{"r", 1, min_version, 0, Shard::Format::kDense};
}

// `steps` sum-only steps of one worker pushing ones.
void SumSteps(Shard& shard, uint64_t steps) {
  for (uint64_t k = 0; k < steps; ++k) {
    EXPECT_TRUE(AddPushBytes(shard, 0, k, Dense({1, 1, 1, 1})).ok());
    EXPECT_TRUE(shard.CompleteStepIfReady({0}, Kind(OptimizerKind::kSumOnly)));
  }
}

TEST(Shard, AveragesThePushesOfEveryLiveWorkerExactly) {
  Shard s = Make();
  const std::vector<float> g0 = {0.1f, -3.0f, 7.5f, 1e-3f}, g1 = {0.3f, 2.0f, -0.5f, 1e3f};
  ASSERT_TRUE(AddPushBytes(s, 0, 0, Dense(g0)).ok());
  EXPECT_FALSE(s.CompleteStepIfReady({0, 1}, Kind(OptimizerKind::kMean)));
  ASSERT_TRUE(AddPushBytes(s, 1, 0, Dense(g1)).ok());
  EXPECT_TRUE(s.CompleteStepIfReady({0, 1}, Kind(OptimizerKind::kMean)));
  EXPECT_EQ(s.version(), 1u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(s.params()[i], (g0[i] + g1[i]) * 0.5f) << i;
}

TEST(Shard, SumOnlyAddsThePushesWithoutAveraging) {
  Shard s = Make();
  s.Initialize(Raw({1, 2, 3, 4}));
  ASSERT_TRUE(AddPushBytes(s, 0, 0, Dense({1, 1, 1, 1})).ok());
  ASSERT_TRUE(AddPushBytes(s, 1, 0, Dense({2, 2, 2, 2})).ok());
  ASSERT_TRUE(s.CompleteStepIfReady({0, 1}, Kind(OptimizerKind::kSumOnly)));
  EXPECT_EQ(std::vector<float>(s.params().begin(), s.params().end()),
            (std::vector<float>{4, 5, 6, 7}));
}

TEST(Shard, StepCompletesWithoutADeadWorkerAndAveragesOverThosePushed) {
  Shard s = Make();
  ASSERT_TRUE(AddPushBytes(s, 0, 0, Dense({2, 4, 6, 8})).ok());
  EXPECT_FALSE(s.CompleteStepIfReady({0, 1}, Kind(OptimizerKind::kMean)));
  EXPECT_TRUE(s.CompleteStepIfReady({0}, Kind(OptimizerKind::kMean)));  // worker 1 died
  EXPECT_EQ(std::vector<float>(s.params().begin(), s.params().end()),
            (std::vector<float>{2, 4, 6, 8}));
  EXPECT_FALSE(s.CompleteStepIfReady({0}, Kind(OptimizerKind::kMean)));  // nothing pushed
}

TEST(Shard, DuplicateOrWrongStepOrWrongLengthPushIsRefusedAndChangesNothing) {
  Shard s = Make();
  ASSERT_TRUE(AddPushBytes(s, 0, 0, Dense({1, 1, 1, 1})).ok());
  // (A second push of a step: kAlreadyExists, acknowledged by the server and not applied.)
  EXPECT_EQ(AddPushBytes(s, 0, 0, Dense({5, 5, 5, 5})).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(AddPushBytes(s, 1, 1, Dense({5, 5, 5, 5})).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(AddPushBytes(s, 1, 0, Dense({5, 5, 5})).code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> bad = Dense({5, 5, 5, 5});
  bad.resize(bad.size() - 2);
  EXPECT_FALSE(AddPushBytes(s, 1, 0, bad).ok());
  ASSERT_TRUE(AddPushBytes(s, 1, 0, Dense({3, 3, 3, 3})).ok());
  ASSERT_TRUE(s.CompleteStepIfReady({0, 1}, Kind(OptimizerKind::kMean)));
  EXPECT_EQ(s.params()[0], 2.0f);  // (1 + 3) / 2: none of the refused pushes counted
}

// --backup_workers=1: a step completes once all but one live worker pushed; the straggler's
// push, arriving after its step completed, goes into the step in progress: nothing is lost
// (sum-only: the parameters are exactly the sum of every push applied), nothing counted twice.
TEST(Shard, AStragglersPushGoesIntoTheNextStepWithBackupWorkers) {
  Shard s = Make();
  const OptimizerConfig sum = Kind(OptimizerKind::kSumOnly);
  const std::set<int> live = {0, 1, 2};
  float pushed = 0;  // every push is (k, k, k, k) with k its value; exact in float
  auto push = [&](int w, uint64_t step, float k) {
    const absl::Status st = AddPushBytes(s, w, step, Dense({k, k, k, k}), /*backup_workers=*/1);
    if (st.ok()) pushed += k;
    return st;
  };
  // Without backup workers the step waits for every live worker.
  ASSERT_TRUE(push(0, 0, 1).ok());
  ASSERT_TRUE(push(1, 0, 2).ok());
  EXPECT_FALSE(s.CompleteStepIfReady(live, sum, /*backup_workers=*/0));
  // With one, it completes without worker 2 (the straggler).
  ASSERT_TRUE(s.CompleteStepIfReady(live, sum, 1));
  EXPECT_EQ(s.version(), 1u);
  EXPECT_EQ(s.params()[0], 3.0f);
  // Worker 2's push of step 0 comes late: taken into step 1, once.
  ASSERT_TRUE(push(2, 0, 4).ok());
  EXPECT_EQ(push(2, 0, 4).code(), absl::StatusCode::kAlreadyExists);  // acknowledged, not added
  EXPECT_FALSE(s.CompleteStepIfReady(live, sum, 1));  // no push of step 1 yet: not a step
  ASSERT_TRUE(push(0, 1, 8).ok());
  EXPECT_FALSE(s.CompleteStepIfReady(live, sum, 1));  // two of three still missing
  ASSERT_TRUE(push(2, 1, 16).ok());                   // the straggler caught up
  ASSERT_TRUE(s.CompleteStepIfReady(live, sum, 1));
  EXPECT_EQ(s.params()[0], 1 + 2 + 4 + 8 + 16.0f);
  // Worker 1's push of step 1, late now, and a push far ahead, refused.
  ASSERT_TRUE(push(1, 1, 32).ok());
  EXPECT_EQ(push(1, 5, 64).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(push(0, 2, 128).ok());
  ASSERT_TRUE(push(1, 2, 256).ok());
  ASSERT_TRUE(s.CompleteStepIfReady(live, sum, 1));
  EXPECT_EQ(s.params()[0], pushed);
  EXPECT_EQ(pushed, 1 + 2 + 4 + 8 + 16 + 32 + 128 + 256.0f);
  // Without backup workers a late push is refused, as before.
  EXPECT_EQ(AddPushBytes(s, 2, 2, Dense({1, 1, 1, 1})).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A push sent again because its answer was lost with a connection (the worker cannot tell
// whether it arrived) is applied once: the shard says kAlreadyExists (the server
// acknowledges it), in its step, after its step completed, and as a late push.
TEST(Shard, APushSentAgainIsAppliedOnce) {
  for (int backup_workers : {0, 1}) {
    SCOPED_TRACE(backup_workers);
    Shard s = Make();
    const OptimizerConfig sum = Kind(OptimizerKind::kSumOnly);
    const std::set<int> live = {0, 1};
    auto push = [&](int w, uint64_t step, float k) {
      return AddPushBytes(s, w, step, Dense({k, k, k, k}), backup_workers);
    };
    ASSERT_TRUE(push(0, 0, 1).ok());
    EXPECT_EQ(push(0, 0, 1).code(), absl::StatusCode::kAlreadyExists);  // in its step
    ASSERT_TRUE(push(1, 0, 2).ok());
    ASSERT_TRUE(s.CompleteStepIfReady(live, sum, backup_workers));
    EXPECT_EQ(s.params()[0], 3.0f);
    // After its step completed (with a backup worker it would otherwise be taken as late).
    EXPECT_EQ(push(0, 0, 1).code(), absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(push(1, 0, 2).code(), absl::StatusCode::kAlreadyExists);
    ASSERT_TRUE(push(0, 1, 4).ok());
    ASSERT_TRUE(push(1, 1, 8).ok());
    ASSERT_TRUE(s.CompleteStepIfReady(live, sum, backup_workers));
    EXPECT_EQ(s.params()[0], 1 + 2 + 4 + 8.0f);
    // Not a blanket answer: a worker that did not push a completed step is refused without
    // backup workers (with one, its push is a straggler's, added late).
    if (backup_workers == 0) {
      EXPECT_EQ(push(2, 0, 16).code(), absl::StatusCode::kFailedPrecondition);
    }
  }
}

// The mean over every push the step holds, late ones included.
TEST(Shard, AStepWithALatePushAveragesOverEveryPushItHolds) {
  Shard s = Make();
  const OptimizerConfig mean = Kind(OptimizerKind::kMean);
  ASSERT_TRUE(AddPushBytes(s, 0, 0, Dense({3, 3, 3, 3}), 1).ok());
  ASSERT_TRUE(s.CompleteStepIfReady({0, 1}, mean, 1));
  ASSERT_TRUE(AddPushBytes(s, 1, 0, Dense({6, 6, 6, 6}), 1).ok());
  ASSERT_TRUE(AddPushBytes(s, 0, 1, Dense({0, 0, 0, 0}), 1).ok());
  ASSERT_TRUE(s.CompleteStepIfReady({0, 1}, mean, 1));
  EXPECT_EQ(s.params()[0], 3.0f);  // (6 + 0) / 2
}

TEST(Shard, AsyncPushIsAppliedAtOnce) {
  Shard s = Make();
  ASSERT_TRUE(ApplyPushBytes(s, Dense({1, 2, 3, 4}), Kind(OptimizerKind::kMean)).ok());
  EXPECT_EQ(s.version(), 1u);
  EXPECT_EQ(s.params()[3], 4.0f);
  EXPECT_FALSE(ApplyPushBytes(s, Dense({1, 2}), Kind(OptimizerKind::kMean)).ok());
  EXPECT_EQ(s.version(), 1u);
}

TEST(Shard, InitialValuesAreCheckedAndTakenOnlyBeforeTheFirstStep) {
  EXPECT_EQ(Shard::CheckInitialValues(4, Raw({1, 2, 3})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Shard::CheckInitialValues(2, Raw({1, NAN})).code(),
            absl::StatusCode::kInvalidArgument);
  Shard s = Make();
  s.Initialize(Raw({1, 2, 3, 4}));
  EXPECT_EQ(s.params()[1], 2.0f);
  ASSERT_TRUE(AddPushBytes(s, 0, 0, Dense({0, 0, 0, 0})).ok());
  s.Initialize(Raw({9, 9, 9, 9}));  // a push is in: too late
  EXPECT_EQ(s.params()[1], 2.0f);
}

TEST(Shard, DenseBytesAreEncodedOncePerVersionAndReused) {
  Shard s = Make();
  s.Initialize(Raw({1, 2, 3, 4}));
  auto a = s.AnswerPull(DensePull());
  auto b = s.AnswerPull(DensePull());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->payload.get(), b->payload.get());  // the same bytes for every worker
  EXPECT_EQ(Floats(a->payload), (std::vector<float>{1, 2, 3, 4}));
  ASSERT_TRUE(ApplyPushBytes(s, Dense({5, 6, 7, 8}), Kind(OptimizerKind::kMean)).ok());
  auto c = s.AnswerPull(DensePull());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->version, 1u);
  EXPECT_EQ(Floats(c->payload), (std::vector<float>{5, 6, 7, 8}));
  // Bytes still held by a sender are never overwritten by a later version.
  EXPECT_EQ(Floats(a->payload), (std::vector<float>{1, 2, 3, 4}));
}

// A pull from an offset (a fusion bucket's later member) holds the elements from there on,
// says so, and leaves the whole answer that other pullers share untouched.
TEST(Shard, APullFromAnOffsetHoldsTheElementsFromThereOn) {
  Shard s = Make();
  s.Initialize(Raw({1, 2, 3, 4}));
  Shard::Pull from2 = DensePull();
  from2.offset = 2;
  auto part = s.AnswerPull(from2);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->offset, 2u);
  EXPECT_EQ(Floats(part->payload), (std::vector<float>{3, 4}));
  auto whole = s.AnswerPull(DensePull());
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->offset, 0u);
  EXPECT_EQ(Floats(whole->payload), (std::vector<float>{1, 2, 3, 4}));
  from2.format = Shard::Format::kReplica;
  auto replica = s.AnswerPull(from2);
  ASSERT_TRUE(replica.ok()) << replica.status();
  EXPECT_EQ(Floats(replica->payload), (std::vector<float>{3, 4}));
  Shard::Pull past = DensePull();
  past.offset = 5;
  EXPECT_EQ(s.AnswerPull(past).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(Shard, DenseBufferIsReusedOnceNobodyHoldsIt) {
  Shard s = Make();
  const void* first = nullptr;
  {
    auto a = s.AnswerPull(DensePull());
    ASSERT_TRUE(a.ok());
    first = a->payload.get();
  }
  ASSERT_TRUE(ApplyPushBytes(s, Dense({5, 6, 7, 8}), Kind(OptimizerKind::kMean)).ok());
  auto b = s.AnswerPull(DensePull());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->payload.get(), first);  // no allocation for the new version
  EXPECT_EQ(Floats(b->payload), (std::vector<float>{5, 6, 7, 8}));
}

TEST(Shard, HeldPullsAreReleasedWhenTheirVersionArrives) {
  Shard s = Make();
  s.Hold(DensePull(1));
  s.Hold(DensePull(2));
  EXPECT_TRUE(s.TakeReadyPulls().empty());
  ASSERT_TRUE(ApplyPushBytes(s, Dense({1, 1, 1, 1}), Kind(OptimizerKind::kMean)).ok());
  auto ready = s.TakeReadyPulls();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].min_version, 1u);
  EXPECT_EQ(s.held_pulls(), 1u);
}

// Applies a recompressed answer the way a worker does: the change onto its replica.
void ApplyAnswer(const Shard::Answer& a, std::vector<float>& replica) {
  if (a.payload) {
    ASSERT_TRUE(DecodeAdd(*a.payload, 1.0f, absl::MakeSpan(replica)).ok());
  }
}

TEST(Shard, RecompressedReplicaEqualsThePublishedStateBitwiseOverManySteps) {
  constexpr uint32_t kLen = 300;
  Shard s = Make(kLen, 50);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> init(kLen);
  for (float& x : init) x = normal(rng);
  s.Initialize(Raw(init));
  std::vector<float> replica = init;
  OptimizerConfig sgd = Kind(OptimizerKind::kSgd);
  uint64_t have = 0;
  for (int step = 0; step < 8; ++step) {
    std::vector<float> g(kLen);
    for (float& x : g) x = normal(rng);
    ASSERT_TRUE(AddPushBytes(s, 0, step, Dense(g)).ok());
    ASSERT_TRUE(s.CompleteStepIfReady({0}, sgd));
    Shard::Pull pull{"r", 1, s.version(), have, Shard::Format::kRecompressed};
    auto a = s.AnswerPull(pull);
    ASSERT_TRUE(a.ok()) << a.status();
    auto again = s.AnswerPull(pull);  // a second worker at the same version
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(a->payload.get(), again->payload.get()) << "encoded once per version";
    EXPECT_EQ(a->base, have);
    ApplyAnswer(*a, replica);
    have = a->version;
    ASSERT_EQ(std::memcmp(replica.data(), s.published().data(), kLen * sizeof(float)), 0)
        << "step " << step;
  }
  Shard::Pull stale{"r", 1, s.version(), have - 3, Shard::Format::kRecompressed};
  EXPECT_EQ(s.AnswerPull(stale).status().code(), absl::StatusCode::kAborted)
      << "a replica that fell behind is told so (the worker takes the replica again)";
}

// A replica pull (a worker declaring or resynchronizing a recompressed tensor) gets what
// recompressed pulls published, at its version, with the shard's step beside it, and
// publishes nothing: a worker that took it just before the step completes receives the
// next change from it (the old code answered the parameters, which run ahead of the
// published state by the downlink's residue, at the shard's step).
TEST(Shard, ReplicaPullGivesThePublishedStateAndPublishesNothing) {
  constexpr uint32_t kLen = 300;
  Shard s = Make(kLen, 50);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  OptimizerConfig sgd = Kind(OptimizerKind::kSgd);
  uint64_t have = 0;
  const auto step = [&](uint64_t at) {
    std::vector<float> g(kLen);
    for (float& x : g) x = normal(rng);
    ASSERT_TRUE(AddPushBytes(s, 0, at, Dense(g)).ok());
    ASSERT_TRUE(s.CompleteStepIfReady({0}, sgd));
  };
  for (uint64_t at = 0; at < 3; ++at) {
    step(at);
    auto a = s.AnswerPull({"r", 1, s.version(), have, Shard::Format::kRecompressed});
    ASSERT_TRUE(a.ok()) << a.status();
    have = a->version;
  }
  step(3);  // version 4, published at 3
  auto replica = s.AnswerPull({"r", 1, 0, 0, Shard::Format::kReplica});
  ASSERT_TRUE(replica.ok()) << replica.status();
  EXPECT_EQ(replica->version, 4u);
  EXPECT_EQ(replica->base, 3u);
  std::vector<float> mine(kLen);
  ASSERT_TRUE(replica->payload && replica->payload->size() == kLen * sizeof(float));
  std::memcpy(mine.data(), replica->payload->data(), replica->payload->size());
  EXPECT_NE(0, std::memcmp(mine.data(), s.params().data(), kLen * sizeof(float)))
      << "the published state should trail the parameters";
  // The next recompressed answer is the change from version 3, and it brings the replica
  // to the published state bit for bit.
  auto next = s.AnswerPull({"r", 1, 4, 3, Shard::Format::kRecompressed});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->base, 3u);
  EXPECT_EQ(next->version, 4u);
  ApplyAnswer(*next, mine);
  EXPECT_EQ(0, std::memcmp(mine.data(), s.published().data(), kLen * sizeof(float)));
}

// Local mode's recompressed pulls (a slice declared with them on servers running `mean`):
// the slice adds each step's mean to what it holds, so the published replica follows the
// running sum of the means from the initial values, and a checkpoint keeps that. A plain
// mean slice holds only the last step's mean.
TEST(Shard, ARunningMeanAddsEachStepsMeanAndItsRecompressedPullsFollowTheSum) {
  constexpr uint32_t kLen = 200;
  Shard s = Make(kLen, 50);
  Shard plain = Make(kLen, 50);
  s.set_running_mean();
  EXPECT_TRUE(s.running_mean());
  EXPECT_FALSE(plain.running_mean());
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> init(kLen), sum(kLen), replica(kLen);
  for (float& x : init) x = normal(rng);
  s.Initialize(Raw(init));
  plain.Initialize(Raw(init));
  sum = init;
  replica = init;
  const OptimizerConfig mean = Kind(OptimizerKind::kMean);
  uint64_t have = 0;
  std::vector<float> g0(kLen), g1(kLen);
  for (uint64_t step = 0; step < 6; ++step) {
    for (uint32_t i = 0; i < kLen; ++i) g0[i] = normal(rng), g1[i] = normal(rng);
    for (Shard* t : {&s, &plain}) {
      ASSERT_TRUE(AddPushBytes(*t, 0, step, Dense(g0)).ok());
      ASSERT_TRUE(AddPushBytes(*t, 1, step, Dense(g1)).ok());
      ASSERT_TRUE(t->CompleteStepIfReady({0, 1}, mean));
    }
    for (uint32_t i = 0; i < kLen; ++i) {
      sum[i] += (g0[i] + g1[i]) * 0.5f;
      EXPECT_EQ(plain.params()[i], (g0[i] + g1[i]) * 0.5f) << i;
      EXPECT_NEAR(s.params()[i], sum[i], 1e-4f) << "step " << step << " element " << i;
    }
    auto a = s.AnswerPull({"r", 1, s.version(), have, Shard::Format::kRecompressed});
    ASSERT_TRUE(a.ok()) << a.status();
    ApplyAnswer(*a, replica);
    have = a->version;
    ASSERT_EQ(std::memcmp(replica.data(), s.published().data(), kLen * sizeof(float)), 0);
  }
  // What the downlink holds back (params - published) is small against the sum's change.
  double held = 0, moved = 0;
  for (uint32_t i = 0; i < kLen; ++i) {
    held += std::abs(s.params()[i] - s.published()[i]);
    moved += std::abs(s.params()[i] - init[i]);
  }
  EXPECT_LT(held, moved);
  const SliceRecord r = s.ToRecord();
  EXPECT_TRUE(r.running_mean);
  EXPECT_FALSE(plain.ToRecord().running_mean);
  auto back = Shard::FromRecord(r);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->running_mean()) << "a restored running mean must keep adding";
  ASSERT_TRUE(AddPushBytes(*back, 0, 6, Dense(g0)).ok());
  ASSERT_TRUE(back->CompleteStepIfReady({0}, mean));
  for (uint32_t i = 0; i < kLen; ++i) EXPECT_NEAR(back->params()[i], sum[i] + g0[i], 1e-4f);
}

std::vector<float> SumOf(Shard& s) {
  auto a = s.AnswerPull({"r", 1, 0, 0, Shard::Format::kReplica});
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? Floats(a->payload) : std::vector<float>{};
}

absl::StatusCode SumCode(Shard& s) {
  return s.AnswerPull({"r", 1, 0, 0, Shard::Format::kReplica}).status().code();
}

// One worker's mean step of `push` at the shard's version.
void MeanStep(Shard& s, const std::vector<float>& push, uint64_t step) {
  ASSERT_TRUE(AddPushBytes(s, 0, step, Dense(push)).ok());
  ASSERT_TRUE(s.CompleteStepIfReady({0}, Kind(OptimizerKind::kMean)));
}

// The running sum (Shard::KeepSum; its arithmetic, bit for bit against the workers' anchors,
// is tests/server/shard_sparse_test.cc's): kept in checkpoints, and refused rather than
// answered wrong once it cannot be the sum of every step's mean.
TEST(Shard, ARunningSumIsCheckpointedAndRefusedOnceItMissesAStep) {
  Shard s = Make();
  s.KeepSum();
  EXPECT_TRUE(s.keeps_sum());
  s.Initialize(Raw({1, 2, 3, 4}));
  MeanStep(s, {1, 1, 1, 1}, 0);
  MeanStep(s, {0.5f, 0, 0, -1}, 1);
  EXPECT_EQ(std::vector<float>(s.params().begin(), s.params().end()),
            (std::vector<float>{0.5f, 0, 0, -1}));  // the slice: the step's mean
  EXPECT_EQ(SumOf(s), (std::vector<float>{2.5f, 3, 4, 4}));
  // Restored from its record: the sum goes on where the workers are.
  const SliceRecord r = s.ToRecord();
  EXPECT_TRUE(r.keep_sum);
  auto back = Shard::FromRecord(r);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(SumOf(*back), (std::vector<float>{2.5f, 3, 4, 4}));
  MeanStep(*back, {1, 1, 1, 1}, 2);
  EXPECT_EQ(SumOf(*back), (std::vector<float>{3.5f, 4, 5, 5}));
  // Restored, and the workers had gone on two steps after the checkpoint: those means are
  // not in it.
  auto skipped = Shard::FromRecord(r);
  ASSERT_TRUE(skipped.ok());
  MeanStep(*skipped, {1, 1, 1, 1}, 4);
  EXPECT_EQ(SumCode(*skipped), absl::StatusCode::kFailedPrecondition);
  auto still = Shard::FromRecord(skipped->ToRecord());
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(SumCode(*still), absl::StatusCode::kFailedPrecondition) << "lost, checkpointed";
  // Asked to keep the sum after it stepped (or restored without it): the means are gone.
  Shard late = Make();
  MeanStep(late, {1, 1, 1, 1}, 0);
  late.KeepSum();
  EXPECT_EQ(SumCode(late), absl::StatusCode::kFailedPrecondition);
  // A slice that keeps none answers a Replica pull as before (the published replica).
  Shard plain = Make();
  plain.Initialize(Raw({1, 2, 3, 4}));
  EXPECT_FALSE(plain.keeps_sum());
  EXPECT_FALSE(plain.ToRecord().keep_sum);
  EXPECT_EQ(SumOf(plain), (std::vector<float>{1, 2, 3, 4}));
}

TEST(Shard, CheckpointRecordRoundTripsEveryPartOfTheState) {
  Shard s = Make();
  s.Initialize(Raw({1, 2, 3, 4}));
  OptimizerConfig adam = Kind(OptimizerKind::kAdam);
  for (uint64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(AddPushBytes(s, 0, step, Dense({0.5f, -1, 2, 0.25f})).ok());
    ASSERT_TRUE(s.CompleteStepIfReady({0}, adam));
    ASSERT_TRUE(s.AnswerPull({"r", 1, 0, step, Shard::Format::kRecompressed}).ok());
  }
  const SliceRecord r = s.ToRecord();
  EXPECT_EQ(r.version, 3u);
  EXPECT_EQ(r.adam_t, 3u);
  EXPECT_EQ(r.down_version, 3u);
  EXPECT_EQ(r.down_base, 2u);
  auto back = Shard::FromRecord(r);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->restored());
  const SliceRecord again = back->ToRecord();
  EXPECT_EQ(again.key, r.key);
  EXPECT_EQ(again.name, r.name);
  EXPECT_EQ(again.params, r.params);
  EXPECT_EQ(again.m, r.m);
  EXPECT_EQ(again.v, r.v);
  EXPECT_EQ(again.published, r.published);
  EXPECT_EQ(again.residue, r.residue);
  // The restored shard continues exactly as the original.
  ASSERT_TRUE(AddPushBytes(s, 0, 3, Dense({1, 1, 1, 1})).ok());
  ASSERT_TRUE(AddPushBytes(*back, 0, 3, Dense({1, 1, 1, 1})).ok());
  ASSERT_TRUE(s.CompleteStepIfReady({0}, adam));
  ASSERT_TRUE(back->CompleteStepIfReady({0}, adam));
  EXPECT_EQ(std::memcmp(s.params().data(), back->params().data(), 4 * sizeof(float)), 0);
  // ... and so do its recompressed pulls: the record holds the downlink's settled state
  // (the last version's deferred fix-ups applied).
  auto mine = s.AnswerPull({"r", 1, 0, 3, Shard::Format::kRecompressed});
  auto theirs = back->AnswerPull({"r", 1, 0, 3, Shard::Format::kRecompressed});
  ASSERT_TRUE(mine.ok() && theirs.ok());
  ASSERT_TRUE(mine->payload && theirs->payload);
  EXPECT_EQ(*mine->payload, *theirs->payload);
  EXPECT_EQ(std::memcmp(s.published().data(), back->published().data(), 4 * sizeof(float)), 0);
  back->Initialize(Raw({9, 9, 9, 9}));  // restored: initial values ignored
  EXPECT_NE(back->params()[0], 9.0f);
  SliceRecord bad = r;
  bad.published.pop_back();
  EXPECT_EQ(Shard::FromRecord(bad).status().code(), absl::StatusCode::kDataLoss);
}

// A restored shard at its checkpoint's step 5; the workers' steps went on to 8 and 9 (one
// worker's answer of step 8 was lost with the old server).
Shard RestoredAtStepFive() {
  Shard s = Make();
  SumSteps(s, 5);
  return *Shard::FromRecord(s.ToRecord());
}

TEST(Shard, RestoredShardGoesOnAtTheWorkersStepAndDropsAPushOfAStepCompletedBefore) {
  const OptimizerConfig sum = Kind(OptimizerKind::kSumOnly);
  Shard s = RestoredAtStepFive();
  ASSERT_EQ(s.version(), 5u);
  // Worker 1 pushes step 8 again (its answer was lost): the shard moves to step 8.
  ASSERT_TRUE(AddPushBytes(s, 1, 8, Dense({1, 1, 1, 1})).ok());
  EXPECT_EQ(s.version(), 8u);
  s.Hold(DensePull(9));
  // Worker 0 saw step 8 complete and pushes step 9: step 8 completed before the restart,
  // its sum (worker 1's push) is dropped and the pull for version 9 is ready.
  ASSERT_TRUE(AddPushBytes(s, 0, 9, Dense({1, 1, 1, 1})).ok());
  EXPECT_EQ(s.version(), 9u);
  EXPECT_EQ(s.TakeReadyPulls().size(), 1u);
  // A push of step 8 now is acknowledged and not applied: it was, before the restart.
  ASSERT_TRUE(AddPushBytes(s, 1, 8, Dense({100, 100, 100, 100})).ok());
  ASSERT_TRUE(AddPushBytes(s, 1, 9, Dense({1, 1, 1, 1})).ok());
  ASSERT_TRUE(s.CompleteStepIfReady({0, 1}, sum));
  EXPECT_EQ(s.version(), 10u);
  EXPECT_EQ(std::vector<float>(s.params().begin(), s.params().end()),
            (std::vector<float>{7, 7, 7, 7}));  // 5 restored steps of 1, then one of 2
  // From the first completed step on, steps are checked again.
  EXPECT_EQ(AddPushBytes(s, 0, 12, Dense({1, 1, 1, 1})).code(),
            absl::StatusCode::kFailedPrecondition);
  // (Worker 0's push of step 9 again: applied once already.)
  EXPECT_EQ(AddPushBytes(s, 0, 9, Dense({1, 1, 1, 1})).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s.version(), 10u);
}

// A restored shard at step 5; worker 0 saw step 5 complete before the restart (it has no
// operation in flight on this slice: it waits on another), worker 1's answer of step 5 was
// lost and it pushes step 5 again. Without worker 0's word the step waits for a push worker
// 0 made already (grow_under_faults.sh: every worker waited until the retries ran out).
TEST(Shard, RestoredShardGoesOnAtAVersionAWorkerSawBeforeTheRestart) {
  const OptimizerConfig sum = Kind(OptimizerKind::kSumOnly);
  Shard s = RestoredAtStepFive();
  ASSERT_TRUE(AddPushBytes(s, 1, 5, Dense({100, 100, 100, 100})).ok());
  s.Hold(DensePull(6));
  EXPECT_FALSE(s.CompleteStepIfReady({0, 1}, sum));
  EXPECT_FALSE(s.ResumeAt(5));  // not ahead: nothing changes
  EXPECT_EQ(s.version(), 5u);
  EXPECT_TRUE(s.ResumeAt(6));
  EXPECT_EQ(s.version(), 6u);
  EXPECT_EQ(s.TakeReadyPulls().size(), 1u);  // worker 1's pull is answered
  // Step 5's sum was dropped (that step completed before the restart); a resent push of it
  // is acknowledged and not applied, and step 6 goes on with both workers.
  ASSERT_TRUE(AddPushBytes(s, 1, 5, Dense({100, 100, 100, 100})).ok());
  ASSERT_TRUE(AddPushBytes(s, 0, 6, Dense({1, 1, 1, 1})).ok());
  ASSERT_TRUE(AddPushBytes(s, 1, 6, Dense({1, 1, 1, 1})).ok());
  ASSERT_TRUE(s.CompleteStepIfReady({0, 1}, sum));
  EXPECT_EQ(s.version(), 7u);
  EXPECT_EQ(std::vector<float>(s.params().begin(), s.params().end()),
            (std::vector<float>{7, 7, 7, 7}));  // 5 restored steps of 1, then one of 2
  // Once a step completed, a worker's word moves nothing.
  EXPECT_FALSE(s.ResumeAt(9));
  EXPECT_EQ(s.version(), 7u);
}

TEST(Shard, AFreshShardNeverResumesAtAVersionAWorkerSaw) {
  Shard s = Make();
  EXPECT_FALSE(s.ResumeAt(3));
  EXPECT_EQ(s.version(), 0u);
}

TEST(Shard, AFreshShardNeverJumpsToAnotherStep) {
  Shard s = Make();
  EXPECT_EQ(AddPushBytes(s, 0, 3, Dense({1, 1, 1, 1})).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.version(), 0u);
}

TEST(Shard, ZeroLengthOrBinSizeIsRefused) {
  EXPECT_EQ(Shard::Create(1, "x", 0, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Shard::Create(1, "x", 4, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace adaps

namespace adaps {
namespace {

// The engine's time per version for the workers' breakdown: a step's pushes add up, the
// completing one closes the step into the new version's work, publishing adds to it, and
// the next step starts from zero.
TEST(Shard, WorkOfAStepBecomesItsVersionsWorkAndPublishingAddsToIt) {
  auto shard = Shard::Create(1, "w", 8, 4);
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(shard->version_work_us(), 0u);
  shard->CountStepWork(absl::Microseconds(30), /*completed=*/false);
  EXPECT_EQ(shard->version_work_us(), 0u);  // the step is still open
  shard->CountStepWork(absl::Microseconds(50), /*completed=*/true);
  EXPECT_EQ(shard->version_work_us(), 80u);
  shard->CountPublishWork(absl::Microseconds(20));
  EXPECT_EQ(shard->version_work_us(), 100u);
  shard->CountStepWork(absl::Microseconds(7), /*completed=*/false);
  EXPECT_EQ(shard->version_work_us(), 100u);
  shard->CountStepWork(absl::Microseconds(5), /*completed=*/true);
  EXPECT_EQ(shard->version_work_us(), 12u);
}

}  // namespace
}  // namespace adaps
