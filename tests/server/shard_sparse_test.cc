// Sparse pulls on one server shard (server/shard.h, Format::kSparse): the answers keep a
// worker's replica bit for bit equal to the parameters over many steps (SGD, mean, a fusion
// bucket, a worker that dies mid-step, a restored shard), the answer is whichever of sparse
// and dense is smaller at every density, and it is dense whenever sparse could not be exact.
// The worker's side is the codec's DecodeAssignCopy and the forwarded answers' replays
// (DecodeForwardedCopy, DecodeForwardedSgdCopy), as worker/tensor.cc applies them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "common/compressor.h"
#include "common/wire_codec.h"
#include "gtest/gtest.h"
#include "tests/server/parsed_push.h"
#include "server/shard.h"

namespace adaps {
namespace {

std::vector<float> Random(uint32_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<uint8_t> Raw(absl::Span<const float> values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

OptimizerConfig Sgd(float lr = 0.1f) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.learning_rate = lr;
  c.weight_decay = 0.0f;
  return c;
}

// What the engine passes AddPush (server/engine_thread.cc): servers running SGD that a
// sparse step allows step a tracked step push by push.
bool EachPush(const OptimizerConfig& c) {
  return c.kind == OptimizerKind::kSgd && SparseStepAllowed(c).ok();
}

OptimizerConfig Mean() {
  OptimizerConfig c;
  c.kind = OptimizerKind::kMean;
  return c;
}

// One worker: AdaComp over a slice (or the members of a bucket), with its residues.
struct Pusher {
  std::vector<WireSegment> table;  // one segment: a plain slice
  std::vector<std::unique_ptr<Compressor>> compressors;
  std::vector<SliceState> residues;
  explicit Pusher(std::vector<WireSegment> t) : table(std::move(t)) {
    for (const WireSegment& seg : table) {
      CompressorOptions o;
      o.kind = CompressorKind::kAdaComp;
      o.bin_size = seg.bin_size;
      compressors.push_back(*MakeCompressor(o));
      residues.emplace_back(seg.length);
    }
  }
  std::vector<uint8_t> Push(std::mt19937& rng, bool segmented) {
    std::vector<std::vector<uint8_t>> parts;
    for (size_t i = 0; i < table.size(); ++i) {
      CompressedUpdate u;
      EXPECT_TRUE(
          compressors[i]->Compress(Random(table[i].length, rng, 0.1f), residues[i], u).ok());
      parts.emplace_back();
      EXPECT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &parts.back()).ok());
    }
    if (!segmented) return parts[0];
    std::vector<absl::Span<const uint8_t>> spans(parts.begin(), parts.end());
    std::vector<uint8_t> out;
    EXPECT_TRUE(EncodeSegmented(table, spans, &out).ok());
    return out;
  }
};

// A worker's replica of a slice pulled sparse: what worker/tensor.cc ApplyPull does.
struct Replica {
  std::vector<float> values;
  uint64_t version = 0;
  // Applies `a` (kSparse or kDense); false when it does not apply to this replica.
  bool Apply(const Shard::Answer& a) {
    if (a.format == Shard::Format::kDense) {
      if (a.payload->size() != values.size() * sizeof(float)) return false;
      std::memcpy(values.data(), a.payload->data(), a.payload->size());
      version = a.version;
      return true;
    }
    if (a.format == Shard::Format::kForwarded) {
      // A mean step's pushes (the whole mean), or an SGD step's (on the version before).
      std::vector<float> copy(values.size());
      if (a.payload == nullptr || (!a.zero_base && a.base != version)) return false;
      if (!(a.zero_base ? DecodeForwardedCopy(*a.payload, absl::MakeSpan(values),
                                              absl::MakeSpan(copy))
                        : DecodeForwardedSgdCopy(*a.payload, absl::MakeSpan(values),
                                                 absl::MakeSpan(copy)))
               .ok()) {
        return false;
      }
      version = a.version;
      return std::memcmp(values.data(), copy.data(), values.size() * sizeof(float)) == 0;
    }
    if (a.format != Shard::Format::kSparse) return false;
    if (a.payload == nullptr) return a.version == version;
    if (!a.zero_base && a.base != version) return false;
    std::vector<float> copy(values.size());
    if (!DecodeAssignCopy(*a.payload, a.zero_base, absl::MakeSpan(values), absl::MakeSpan(copy))
             .ok()) {
      return false;
    }
    version = a.version;
    return true;
  }
};

// A Top-k update of `value` at each element with probability `density`.
CompressedUpdate TopKAt(uint32_t length, double density, float value, std::mt19937& rng) {
  CompressedUpdate u;
  u.kind = CompressorKind::kTopK;
  u.length = length;
  for (uint32_t i = 0; i < length; ++i) {
    if (std::uniform_real_distribution<double>()(rng) < density) {
      u.indices.push_back(i);
      u.values.push_back(value);
    }
  }
  return u;
}

Shard::Pull SparsePull(uint64_t have) {
  return Shard::Pull{"r", 1, 0, have, Shard::Format::kSparse};
}

void ExpectSameFloats(absl::Span<const float> a, absl::Span<const float> b, int step) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "step " << step;
}

