// The server optimizer and the learning-rate schedules: hand-checked values of each kind.
#include "common/optimizer.h"

#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace adaps {
namespace {

OptimizerConfig Config(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  c.learning_rate = 0.5f;
  c.momentum = 0.5f;
  return c;
}

TEST(Optimizer, SumAddsTheGradient) {
  std::vector<float> p = {1.0f, -2.0f}, g = {0.5f, 0.25f};
  OptimizerState s;
  ApplyOptimizer(Config(OptimizerKind::kSumOnly), g, absl::MakeSpan(p), s);
  EXPECT_EQ(p, (std::vector<float>{1.5f, -1.75f}));
}

TEST(Optimizer, MeanMakesTheParametersTheGradientWhateverTheyWere) {
  OptimizerConfig c = Config(OptimizerKind::kMean);
  c.weight_decay = 0.5f;  // ignored: the parameters are replaced, not updated
  std::vector<float> p = {7.0f, -3.0f}, g = {0.25f, 1e-7f};
  OptimizerState s;
  ApplyOptimizer(c, g, absl::MakeSpan(p), s);
  EXPECT_EQ(p, g);
  ApplyOptimizer(c, g, absl::MakeSpan(p), s);  // no running sum
  EXPECT_EQ(p, g);
}

TEST(Optimizer, SgdStepsAgainstTheGradientWithWeightDecay) {
  OptimizerConfig c = Config(OptimizerKind::kSgd);
  c.weight_decay = 0.5f;
  std::vector<float> p = {2.0f}, g = {1.0f};
  OptimizerState s;
  ApplyOptimizer(c, g, absl::MakeSpan(p), s);  // 2 - 0.5 * (1 + 0.5 * 2)
  EXPECT_EQ(p[0], 1.0f);
}

TEST(Optimizer, MomentumAccumulatesVelocityAcrossSteps) {
  std::vector<float> p = {1.0f}, g = {1.0f};
  OptimizerState s;
  const OptimizerConfig c = Config(OptimizerKind::kMomentum);
  ApplyOptimizer(c, g, absl::MakeSpan(p), s);  // m = 1; p = 1 - 0.5
  EXPECT_EQ(p[0], 0.5f);
  ApplyOptimizer(c, g, absl::MakeSpan(p), s);  // m = 1.5; p = 0.5 - 0.75
  EXPECT_EQ(s.m[0], 1.5f);
  EXPECT_EQ(p[0], -0.25f);
}

TEST(Optimizer, NesterovLooksAheadAlongTheMomentum) {
  std::vector<float> p = {1.0f}, g = {1.0f};
  OptimizerState s;
  ApplyOptimizer(Config(OptimizerKind::kNesterov), g, absl::MakeSpan(p), s);
  EXPECT_FLOAT_EQ(p[0], 0.25f);  // m = 1; p -= 0.5 * (1 + 0.5 * 1)
}

TEST(Optimizer, AdamFirstStepMovesByTheLearningRateAndCountsSteps) {
  OptimizerConfig c = Config(OptimizerKind::kAdam);
  c.learning_rate = 0.1f;
  std::vector<float> p = {1.0f, 1.0f}, g = {1.0f, -4.0f};
  OptimizerState s;
  ApplyOptimizer(c, g, absl::MakeSpan(p), s);  // bias-corrected m/sqrt(v) = sign(g)
  EXPECT_NEAR(p[0], 0.9f, 1e-6f);
  EXPECT_NEAR(p[1], 1.1f, 1e-6f);
  EXPECT_EQ(s.adam_t, 1u);
  ASSERT_EQ(s.v.size(), 2u);
  EXPECT_NEAR(s.v[1], 0.016f, 1e-5f);  // (1 - beta2) * g^2
}

TEST(Optimizer, ParsesEveryKindAndRefusesOthers) {
  EXPECT_EQ(*ParseOptimizerKind("sum"), OptimizerKind::kSumOnly);
  EXPECT_EQ(*ParseOptimizerKind("mean"), OptimizerKind::kMean);
  EXPECT_EQ(*ParseOptimizerKind("sgd"), OptimizerKind::kSgd);
  EXPECT_EQ(*ParseOptimizerKind("momentum"), OptimizerKind::kMomentum);
  EXPECT_EQ(*ParseOptimizerKind("nesterov"), OptimizerKind::kNesterov);
  EXPECT_EQ(*ParseOptimizerKind("adam"), OptimizerKind::kAdam);
  EXPECT_EQ(ParseOptimizerKind("rmsprop").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Optimizer, SetHyperParamRefusesOutOfRangeValuesAndKeepsTheConfig) {
  OptimizerConfig c;
  const OptimizerConfig before = c;
  EXPECT_EQ(SetHyperParam(c, "nope", 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetHyperParam(c, "momentum", 1.0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetHyperParam(c, "beta1", -0.1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetHyperParam(c, "beta2", 1.5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetHyperParam(c, "learning_rate", -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetHyperParam(c, "weight_decay", -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetHyperParam(c, "epsilon", 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetHyperParam(c, "learning_rate", NAN).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.momentum, before.momentum);
  EXPECT_EQ(c.learning_rate, before.learning_rate);
  EXPECT_TRUE(SetHyperParam(c, "momentum", 0.0).ok());
  EXPECT_TRUE(SetHyperParam(c, "learning_rate", 0.0).ok());
  EXPECT_EQ(c.momentum, 0.0f);
}

TEST(LrSchedule, CosineStartsAtTheRateEndsAtZeroAndStaysThere) {
  EXPECT_EQ(CosineLearningRate(0.1, 0.0), 0.1);
  EXPECT_NEAR(CosineLearningRate(0.1, 0.5), 0.05, 1e-15);
  EXPECT_EQ(CosineLearningRate(0.1, 1.0), 0.0);
  EXPECT_EQ(ScheduledLearningRate(LrSchedule::kCosine, 0.1, 0, 100), 0.1);
  EXPECT_EQ(ScheduledLearningRate(LrSchedule::kCosine, 0.1, 100, 100), 0.0);
  EXPECT_EQ(ScheduledLearningRate(LrSchedule::kCosine, 0.1, 250, 100), 0.0);
  EXPECT_EQ(ScheduledLearningRate(LrSchedule::kCosine, 0.1, 25, 100),
            0.5 * 0.1 * (1.0 + std::cos(M_PI * 0.25)));
}

TEST(LrSchedule, ConstantOrNoRunLengthKeepsTheRate) {
  EXPECT_EQ(ScheduledLearningRate(LrSchedule::kConstant, 0.1, 50, 100), 0.1);
  EXPECT_EQ(ScheduledLearningRate(LrSchedule::kCosine, 0.1, 50, 0), 0.1);
  EXPECT_EQ(*ParseLrSchedule("cosine"), LrSchedule::kCosine);
  EXPECT_EQ(*ParseLrSchedule("constant"), LrSchedule::kConstant);
  EXPECT_EQ(ParseLrSchedule("step").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace adaps

namespace adaps {
namespace {

// The server's one-pass step is the three passes it replaced, float for float, for every
// kind over several steps (momentum and Adam state included), and leaves the sum at zero.
TEST(Optimizer, ApplyAndClearIsScaleThenApplyThenClear) {
  for (const char* name : {"sum", "mean", "sgd", "momentum", "nesterov", "adam"}) {
    OptimizerConfig c;
    c.kind = *ParseOptimizerKind(name);
    c.learning_rate = 0.07f;
    c.weight_decay = 0.01f;
    c.momentum = 0.9f;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    std::vector<float> p1(257), p2;
    for (float& x : p1) x = normal(rng);
    p2 = p1;
    OptimizerState s1, s2;
    for (int step = 0; step < 4; ++step) {
      std::vector<float> sum(p1.size());
      for (float& x : sum) x = 3.0f * normal(rng);
      std::vector<float> g = sum;
      const float inv = 1.0f / 3.0f;
      if (c.kind != OptimizerKind::kSumOnly) {
        for (float& x : g) x *= inv;
      }
      ApplyOptimizer(c, g, absl::MakeSpan(p1), s1);
      ApplyOptimizerAndClear(c, inv, absl::MakeSpan(sum), absl::MakeSpan(p2), s2);
      ASSERT_EQ(p1, p2) << name << " step " << step;
      ASSERT_EQ(s1.m, s2.m) << name;
      ASSERT_EQ(s1.v, s2.v) << name;
      EXPECT_THAT(sum, ::testing::Each(0.0f)) << name;
    }
  }
}

}  // namespace
}  // namespace adaps
