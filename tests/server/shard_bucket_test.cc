// A fusion bucket on the server (server/shard.h): several small tensors in one shard, each
// a segment with its own bin size, stepping bit for bit as shards of their own would.
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/compressor.h"
#include "common/wire_codec.h"
#include "gtest/gtest.h"
#include "tests/server/parsed_push.h"
#include "server/shard.h"

namespace adaps {
namespace {

const std::vector<WireSegment> kTable = {{120, 50}, {7, 3}, {300, 500}};

std::vector<uint8_t> Raw(absl::Span<const float> values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::vector<float> Random(uint32_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// A bucket of kTable declared member by member (rank 0 sends each member's values), and a
// shard of each member's own, with the same initial values. With `cap`, the bucket's
// downlink bin cap (--pull_bin_size) and each own shard's bin min(bin, cap).
struct Pair {
  Shard bucket;
  std::vector<Shard> own;
};

Pair MakePair(std::mt19937& rng, uint32_t cap = 0) {
  std::vector<std::vector<float>> init;
  for (const WireSegment& seg : kTable) init.push_back(Random(seg.length, rng));
  Shard bucket = *Shard::CreateBucket(9, "b", absl::MakeConstSpan(kTable).subspan(0, 1));
  std::vector<Shard> own;
  for (size_t i = 0; i < kTable.size(); ++i) {
    const absl::Span<const WireSegment> table = absl::MakeConstSpan(kTable).subspan(0, i + 1);
    EXPECT_TRUE(bucket.DeclareSegments(table, {}).ok());  // another worker, first
    EXPECT_TRUE(bucket.DeclareSegments(table, Raw(init[i])).ok());  // rank 0
    const uint32_t bin = cap == 0 ? kTable[i].bin_size : std::min(kTable[i].bin_size, cap);
    own.push_back(*Shard::Create(10 + i, "m", kTable[i].length, bin));
    own.back().Initialize(Raw(init[i]));
  }
  bucket.set_downlink_bin_cap(cap);
  return Pair{std::move(bucket), std::move(own)};
}

// One worker's compressors and residues, one per member.
struct WorkerSide {
  std::vector<std::unique_ptr<Compressor>> compressors;
  std::vector<SliceState> residues;
  WorkerSide() {
    for (const WireSegment& seg : kTable) {
      CompressorOptions o;
      o.kind = CompressorKind::kAdaComp;
      o.bin_size = seg.bin_size;
      compressors.push_back(*MakeCompressor(o));
      residues.emplace_back(seg.length);
    }
  }
  // Each member's encoded update of a fresh random gradient.
  std::vector<std::vector<uint8_t>> Encode(std::mt19937& rng) {
    std::vector<std::vector<uint8_t>> parts;
    for (size_t i = 0; i < kTable.size(); ++i) {
      CompressedUpdate u;
      EXPECT_TRUE(compressors[i]->Compress(Random(kTable[i].length, rng, 0.1f), residues[i], u).ok());
      parts.emplace_back();
      EXPECT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &parts.back()).ok());
    }
    return parts;
  }
};

std::vector<uint8_t> Container(const std::vector<std::vector<uint8_t>>& parts,
                               const std::vector<WireSegment>& table = kTable) {
  std::vector<absl::Span<const uint8_t>> spans(parts.begin(), parts.end());
  std::vector<uint8_t> out;
  EXPECT_TRUE(EncodeSegmented(table, spans, &out).ok());
  return out;
}

void ExpectSameFloats(absl::Span<const float> a, absl::Span<const float> b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what;
}

void ExpectBucketMatches(const Pair& p) {
  size_t at = 0;
  for (size_t i = 0; i < kTable.size(); ++i) {
    ExpectSameFloats(p.bucket.params().subspan(at, kTable[i].length), p.own[i].params(), "params");
    ExpectSameFloats(p.bucket.published().subspan(at, kTable[i].length), p.own[i].published(),
                     "published");
    at += kTable[i].length;
  }
}

TEST(ShardBucket, StepsEachMemberBitForBitAsAShardOfItsOwn) {
  std::mt19937 rng(3);
  Pair p = MakePair(rng);
  ExpectBucketMatches(p);
  WorkerSide w0, w1;
  OptimizerConfig adam;
  adam.kind = OptimizerKind::kAdam;
  adam.learning_rate = 0.01f;
  const Shard::Pull recompressed{"r", 1, 0, 0, Shard::Format::kRecompressed};
  for (int step = 0; step < 20; ++step) {
    const auto parts0 = w0.Encode(rng), parts1 = w1.Encode(rng);
    ASSERT_TRUE(AddPushBytes(p.bucket, 0, step, Container(parts0)).ok());
    ASSERT_TRUE(AddPushBytes(p.bucket, 1, step, Container(parts1)).ok());
    ASSERT_TRUE(p.bucket.CompleteStepIfReady({0, 1}, adam));
    for (size_t i = 0; i < kTable.size(); ++i) {
      ASSERT_TRUE(AddPushBytes(p.own[i], 0, step, parts0[i]).ok());
      ASSERT_TRUE(AddPushBytes(p.own[i], 1, step, parts1[i]).ok());
      ASSERT_TRUE(p.own[i].CompleteStepIfReady({0, 1}, adam));
    }
    // The recompressed pull: each segment is the member's own answer, byte for byte.
    Shard::Pull pull = recompressed;
    pull.have_version = step;
    auto fused = p.bucket.AnswerPull(pull);
    ASSERT_TRUE(fused.ok()) << fused.status();
    auto views = SplitSegmented(*fused->payload);
    ASSERT_TRUE(views.ok()) << views.status();
    ASSERT_EQ(views->size(), kTable.size());
    for (size_t i = 0; i < kTable.size(); ++i) {
      auto answer = p.own[i].AnswerPull(pull);
      ASSERT_TRUE(answer.ok());
      EXPECT_EQ(std::vector<uint8_t>((*views)[i].bytes.begin(), (*views)[i].bytes.end()),
                *answer->payload)
          << "step " << step << " member " << i;
      EXPECT_EQ((*views)[i].segment, kTable[i]);
    }
    ExpectBucketMatches(p);
  }
  // The dense pull is every member's parameters, one after another.
  auto dense = p.bucket.AnswerPull(Shard::Pull{"r", 1, 0, 0, Shard::Format::kDense});
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(dense->payload->size(), p.bucket.length() * sizeof(float));
}

// The server's --pull_bin_size reaches the members of a bucket: each segment of a
// recompressed pull is what a shard of the member at the smaller bin would publish.
TEST(ShardBucket, DownlinkBinCapEncodesEachMemberAtTheSmallerBin) {
  std::mt19937 rng(4);
  Pair p = MakePair(rng, /*cap=*/100);
  WorkerSide w0;
  OptimizerConfig sgd;
  sgd.learning_rate = 0.1f;
  Shard::Pull pull{"r", 1, 0, 0, Shard::Format::kRecompressed};
  for (int step = 0; step < 5; ++step) {
    const auto parts = w0.Encode(rng);
    ASSERT_TRUE(AddPushBytes(p.bucket, 0, step, Container(parts)).ok());
    ASSERT_TRUE(p.bucket.CompleteStepIfReady({0}, sgd));
    for (size_t i = 0; i < kTable.size(); ++i) {
      ASSERT_TRUE(AddPushBytes(p.own[i], 0, step, parts[i]).ok());
      ASSERT_TRUE(p.own[i].CompleteStepIfReady({0}, sgd));
    }
    pull.have_version = step;
    auto fused = p.bucket.AnswerPull(pull);
    ASSERT_TRUE(fused.ok()) << fused.status();
    auto views = SplitSegmented(*fused->payload);
    ASSERT_TRUE(views.ok()) << views.status();
    for (size_t i = 0; i < kTable.size(); ++i) {
      auto answer = p.own[i].AnswerPull(pull);
      ASSERT_TRUE(answer.ok());
      EXPECT_EQ(std::vector<uint8_t>((*views)[i].bytes.begin(), (*views)[i].bytes.end()),
                *answer->payload)
          << "step " << step << " member " << i;
    }
    ExpectBucketMatches(p);
  }
}

TEST(ShardBucket, GrowsOnlyUntilItSteps) {
  std::mt19937 rng(4);
  Shard b = *Shard::CreateBucket(9, "b", absl::MakeConstSpan(kTable).subspan(0, 2));
  EXPECT_EQ(b.length(), 127u);
  // An earlier declaration (a slower worker) is accepted and changes nothing.
  EXPECT_TRUE(b.DeclareSegments(absl::MakeConstSpan(kTable).subspan(0, 1), {}).ok());
  EXPECT_EQ(b.length(), 127u);
  const std::vector<WireSegment> other = {{120, 50}, {8, 3}};
  EXPECT_EQ(b.DeclareSegments(other, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.length(), 127u);
  WorkerSide w;
  auto parts = w.Encode(rng);
  parts.pop_back();
  const std::vector<WireSegment> two(kTable.begin(), kTable.begin() + 2);
  ASSERT_TRUE(AddPushBytes(b, 0, 0, Container(parts, two)).ok());
  EXPECT_EQ(b.DeclareSegments(kTable, {}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.length(), 127u);
  EXPECT_EQ(b.segments(), two);
}

TEST(ShardBucket, RefusesPushesThatDoNotMatchItsTableAndChangesNothing) {
  std::mt19937 rng(5);
  Pair p = MakePair(rng);
  WorkerSide w;
  const auto parts = w.Encode(rng);
  std::vector<WireSegment> rebinned = kTable;
  rebinned[1].bin_size = 4;  // member 1's AdaComp part says bin size 3
  std::vector<absl::Span<const uint8_t>> spans(parts.begin(), parts.end());
  std::vector<uint8_t> bad;
  EXPECT_FALSE(EncodeSegmented(rebinned, spans, &bad).ok());  // the encoder refuses it too
  // A container for other segments (the first two members swapped in size).
  std::vector<std::vector<uint8_t>> dense_parts;
  const std::vector<WireSegment> swapped = {{7, 3}, {120, 50}, {300, 500}};
  for (const WireSegment& seg : swapped) {
    dense_parts.emplace_back();
    ASSERT_TRUE(EncodeDense(Random(seg.length, rng), IndexCoding::kRice, &dense_parts.back()).ok());
  }
  const std::vector<float> before(p.bucket.params().begin(), p.bucket.params().end());
  EXPECT_EQ(AddPushBytes(p.bucket, 0, 0, Container(dense_parts, swapped)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> plain;
  ASSERT_TRUE(EncodeDense(Random(p.bucket.length(), rng), IndexCoding::kRice, &plain).ok());
  EXPECT_EQ(AddPushBytes(p.bucket, 0, 0, plain).code(), absl::StatusCode::kInvalidArgument);
  // A truncated container.
  std::vector<uint8_t> cut = Container(parts);
  cut.pop_back();
  EXPECT_EQ(AddPushBytes(p.bucket, 0, 0, cut).code(), absl::StatusCode::kDataLoss);
  ExpectSameFloats(p.bucket.params(), before, "params after refused pushes");
  // Nothing was counted: a good push of worker 0 is still its first.
  ASSERT_TRUE(AddPushBytes(p.bucket, 0, 0, Container(parts)).ok());
  EXPECT_TRUE(p.bucket.CompleteStepIfReady({0}, OptimizerConfig{}));
  // A plain slice takes no container and no table.
  Shard plain_shard = *Shard::Create(1, "p", p.bucket.length(), 50);
  EXPECT_EQ(AddPushBytes(plain_shard, 0, 0, Container(parts)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plain_shard.DeclareSegments(kTable, {}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardBucket, RestoredFromACheckpointLearnsItsTableFromThePushes) {
  std::mt19937 rng(6);
  Pair p = MakePair(rng);
  WorkerSide w;
  ASSERT_TRUE(AddPushBytes(p.bucket, 0, 0, Container(w.Encode(rng))).ok());
  ASSERT_TRUE(p.bucket.CompleteStepIfReady({0}, OptimizerConfig{}));
  Shard restored = *Shard::FromRecord(p.bucket.ToRecord());
  EXPECT_TRUE(restored.segments().empty());
  // A shorter table (a rejoining worker's first member) is accepted without being adopted.
  EXPECT_TRUE(restored.DeclareSegments(absl::MakeConstSpan(kTable).subspan(0, 1), {}).ok());
  EXPECT_TRUE(restored.segments().empty());
  ASSERT_TRUE(AddPushBytes(restored, 0, 1, Container(w.Encode(rng))).ok());
  EXPECT_EQ(restored.segments(), kTable);
  ASSERT_TRUE(restored.CompleteStepIfReady({0}, OptimizerConfig{}));
  auto answer = restored.AnswerPull(Shard::Pull{"r", 1, 0, 0, Shard::Format::kRecompressed});
  ASSERT_TRUE(answer.ok()) << answer.status();
  auto views = SplitSegmented(*answer->payload);
  ASSERT_TRUE(views.ok());
  EXPECT_EQ(views->size(), kTable.size());
}

}  // namespace
}  // namespace adaps