// `workers` pushing AdaComp each step; worker `dies` (if >= 0) pushes its last step at
// `die_at` and is then gone from the live set (mid-step: its push of that step is in).
struct Scenario {
  int workers = 3;
  int steps = 60;
  int dies = -1;
  int die_at = 0;
  bool bucket = false;
  OptimizerConfig optimizer = Sgd();
  // Both shards keep the running sum (Shard::KeepSum): after every step a Replica pull of
  // each must be the worker's anchor (the initial values plus each mean it pulled, added
  // in float32), bit for bit.
  bool keep_sum = false;
};

// A Replica pull's answer as floats.
std::vector<float> ReplicaOf(Shard& shard) {
  auto a = shard.AnswerPull(Shard::Pull{"r", 1, 0, 0, Shard::Format::kReplica});
  EXPECT_TRUE(a.ok()) << a.status();
  if (!a.ok()) return {};
  EXPECT_EQ(a->format, Shard::Format::kReplica);
  EXPECT_EQ(a->version, shard.version());
  std::vector<float> out(a->payload->size() / sizeof(float));
  std::memcpy(out.data(), a->payload->data(), a->payload->size());
  return out;
}

// Drives one shard through `run` with a sparse puller, and a twin fed the same pushes with
// a dense puller (its steps are full passes); the replica must be the parameters, and the
// parameters the twin's, bit for bit, after every step. Returns the answers' formats.
std::vector<Shard::Format> ExpectReplicaFollowsTheParameters(const Scenario& run) {
  std::mt19937 rng(17);
  const std::vector<WireSegment> table =
      run.bucket ? std::vector<WireSegment>{{120, 50}, {7, 3}, {2000, 500}}
                 : std::vector<WireSegment>{{5000, 50}};
  uint32_t length = 0;
  for (const WireSegment& seg : table) length += seg.length;
  Shard shard = run.bucket ? *Shard::CreateBucket(9, "b", table)
                           : *Shard::Create(7, "t", length, table[0].bin_size);
  Shard twin = run.bucket ? *Shard::CreateBucket(9, "b", table)
                          : *Shard::Create(7, "t", length, table[0].bin_size);
  const std::vector<float> init = Random(length, rng);
  shard.Initialize(Raw(init));
  twin.Initialize(Raw(init));
  std::vector<Pusher> pushers;
  for (int w = 0; w < run.workers; ++w) pushers.emplace_back(table);
  Replica replica{init, 0};
  std::vector<float> anchor = init;  // run.keep_sum
  if (run.keep_sum) {
    shard.KeepSum();
    twin.KeepSum();
    ExpectSameFloats(ReplicaOf(shard), anchor, -1);  // before any step: the initial values
  }
  std::set<int> live;
  for (int w = 0; w < run.workers; ++w) live.insert(w);
  std::vector<Shard::Format> formats;
  for (int step = 0; step < run.steps; ++step) {
    for (int w : live) {
      const std::vector<uint8_t> push = pushers[w].Push(rng, run.bucket);
      EXPECT_TRUE(AddPushBytes(shard, w, step, push, 0, EachPush(run.optimizer)).ok());
      EXPECT_TRUE(AddPushBytes(twin, w, step, push, 0, EachPush(run.optimizer)).ok());
    }
    if (step == run.die_at && run.dies >= 0) {
      live.erase(run.dies);  // the view without it: the step completes with its push in
    }
    EXPECT_TRUE(shard.CompleteStepIfReady(live, run.optimizer)) << step;
    EXPECT_TRUE(twin.CompleteStepIfReady(live, run.optimizer)) << step;
    EXPECT_TRUE(twin.AnswerPull(Shard::Pull{"r", 1, 0, 0, Shard::Format::kDense}).ok());
    if (EachPush(run.optimizer)) {
      // The twin's untracked steps run on the pushes' sum: the same step, rounded otherwise.
      for (size_t i = 0; i < twin.params().size(); ++i) {
        EXPECT_NEAR(shard.params()[i], twin.params()[i],
                    1e-5f * std::max(1.0f, std::abs(twin.params()[i])))
            << "step " << step << " " << i;
      }
    } else {
      ExpectSameFloats(shard.params(), twin.params(), step);
    }
    auto answer = shard.AnswerPull(SparsePull(replica.version));
    EXPECT_TRUE(answer.ok()) << answer.status();
    if (!answer.ok()) return formats;
    formats.push_back(answer->format);
    EXPECT_TRUE(replica.Apply(*answer)) << step;
    EXPECT_EQ(replica.version, shard.version());
    ExpectSameFloats(replica.values, shard.params(), step);
    if (run.keep_sum) {
      for (size_t i = 0; i < anchor.size(); ++i) anchor[i] += replica.values[i];
      ExpectSameFloats(ReplicaOf(shard), anchor, step);
      ExpectSameFloats(ReplicaOf(twin), anchor, step);
    }
  }
  return formats;
}

