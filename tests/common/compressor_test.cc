// Behaviour of the baseline compressors (dense, Top-k, sign) and of the shared pieces of the
// compressor interface. AdaComp has its own file.
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/compressor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace adaps {
namespace {

using ::testing::ElementsAre;

std::unique_ptr<Compressor> Make(CompressorKind kind, double fraction = 0.001) {
  CompressorOptions o;
  o.kind = kind;
  o.topk_fraction = fraction;
  auto c = MakeCompressor(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

std::vector<float> Residue(const SliceState& s) {
  return std::vector<float>(s.residue().begin(), s.residue().end());
}

TEST(Dense, SendsTheGradientAndKeepsNoResidue) {
  auto c = Make(CompressorKind::kDense);
  SliceState state(3);
  CompressedUpdate u;
  ASSERT_TRUE(c->Compress(std::vector<float>{1, -2, 3}, state, u).ok());
  EXPECT_THAT(u.values, ElementsAre(1, -2, 3));
  EXPECT_THAT(Residue(state), ElementsAre(0, 0, 0));
}

TEST(TopK, SendsExactlyKLargestAndZeroesTheirResidue) {
  auto c = Make(CompressorKind::kTopK, 0.3);  // k = round(0.3 * 10) = 3
  SliceState state(10);
  const std::vector<float> g = {0.1f, -5, 0.2f, 4, 0, -0.3f, 3, 0.05f, -2.9f, 1};
  CompressedUpdate u;
  ASSERT_TRUE(c->Compress(g, state, u).ok());
  EXPECT_THAT(u.indices, ElementsAre(1u, 3u, 6u));
  EXPECT_THAT(u.values, ElementsAre(-5, 4, 3));
  const std::vector<float> r = Residue(state);
  EXPECT_EQ(r[1], 0);
  EXPECT_EQ(r[3], 0);
  EXPECT_EQ(r[6], 0);
  EXPECT_FLOAT_EQ(r[8], -2.9f);
}

TEST(TopK, BreaksTiesInIndexOrderToSendExactlyK) {
  auto c = Make(CompressorKind::kTopK, 0.5);  // k = 4 of 8, six values tie at magnitude 1
  SliceState state(8);
  const std::vector<float> g = {1, -1, 2, 1, 1, 0, -1, 1};
  CompressedUpdate u;
  ASSERT_TRUE(c->Compress(g, state, u).ok());
  EXPECT_THAT(u.indices, ElementsAre(0u, 1u, 2u, 3u));
}

// A zero is never sent: with fewer than k nonzero elements Top-k sends every nonzero one
// and nothing else (so a fraction of 1 sends a row-sparse gradient exactly, at its own size).
TEST(TopK, NeverSendsAZero) {
  auto c = Make(CompressorKind::kTopK, 0.5);  // k = 4 of 8, three nonzero
  SliceState state(8);
  const std::vector<float> g = {0, 2, 0, 0, -1, 0, 0, 0.5f};
  CompressedUpdate u;
  ASSERT_TRUE(c->Compress(g, state, u).ok());
  EXPECT_THAT(u.indices, ElementsAre(1u, 4u, 7u));
  EXPECT_THAT(u.values, ElementsAre(2.0f, -1.0f, 0.5f));
  auto all = Make(CompressorKind::kTopK, 1.0);
  SliceState zeros(8);
  ASSERT_TRUE(all->Compress(std::vector<float>(8, 0.0f), zeros, u).ok());
  EXPECT_TRUE(u.indices.empty());
}

TEST(TopK, ResidueAccumulatesAcrossSteps) {
  auto c = Make(CompressorKind::kTopK, 0.25);  // k = 1 of 4
  SliceState state(4);
  CompressedUpdate u;
  ASSERT_TRUE(c->Compress(std::vector<float>{3, 2, 0, 0}, state, u).ok());
  EXPECT_THAT(u.indices, ElementsAre(0u));
  ASSERT_TRUE(c->Compress(std::vector<float>{0, 2, 0, 0}, state, u).ok());
  EXPECT_THAT(u.indices, ElementsAre(1u));
  EXPECT_THAT(u.values, ElementsAre(4));
}

TEST(Sign, SendsMeansOfPositivesAndNegativesWithErrorFeedback) {
  auto c = Make(CompressorKind::kSign);
  SliceState state(4);
  CompressedUpdate u;
  ASSERT_TRUE(c->Compress(std::vector<float>{1, 3, -2, -4}, state, u).ok());
  EXPECT_FLOAT_EQ(u.scale, 2.0f);
  EXPECT_FLOAT_EQ(u.scale_neg, -3.0f);
  std::vector<float> decoded(4, 0.0f);
  ASSERT_TRUE(DecompressAdd(u, 1.0f, absl::MakeSpan(decoded)).ok());
  EXPECT_THAT(decoded, ElementsAre(2, 2, -3, -3));
  EXPECT_THAT(Residue(state), ElementsAre(-1, 1, 1, -1));
}

TEST(Compressors, ConserveMassForEveryKind) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (CompressorKind kind : {CompressorKind::kDense, CompressorKind::kAdaComp,
                              CompressorKind::kTopK, CompressorKind::kSign}) {
    auto c = Make(kind, 0.01);
    SliceState state(1000);
    CompressedUpdate u;
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g(1000);
      for (float& v : g) v = normal(rng);
      const std::vector<float> before = Residue(state);
      ASSERT_TRUE(c->Compress(g, state, u).ok());
      std::vector<float> decoded(1000, 0.0f);
      ASSERT_TRUE(DecompressAdd(u, 1.0f, absl::MakeSpan(decoded)).ok());
      for (size_t i = 0; i < g.size(); ++i) {
        ASSERT_NEAR(before[i] + g[i], state.residue()[i] + decoded[i], 1e-5f)
            << CompressorKindName(kind) << " i=" << i;
      }
    }
  }
}

TEST(Compressors, RejectNonFiniteGradientsWithoutTouchingTheResidue) {
  for (CompressorKind kind : {CompressorKind::kDense, CompressorKind::kAdaComp,
                              CompressorKind::kTopK, CompressorKind::kSign}) {
    auto c = Make(kind, 0.5);
    SliceState state(4);
    CompressedUpdate u;
    ASSERT_TRUE(c->Compress(std::vector<float>{1, 2, 3, 4}, state, u).ok());
    const std::vector<float> before = Residue(state);
    const absl::Status st =
        c->Compress(std::vector<float>{1, std::numeric_limits<float>::quiet_NaN(), 3, 4}, state, u);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << CompressorKindName(kind);
    EXPECT_EQ(Residue(state), before) << CompressorKindName(kind);
  }
}

TEST(Options, InvalidOptionsAreRejected) {
  CompressorOptions o;
  o.kind = CompressorKind::kAdaComp;
  o.bin_size = 0;
  EXPECT_EQ(MakeCompressor(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.kind = CompressorKind::kTopK;
  for (double f : {0.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    o.topk_fraction = f;
    EXPECT_EQ(MakeCompressor(o).status().code(), absl::StatusCode::kInvalidArgument) << f;
  }
}

TEST(Options, KindNamesRoundTrip) {
  for (CompressorKind k : {CompressorKind::kDense, CompressorKind::kAdaComp,
                           CompressorKind::kTopK, CompressorKind::kSign}) {
    auto parsed = ParseCompressorKind(CompressorKindName(k));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_EQ(ParseCompressorKind("gzip").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DecompressAdd, AppliesTheFactorForAveraging) {
  CompressedUpdate u;
  u.kind = CompressorKind::kAdaComp;
  u.length = 4;
  u.bin_size = 4;
  u.scale = 2.0f;
  u.indices = {1, 3};
  u.negative = {0, 1};
  std::vector<float> dst = {1, 1, 1, 1};
  ASSERT_TRUE(DecompressAdd(u, 0.25f, absl::MakeSpan(dst)).ok());
  EXPECT_THAT(dst, ElementsAre(1, 1.5f, 1, 0.5f));
}

TEST(DecompressAdd, MalformedUpdateLeavesDestinationUnchanged) {
  CompressedUpdate u;
  u.kind = CompressorKind::kAdaComp;
  u.length = 4;
  u.bin_size = 4;
  u.scale = 1.0f;
  u.indices = {0, 4};  // 4 is past the end
  u.negative = {0, 0};
  std::vector<float> dst = {1, 1, 1, 1};
  EXPECT_EQ(DecompressAdd(u, 1.0f, absl::MakeSpan(dst)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dst, ElementsAre(1, 1, 1, 1));
  std::vector<float> shorter(3, 0.0f);
  u.indices = {0, 1};
  EXPECT_EQ(DecompressAdd(u, 1.0f, absl::MakeSpan(shorter)).code(),
            absl::StatusCode::kInvalidArgument);
  u.indices = {1, 1};  // repeated index
  EXPECT_EQ(DecompressAdd(u, 1.0f, absl::MakeSpan(dst)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dst, ElementsAre(1, 1, 1, 1));
}

}  // namespace
}  // namespace adaps
