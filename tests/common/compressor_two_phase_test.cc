// The two-phase step of every compressor (Compressor::CompressPending, SliceState::Commit and
// Discard): a pending residue changes nothing until committed, and a failed first phase
// leaves nothing pending.
#include <limits>
#include <random>
#include <vector>

#include "common/compressor.h"
#include "gtest/gtest.h"

namespace adaps {
namespace {

std::unique_ptr<Compressor> Make(CompressorKind kind) {
  CompressorOptions o;
  o.kind = kind;
  o.bin_size = 8;
  o.topk_fraction = 0.05;
  auto c = MakeCompressor(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

std::vector<float> Residue(const SliceState& s) {
  return std::vector<float>(s.residue().begin(), s.residue().end());
}

std::vector<float> Gradient(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> normal;
  std::vector<float> g(n);
  for (float& v : g) v = normal(rng);
  return g;
}

class TwoPhase : public ::testing::TestWithParam<CompressorKind> {};

TEST_P(TwoPhase, PendingThenCommitEqualsTheSingleCall) {
  auto single = Make(GetParam());
  auto two = Make(GetParam());
  SliceState a(1000), b(1000);
  CompressedUpdate ua, ub;
  std::mt19937 rng(5);
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> g = Gradient(rng, 1000);
    ASSERT_TRUE(single->Compress(g, a, ua).ok());
    ASSERT_TRUE(two->CompressPending(g, b, ub).ok());
    b.Commit();
    EXPECT_FALSE(b.pending());
    EXPECT_EQ(Residue(a), Residue(b)) << step;
    EXPECT_EQ(ua.indices, ub.indices);
    EXPECT_EQ(ua.values, ub.values);
    EXPECT_EQ(ua.sign_bits, ub.sign_bits);
    EXPECT_EQ(ua.scale, ub.scale);
  }
}

TEST_P(TwoPhase, PendingResidueIsInvisibleUntilCommitted) {
  auto c = Make(GetParam());
  SliceState state(1000);
  CompressedUpdate u;
  std::mt19937 rng(6);
  ASSERT_TRUE(c->Compress(Gradient(rng, 1000), state, u).ok());
  const std::vector<float> before = Residue(state);
  ASSERT_TRUE(c->CompressPending(Gradient(rng, 1000), state, u).ok());
  EXPECT_EQ(Residue(state), before);
  EXPECT_EQ(state.pending(), GetParam() != CompressorKind::kDense);
}

TEST_P(TwoPhase, DiscardKeepsTheResidueAndTheNextStepIsAsIfNothingHappened) {
  auto single = Make(GetParam());
  auto two = Make(GetParam());
  SliceState a(1000), b(1000);
  CompressedUpdate ua, ub;
  std::mt19937 rng(7);
  const std::vector<float> g0 = Gradient(rng, 1000), g1 = Gradient(rng, 1000),
                           g2 = Gradient(rng, 1000);
  ASSERT_TRUE(single->Compress(g0, a, ua).ok());
  ASSERT_TRUE(two->Compress(g0, b, ub).ok());
  ASSERT_TRUE(two->CompressPending(g1, b, ub).ok());
  b.Discard();
  EXPECT_FALSE(b.pending());
  b.Commit();  // nothing pending: a no-op
  EXPECT_EQ(Residue(a), Residue(b));
  ASSERT_TRUE(single->Compress(g2, a, ua).ok());
  ASSERT_TRUE(two->CompressPending(g2, b, ub).ok());
  b.Commit();
  EXPECT_EQ(Residue(a), Residue(b));
}

TEST_P(TwoPhase, NanLeavesNothingPendingAndTheResidueUnchanged) {
  auto c = Make(GetParam());
  SliceState state(1000);
  CompressedUpdate u;
  std::mt19937 rng(8);
  ASSERT_TRUE(c->Compress(Gradient(rng, 1000), state, u).ok());
  const std::vector<float> before = Residue(state);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> g = Gradient(rng, 1000);
    g[777] = bad;
    EXPECT_EQ(c->CompressPending(g, state, u).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(state.pending());
    state.Commit();
    EXPECT_EQ(Residue(state), before);
  }
}

TEST_P(TwoPhase, OverflowOfResiduePlusGradientIsOutOfRangeAndLeavesNothingPending) {
  if (GetParam() == CompressorKind::kDense) GTEST_SKIP() << "dense keeps no residue";
  auto c = Make(GetParam());
  SliceState state(64);
  CompressedUpdate u;
  // Four elements of 3e38 in four bins, the rest 1: each kind keeps part of them in the
  // residue (AdaComp's scale is the mean of the bin maxima, Top-k sends 3 of 64, sign the
  // mean), so the next step takes residue + gradient past the float range.
  std::vector<float> g(64, 1.0f);
  for (size_t i : {0, 8, 16, 24}) g[i] = 3e38f;
  std::vector<float> before;
  bool overflowed = false;
  for (int step = 0; step < 8 && !overflowed; ++step) {
    before = Residue(state);
    const absl::Status s = c->CompressPending(g, state, u);
    if (s.ok()) {
      state.Commit();
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
    EXPECT_FALSE(state.pending());
    EXPECT_EQ(Residue(state), before);
    overflowed = true;
  }
  EXPECT_TRUE(overflowed) << "the residue never reached the float range";
}

INSTANTIATE_TEST_SUITE_P(EveryKind, TwoPhase,
                         ::testing::Values(CompressorKind::kDense, CompressorKind::kAdaComp,
                                           CompressorKind::kTopK, CompressorKind::kSign),
                         [](const ::testing::TestParamInfo<CompressorKind>& info) {
                           return std::string(CompressorKindName(info.param));
                         });

}  // namespace
}  // namespace adaps