size_t Count(const std::vector<Shard::Format>& formats, Shard::Format f) {
  return std::count(formats.begin(), formats.end(), f);
}

TEST(ShardSparse, SgdAnswersKeepTheReplicaBitForBitTheParameters) {
  const auto formats = ExpectReplicaFollowsTheParameters(Scenario{});
  // The first step was not tracked yet (no sparse pull had come): dense; then the pushes
  // forwarded (AdaComp's sign bits against the merged list's floats), replayed exactly.
  EXPECT_EQ(formats.front(), Shard::Format::kDense);
  EXPECT_EQ(Count(formats, Shard::Format::kForwarded), formats.size() - 1);
}

TEST(ShardSparse, MeanAnswersAreTheStepsMeanWithZerosWhereNoWorkerSent) {
  Scenario run;
  run.optimizer = Mean();
  const auto formats = ExpectReplicaFollowsTheParameters(run);
  // AdaComp pushes: forwarding them (sign bits) is smaller than the merged list (floats).
  EXPECT_EQ(Count(formats, Shard::Format::kForwarded), formats.size() - 1);
}

// Local mode's update exchange with exact pulls: a mean shard keeping the running sum
// (DeclareSlice.keep_sum) answers a Replica pull with every worker's anchor, bit for bit,
// whether its steps are tracked (sparse: the sum changes where the step did) or full passes
// (the twin), for a plain slice and a bucket, and with a worker that dies mid-step.
TEST(ShardSparse, ARunningSumIsEveryWorkersAnchorBitForBit) {
  for (const bool bucket : {false, true}) {
    SCOPED_TRACE(bucket ? "bucket" : "plain slice");
    Scenario run;
    run.optimizer = Mean();
    run.keep_sum = true;
    run.bucket = bucket;
    run.steps = 30;
    run.dies = 1;
    run.die_at = 11;
    ExpectReplicaFollowsTheParameters(run);
  }
}

TEST(ShardSparse, ABucketsAnswersKeepEveryMemberBitForBit) {
  Scenario run;
  run.bucket = true;
  const auto formats = ExpectReplicaFollowsTheParameters(run);
  EXPECT_GT(Count(formats, Shard::Format::kForwarded), 0u);
  run.optimizer = Mean();
  ExpectReplicaFollowsTheParameters(run);
}

