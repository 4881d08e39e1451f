// worker/app/trainer/exchange.h: which compressor each tensor gets, and momentum correction
// (pushing each worker's velocity to a server running plain SGD must train exactly as the
// server's own momentum does on dense pushes, so --local_momentum changes only what the
// compressor sees).
#include "worker/app/trainer/exchange.h"

#include <random>
#include <vector>

#include "common/optimizer.h"
#include "gtest/gtest.h"

namespace adaps::trainer {
namespace {

std::vector<float> RandomGrad(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> g(n);
  for (float& x : g) x = d(rng);
  return g;
}

ParamTensor TensorOf(LayerKind kind) {
  ParamTensor t;
  t.kind = kind;
  return t;
}

TEST(OptionsForTensor, BiasesGoDenseUnlessCompressed) {
  CompressionConfig c;
  EXPECT_EQ(OptionsForTensor(TensorOf(LayerKind::kBias), c).kind, CompressorKind::kDense);
  c.compress_bias = true;
  EXPECT_EQ(OptionsForTensor(TensorOf(LayerKind::kBias), c).kind, CompressorKind::kAdaComp);
}

TEST(OptionsForTensor, CompressedBiasesTakeTheFullyConnectedBinSizeUnlessTheirOwnIsGiven) {
  CompressionConfig c;
  c.compress_bias = true;
  c.bin_size_fc = 400;
  c.bin_size_conv = 40;
  EXPECT_EQ(OptionsForTensor(TensorOf(LayerKind::kBias), c).bin_size, 400u);
  c.bin_size_bias = 100;
  EXPECT_EQ(OptionsForTensor(TensorOf(LayerKind::kBias), c).bin_size, 100u);
  EXPECT_EQ(OptionsForTensor(TensorOf(LayerKind::kFullyConnected), c).bin_size, 400u);
  EXPECT_EQ(OptionsForTensor(TensorOf(LayerKind::kConv), c).bin_size, 40u);
}

TEST(MomentumCorrection, OneWorkerPushingVelocityToSgdMatchesServerMomentumBitForBit) {
  constexpr size_t kN = 64;
  MomentumCorrection correction(0.9f);
  correction.AddTensor(kN);
  OptimizerConfig momentum{OptimizerKind::kMomentum, 0.05f, 0.9f};
  OptimizerConfig sgd{OptimizerKind::kSgd, 0.05f};
  std::vector<float> p_momentum(kN, 1.0f), p_sgd(kN, 1.0f);
  OptimizerState s_momentum, s_sgd;
  std::mt19937 rng(7);
  for (int step = 0; step < 50; ++step) {
    momentum.learning_rate = sgd.learning_rate = 0.05f / (1.0f + step);  // a schedule
    const std::vector<float> g = RandomGrad(rng, kN);
    ApplyOptimizer(momentum, g, absl::MakeSpan(p_momentum), s_momentum);
    auto push = correction.Push(0, g);
    ASSERT_TRUE(push.ok()) << push.status();
    ApplyOptimizer(sgd, *push, absl::MakeSpan(p_sgd), s_sgd);
  }
  EXPECT_EQ(p_momentum, p_sgd);
}

TEST(MomentumCorrection, MeanOfTwoWorkersVelocitiesIsTheMomentumOfTheMeanGradient) {
  constexpr size_t kN = 32;
  MomentumCorrection w0(0.9f), w1(0.9f);
  w0.AddTensor(kN);
  w1.AddTensor(kN);
  std::vector<float> m(kN, 0.0f);
  std::mt19937 rng(3);
  for (int step = 0; step < 40; ++step) {
    const std::vector<float> g0 = RandomGrad(rng, kN), g1 = RandomGrad(rng, kN);
    auto u0 = w0.Push(0, g0);
    auto u1 = w1.Push(0, g1);
    ASSERT_TRUE(u0.ok() && u1.ok());
    for (size_t i = 0; i < kN; ++i) {
      m[i] = 0.9f * m[i] + 0.5f * (g0[i] + g1[i]);
      EXPECT_NEAR(0.5f * ((*u0)[i] + (*u1)[i]), m[i], 1e-4f) << "step " << step << " i " << i;
    }
  }
}

TEST(MomentumCorrection, ZeroMomentumPushesTheGradientItself) {
  MomentumCorrection correction(0.0f);
  correction.AddTensor(3);
  const std::vector<float> g = {1.0f, -2.0f, 3.0f};
  for (int step = 0; step < 3; ++step) {
    auto push = correction.Push(0, g);
    ASSERT_TRUE(push.ok());
    EXPECT_EQ(push->data(), g.data());
  }
}

TEST(MomentumCorrection, KeepsOneVelocityPerTensor) {
  MomentumCorrection correction(0.5f);
  correction.AddTensor(1);
  correction.AddTensor(1);
  const std::vector<float> one = {1.0f};
  ASSERT_TRUE(correction.Push(0, one).ok());
  auto second = correction.Push(0, one);
  auto other = correction.Push(1, one);
  ASSERT_TRUE(second.ok() && other.ok());
  EXPECT_EQ((*second)[0], 1.5f);
  EXPECT_EQ((*other)[0], 1.0f);
}

TEST(MomentumCorrection, WrongSizeOrUnknownTensorIsInvalidArgumentAndChangesNothing) {
  MomentumCorrection correction(0.9f);
  correction.AddTensor(2);
  const std::vector<float> three = {1.0f, 2.0f, 3.0f}, two = {1.0f, 2.0f};
  EXPECT_EQ(correction.Push(0, three).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(correction.Push(1, two).status().code(), absl::StatusCode::kInvalidArgument);
  auto push = correction.Push(0, two);
  ASSERT_TRUE(push.ok());
  EXPECT_EQ((*push)[0], 1.0f);  // the velocity was still zero
  EXPECT_EQ((*push)[1], 2.0f);
}

}  // namespace
}  // namespace adaps::trainer
