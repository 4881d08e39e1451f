// The sparse answer kind on its own (server/sparse_answer.h): what it answers after each
// kind of change of version it is told (StepResult), without a shard around it. The
// answers' exactness over many steps is tests/server/shard_sparse_test.cc.
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/compressor.h"
#include "common/wire_codec.h"
#include "gtest/gtest.h"
#include "tests/server/parsed_push.h"
#include "server/sparse_answer.h"

namespace adaps {
namespace {

constexpr uint32_t kLength = 4000;

// Four workers' AdaComp pushes of one step, added as a tracked step pushed one by one.
void TrackAStep(SparseAnswer& answer, std::vector<float>& agg, std::mt19937& rng) {
  answer.BeginStep(kLength, /*step_each_push=*/true);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (int w = 0; w < 4; ++w) {
    CompressorOptions o;
    o.kind = CompressorKind::kAdaComp;
    o.bin_size = 50;
    std::unique_ptr<Compressor> c = *MakeCompressor(o);
    SliceState residue(kLength);
    std::vector<float> grad(kLength);
    for (float& x : grad) x = normal(rng);
    CompressedUpdate u;
    ASSERT_TRUE(c->Compress(grad, residue, u).ok());
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &bytes).ok());
    ASSERT_TRUE(AddPushBytes(answer, w, bytes, kLength, absl::MakeSpan(agg)).ok());
  }
  EXPECT_FALSE(answer.CollectTouched().empty());
}

StepResult SgdStep(uint64_t version, float lr) {
  StepResult r;
  r.version = version;
  r.sparse = true;
  r.sgd_by_push = true;
  r.learning_rate = lr;
  r.scale = 0.25f;
  return r;
}

SliceNow At(uint64_t version, const std::vector<float>& params) {
  SliceNow now;
  now.name = "t";
  now.version = version;
  now.params = params;
  now.bin_size = 50;
  return now;
}

SlicePull SparsePull(uint64_t have) {
  SlicePull pull;
  pull.min_version = have + 1;
  pull.have_version = have;
  pull.format = AnswerFormat::kSparse;
  return pull;
}

TEST(SparseAnswer, AStepIsTrackedFromItsFirstPushUntilTheVersionChanges) {
  SparseAnswer answer;
  EXPECT_FALSE(answer.step_tracked());
  answer.BeginStep(kLength, /*step_each_push=*/false);
  EXPECT_TRUE(answer.step_tracked());
  EXPECT_FALSE(answer.by_push());
  StepResult resumed;
  resumed.version = 5;
  answer.OnStep(resumed);
  EXPECT_FALSE(answer.step_tracked());
  EXPECT_FALSE(answer.last_sparse());
}

TEST(SparseAnswer, AnSgdStepIsForwardedOnlyAtARateAWorkerCanReplay) {
  std::mt19937 rng(3);
  const std::vector<float> params(kLength, 0.5f);
  DenseAnswer dense;
  for (float lr : {0.1f, -1.0f}) {
    SparseAnswer answer;
    std::vector<float> agg(kLength, 0.0f);
    TrackAStep(answer, agg, rng);
    answer.OnStep(SgdStep(1, lr));
    ASSERT_TRUE(answer.last_sparse());
    const SliceAnswer a = answer.Answer(SparsePull(0), At(1, params), dense);
    ASSERT_NE(a.payload, nullptr);
    // Four AdaComp pushes (sign bits) are smaller than their merged values; a negative rate
    // (a running mean's step) is not replayed, so the merged list is the smallest left.
    EXPECT_EQ(a.format, lr > 0 ? AnswerFormat::kForwarded : AnswerFormat::kSparse) << lr;
    EXPECT_EQ(a.base, 0u);
  }
}

TEST(SparseAnswer, AChangeNotKnownElementByElementIsAnsweredDense) {
  std::mt19937 rng(4);
  const std::vector<float> params(kLength, 0.25f);
  DenseAnswer dense;
  SparseAnswer answer;
  std::vector<float> agg(kLength, 0.0f);
  TrackAStep(answer, agg, rng);
  answer.OnStep(SgdStep(1, 0.1f));
  StepResult applied;  // an async push, or a restored shard going on at a later step
  applied.version = 2;
  answer.OnStep(applied);
  EXPECT_FALSE(answer.last_sparse());
  const SliceAnswer a = answer.Answer(SparsePull(1), At(2, params), dense);
  EXPECT_EQ(a.format, AnswerFormat::kDense);
  EXPECT_EQ(a.version, 2u);
  ASSERT_NE(a.payload, nullptr);
  ASSERT_EQ(a.payload->size(), kLength * sizeof(float));
  EXPECT_EQ(std::memcmp(a.payload->data(), params.data(), a.payload->size()), 0);
  // Nothing new for a replica at the version.
  const SliceAnswer none = answer.Answer(SparsePull(2), At(2, params), dense);
  EXPECT_EQ(none.format, AnswerFormat::kSparse);
  EXPECT_EQ(none.payload, nullptr);
}

}  // namespace
}  // namespace adaps