TEST(ShardSparse, AWorkerThatDiesMidStepLeavesTheReplicaExact) {
  Scenario run;
  run.dies = 1;
  run.die_at = 20;
  ExpectReplicaFollowsTheParameters(run);
  run.optimizer = Mean();
  ExpectReplicaFollowsTheParameters(run);
}

TEST(ShardSparse, MeanUntouchedElementsAreExactlyZero) {
  Shard s = *Shard::Create(7, "t", 8, 4);
  s.Initialize(Raw(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  ASSERT_TRUE(s.AnswerPull(SparsePull(0)).ok());  // starts the tracking
  CompressedUpdate u;
  u.kind = CompressorKind::kTopK;
  u.length = 8;
  u.indices = {1, 6};
  u.values = {2.0f, -4.0f};
  std::vector<uint8_t> push;
  ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &push).ok());
  for (uint64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE(AddPushBytes(s, 0, step, push).ok());
    ASSERT_TRUE(s.CompleteStepIfReady({0}, Mean()));
  }
  EXPECT_EQ(std::vector<float>(s.params().begin(), s.params().end()),
            (std::vector<float>{0, 2, 0, 0, 0, 0, -4, 0}));
  auto a = s.AnswerPull(SparsePull(1));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->format, Shard::Format::kSparse);
  EXPECT_TRUE(a->zero_base);
  Replica r{std::vector<float>(8, 9.0f), 0};  // whatever it held: a mean answer is whole
  ASSERT_TRUE(r.Apply(*a));
  EXPECT_EQ(r.values, (std::vector<float>{0, 2, 0, 0, 0, 0, -4, 0}));
}

// Top-k pushes of a given density: the answer is sparse exactly when its bytes are fewer
// than the dense answer's.
TEST(ShardSparse, EachStepAnswersWhicheverOfSparseAndDenseIsSmaller) {
  constexpr uint32_t kLen = 4000;
  std::mt19937 rng(5);
  bool saw_sparse = false, saw_dense = false;
  for (double density : {0.001, 0.01, 0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 1.0}) {
    Shard s = *Shard::Create(7, "t", kLen, 50);
    ASSERT_TRUE(s.AnswerPull(SparsePull(0)).ok());
    const CompressedUpdate u = TopKAt(kLen, density, 0.5f, rng);
    std::vector<uint8_t> push;
    ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &push).ok());
    ASSERT_TRUE(AddPushBytes(s, 0, 0, push, 0, true).ok());
    ASSERT_TRUE(s.CompleteStepIfReady({0}, Sgd()));
    // What the sparse answer would take: the same indices, the new values.
    CompressedUpdate expect = u;
    for (size_t j = 0; j < u.indices.size(); ++j) expect.values[j] = s.params()[u.indices[j]];
    std::vector<uint8_t> sparse_bytes;
    ASSERT_TRUE(EncodeUpdate(expect, IndexCoding::kRice, &sparse_bytes).ok());
    const bool sparse_smaller = sparse_bytes.size() < kLen * sizeof(float);
    auto a = s.AnswerPull(SparsePull(0));
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->format, sparse_smaller ? Shard::Format::kSparse : Shard::Format::kDense)
        << "density " << density;
    if (a->format == Shard::Format::kSparse) {
      EXPECT_EQ(*a->payload, sparse_bytes) << density;
      saw_sparse = true;
    } else {
      EXPECT_EQ(a->payload->size(), kLen * sizeof(float));
      saw_dense = true;
    }
  }
  EXPECT_TRUE(saw_sparse && saw_dense);
}

// A mean step answers whichever of the merged list, the forwarded pushes and dense is
// smallest: forwarded for AdaComp pushes (in the order they arrived), the merged list when
// the workers sent the same elements as floats, dense when both are larger.
TEST(ShardSparse, AMeanStepAnswersTheSmallestOfMergedForwardedAndDense) {
  constexpr uint32_t kLen = 4000;
  std::mt19937 rng(3);
  // AdaComp pushes from 3 workers, arriving 2, 0, 1.
  {
    Shard s = *Shard::Create(7, "t", kLen, 50);
    ASSERT_TRUE(s.AnswerPull(SparsePull(0)).ok());
    std::vector<Pusher> pushers;
    for (int w = 0; w < 3; ++w) pushers.emplace_back(std::vector<WireSegment>{{kLen, 50}});
    std::vector<std::vector<uint8_t>> sent;
    for (int w : {2, 0, 1}) {
      sent.push_back(pushers[w].Push(rng, false));
      ASSERT_TRUE(AddPushBytes(s, w, 0, sent.back()).ok());
    }
    ASSERT_TRUE(s.CompleteStepIfReady({0, 1, 2}, Mean()));
    auto a = s.AnswerPull(SparsePull(0));
    ASSERT_TRUE(a.ok());
    ASSERT_EQ(a->format, Shard::Format::kForwarded);
    EXPECT_TRUE(a->zero_base);
    std::vector<uint8_t> want;
    ASSERT_TRUE(EncodeForwarded(1.0f / 3.0f, {sent[0], sent[1], sent[2]}, &want).ok());
    EXPECT_EQ(*a->payload, want);
    // Worker 0 (second to arrive) holding its push of step 0: the answer leaves it out; a
    // pull that holds another step's push, or none, gets the whole answer.
    Shard::Pull mine = SparsePull(0);
    mine.worker = 0;
    mine.held_push = 1;
    auto own = s.AnswerPull(mine);
    ASSERT_TRUE(own.ok());
    ASSERT_EQ(own->format, Shard::Format::kForwarded);
    ASSERT_TRUE(EncodeForwarded(1.0f / 3.0f, {sent[0], sent[1], sent[2]}, &want, 1).ok());
    EXPECT_EQ(*own->payload, want);
    EXPECT_EQ(own->payload->size() + sent[1].size(), a->payload->size());
    std::vector<float> values(kLen), copy(kLen);
    const absl::Span<const uint8_t> held = sent[1];
    ASSERT_TRUE(DecodeForwardedCopy(*own->payload, absl::MakeSpan(values), absl::MakeSpan(copy),
                                    &held).ok());
    ExpectSameFloats(values, s.params(), 0);
    mine.held_push = 0;
    EXPECT_EQ(*s.AnswerPull(mine)->payload, *a->payload);
    mine.held_push = 2;
    EXPECT_EQ(*s.AnswerPull(mine)->payload, *a->payload);
    mine.held_push = 1;
    mine.worker = 5;  // not among the step's pushers
    EXPECT_EQ(*s.AnswerPull(mine)->payload, *a->payload);
  }
  // The same Top-k elements from every worker: one merged list beats three forwarded ones;
  // at nearly every element, both are larger than dense.
  for (double density : {0.02, 0.99}) {
    Shard s = *Shard::Create(7, "t", kLen, 50);
    ASSERT_TRUE(s.AnswerPull(SparsePull(0)).ok());
    std::vector<uint8_t> push;
    ASSERT_TRUE(EncodeUpdate(TopKAt(kLen, density, 0.25f, rng), IndexCoding::kRice, &push).ok());
    for (int w = 0; w < 3; ++w) ASSERT_TRUE(AddPushBytes(s, w, 0, push).ok());
    ASSERT_TRUE(s.CompleteStepIfReady({0, 1, 2}, Mean()));
    auto a = s.AnswerPull(SparsePull(0));
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->format, density < 0.1 ? Shard::Format::kSparse : Shard::Format::kDense)
        << density;
    Replica r{std::vector<float>(kLen, 1.0f), 0};
    ASSERT_TRUE(r.Apply(*a));
    ExpectSameFloats(r.values, s.params(), 0);
  }
}

// An SGD step's answer is its pushes forwarded with the step's learning rate (it changes
// from step to step): on the replica at the version before, the replay is the parameters
// bit for bit; the puller's own push is left out when it holds it.
TEST(ShardSparse, AnSgdStepIsForwardedWithItsRate) {
  std::mt19937 rng(8);
  Shard s = *Shard::Create(7, "t", 4000, 50);
  ASSERT_TRUE(s.AnswerPull(SparsePull(0)).ok());
  std::vector<Pusher> pushers;
  for (int w = 0; w < 4; ++w) pushers.emplace_back(std::vector<WireSegment>{{4000, 50}});
  std::vector<float> replica(s.params().begin(), s.params().end());
  for (uint64_t step = 0; step < 3; ++step) {
    const float lr = 0.1f / static_cast<float>(step + 1);
    std::vector<std::vector<uint8_t>> sent;
    for (int w : {3, 1, 0, 2}) {
      sent.push_back(pushers[w].Push(rng, false));
      ASSERT_TRUE(AddPushBytes(s, w, step, sent.back(), 0, true).ok());
    }
    ASSERT_TRUE(s.CompleteStepIfReady({0, 1, 2, 3}, Sgd(lr)));
    Shard::Pull mine = SparsePull(step);
    mine.worker = 1;  // arrived second, holds its push of this step
    mine.held_push = step + 1;
    auto a = s.AnswerPull(mine);
    ASSERT_TRUE(a.ok());
    ASSERT_EQ(a->format, Shard::Format::kForwarded) << step;
    EXPECT_FALSE(a->zero_base);
    EXPECT_EQ(a->base, step);
    std::vector<uint8_t> want;
    ASSERT_TRUE(EncodeForwardedSgd(0.25f, lr, {sent[0], sent[1], sent[2], sent[3]}, &want, 1)
                    .ok());
    EXPECT_EQ(*a->payload, want);
    const absl::Span<const uint8_t> held = sent[1];
    std::vector<float> copy(4000);
    ASSERT_TRUE(DecodeForwardedSgdCopy(*a->payload, absl::MakeSpan(replica),
                                       absl::MakeSpan(copy), &held).ok());
    ExpectSameFloats(replica, s.params(), static_cast<int>(step));
  }
}

TEST(ShardSparse, AReplicaNotAtTheVersionBeforeGetsTheDenseParameters) {
  std::mt19937 rng(2);
  Shard s = *Shard::Create(7, "t", 1000, 50);
  ASSERT_TRUE(s.AnswerPull(SparsePull(0)).ok());
  Pusher p({{1000, 50}});
  for (uint64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(AddPushBytes(s, 0, step, p.Push(rng, false), 0, true).ok());
    ASSERT_TRUE(s.CompleteStepIfReady({0}, Sgd()));
  }
  EXPECT_EQ(s.AnswerPull(SparsePull(2))->format, Shard::Format::kForwarded);
  auto behind = s.AnswerPull(SparsePull(1));
  ASSERT_TRUE(behind.ok());
  EXPECT_EQ(behind->format, Shard::Format::kDense);
  EXPECT_EQ(behind->payload->size(), 1000 * sizeof(float));
  auto same = s.AnswerPull(SparsePull(3));  // nothing new
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->format, Shard::Format::kSparse);
  EXPECT_EQ(same->payload, nullptr);
}

TEST(ShardSparse, AStepWithADenseOptimizerIsAnsweredDense) {
  std::mt19937 rng(2);
  Shard s = *Shard::Create(7, "t", 1000, 50);
  ASSERT_TRUE(s.AnswerPull(SparsePull(0)).ok());
  Pusher p({{1000, 50}});
  OptimizerConfig decayed = Sgd();
  decayed.weight_decay = 0.01f;  // e.g. set by SetHyper after the declaration
  Replica r{std::vector<float>(s.params().begin(), s.params().end()), 0};
  for (uint64_t step = 0; step < 4; ++step) {
    ASSERT_TRUE(AddPushBytes(s, 0, step, p.Push(rng, false), 0, true).ok());
    ASSERT_TRUE(s.CompleteStepIfReady({0}, step == 2 ? decayed : Sgd()));
    auto a = s.AnswerPull(SparsePull(r.version));
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->format, step == 2 ? Shard::Format::kDense : Shard::Format::kForwarded) << step;
    ASSERT_TRUE(r.Apply(*a));
    ExpectSameFloats(r.values, s.params(), static_cast<int>(step));
  }
}

TEST(ShardSparse, ARestoredShardAnswersDenseUntilItTrackedAStep) {
  std::mt19937 rng(4);
  Shard s = *Shard::Create(7, "t", 3000, 50);
  s.Initialize(Raw(Random(3000, rng)));
  Replica r{std::vector<float>(s.params().begin(), s.params().end()), 0};
  std::vector<Pusher> pushers;
  for (int w = 0; w < 2; ++w) pushers.emplace_back(std::vector<WireSegment>{{3000, 50}});
  ASSERT_TRUE(s.AnswerPull(SparsePull(0)).ok());
  for (uint64_t step = 0; step < 5; ++step) {
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(AddPushBytes(s, w, step, pushers[w].Push(rng, false), 0, true).ok());
    }
    ASSERT_TRUE(s.CompleteStepIfReady({0, 1}, Sgd()));
    ASSERT_TRUE(r.Apply(*s.AnswerPull(SparsePull(r.version))));
  }
  auto restored = Shard::FromRecord(s.ToRecord());
  ASSERT_TRUE(restored.ok());
  Shard& t = *restored;
  std::vector<Shard::Format> formats;
  for (uint64_t step = 5; step < 10; ++step) {
    // The worker resynchronizes first: a dense pull (ReplicaFormat) of the restored state.
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(AddPushBytes(t, w, step, pushers[w].Push(rng, false), 0, true).ok());
    }
    ASSERT_TRUE(t.CompleteStepIfReady({0, 1}, Sgd()));
    auto a = t.AnswerPull(SparsePull(r.version));
    ASSERT_TRUE(a.ok());
    formats.push_back(a->format);
    ASSERT_TRUE(r.Apply(*a)) << step;
    ExpectSameFloats(r.values, t.params(), static_cast<int>(step));
  }
  EXPECT_EQ(formats[0], Shard::Format::kDense);  // its first step was not tracked
  EXPECT_EQ(Count(formats, Shard::Format::kForwarded), formats.size() - 1);
}

// A restored shard drops a step half-way when the workers turn out to be past it (a later
// step's push): what that step's pushes touched is not part of the next step's answer.
TEST(ShardSparse, AStepDroppedHalfWayTouchesNothingOfTheNextStep) {
  std::mt19937 rng(8);
  const uint32_t n = 4000;
  Shard s = *Shard::Create(7, "t", n, 50);
  s.Initialize(Raw(Random(n, rng)));
  std::vector<Pusher> pushers;
  for (int w = 0; w < 3; ++w) pushers.emplace_back(std::vector<WireSegment>{{n, 50}});
  for (uint64_t step = 0; step < 3; ++step) {
    for (int w = 0; w < 3; ++w) {
      ASSERT_TRUE(AddPushBytes(s, w, step, pushers[w].Push(rng, false), 0, true).ok());
    }
    ASSERT_TRUE(s.CompleteStepIfReady({0, 1, 2}, Sgd()));
  }
  auto restored = Shard::FromRecord(s.ToRecord());
  ASSERT_TRUE(restored.ok());
  Shard& t = *restored;
  t.TrackSteps();
  // Two pushes of step 3 (each touching its own elements), then the workers are at step 4.
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(AddPushBytes(t, w, 3, pushers[w].Push(rng, false), 0, true).ok());
  }
  std::set<uint32_t> expected;
  for (int w : {2, 0, 1}) {
    const std::vector<uint8_t> push = pushers[w].Push(rng, false);
    CompressedUpdate u;
    ASSERT_TRUE(DecodeUpdate(push, &u).ok());
    expected.insert(u.indices.begin(), u.indices.end());
    ASSERT_TRUE(AddPushBytes(t, w, 4, push, 0, true).ok());
  }
  ASSERT_TRUE(t.CompleteStepIfReady({0, 1, 2}, Sgd()));
  ASSERT_EQ(t.version(), 5u);
  const std::vector<uint32_t> touched(t.last_touched().begin(), t.last_touched().end());
  EXPECT_EQ(touched, std::vector<uint32_t>(expected.begin(), expected.end()));
}

}  // namespace
}  // namespace adaps
