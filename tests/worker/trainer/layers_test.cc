#include "worker/app/trainer/layers.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/trainer/gradient_check.h"

namespace adaps::trainer {
namespace {

using testing::Close;
using testing::Numeric;

Matrix Random(int rows, int cols, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  Matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = u(rng);
  return m;
}

ParamTensor Param(const std::string& name, LayerKind kind, int n, std::mt19937& rng) {
  ParamTensor p;
  p.name = name;
  p.kind = kind;
  p.shape = {n};
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (int i = 0; i < n; ++i) p.value.push_back(u(rng));
  p.grad.assign(n, 0.0f);
  return p;
}

// Checks dL/dx and dL/dparams of `layer` for L = sum(layer(x) .* r) against central
// differences, on every input element and every parameter element.
void CheckLayer(Layer& layer, std::vector<ParamTensor>* params, Matrix x, std::mt19937& rng,
                float eps = 1e-2f) {
  Matrix out;
  layer.Forward(x, &out, true);
  const Matrix r = Random(static_cast<int>(out.rows()), static_cast<int>(out.cols()), rng);
  Matrix din;
  layer.Backward(r, &din);
  ASSERT_EQ(din.rows(), x.rows());
  ASSERT_EQ(din.cols(), x.cols());
  std::vector<std::vector<float>> grads;
  if (params != nullptr) {
    for (const ParamTensor& p : *params) grads.push_back(p.grad);
  }
  auto loss = [&] {
    Matrix o;
    layer.Forward(x, &o, true);
    return (o.cast<double>().array() * r.cast<double>().array()).sum();
  };
  for (Eigen::Index i = 0; i < x.size(); ++i) {
    EXPECT_TRUE(Close(din.data()[i], Numeric(&x.data()[i], eps, loss))) << "input element " << i;
  }
  if (params == nullptr) return;
  for (size_t t = 0; t < params->size(); ++t) {
    ParamTensor& p = (*params)[t];
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_TRUE(Close(grads[t][i], Numeric(&p.value[i], eps, loss)))
          << p.name << " element " << i;
    }
  }
}

TEST(DenseLayer, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(1);
  std::vector<ParamTensor> params = {Param("w", LayerKind::kFullyConnected, 5 * 4, rng),
                                     Param("b", LayerKind::kBias, 4, rng)};
  DenseLayer layer(&params, 0, 1, 5, 4);
  CheckLayer(layer, &params, Random(3, 5, rng), rng);
}

TEST(ReluLayer, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(2);
  // Keep inputs away from the kink at 0 so a step of eps never crosses it.
  Matrix x = Random(3, 8, rng, 0.1f, 1.0f);
  for (Eigen::Index i = 0; i < x.size(); i += 2) x.data()[i] = -x.data()[i];
  ReluLayer layer(8);
  CheckLayer(layer, nullptr, x, rng);
}

TEST(ReluLayer, PassesNoGradientForNegativeInputs) {
  ReluLayer layer(2);
  Matrix x(1, 2), out, din;
  x << -1.0f, 2.0f;
  layer.Forward(x, &out, true);
  layer.Backward(Matrix::Ones(1, 2), &din);
  EXPECT_EQ(din(0, 0), 0.0f);
  EXPECT_EQ(din(0, 1), 1.0f);
}

void CheckConv(ConvShape s, int batch, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<ParamTensor> params = {
      Param("w", LayerKind::kConv, s.out_channels * s.patch_size(), rng),
      Param("b", LayerKind::kBias, s.out_channels, rng)};
  ConvLayer layer(&params, 0, 1, s);
  CheckLayer(layer, &params, Random(batch, s.in_channels * s.height * s.width, rng), rng);
}

TEST(ConvLayer, BackwardMatchesFiniteDifferencesWithPadding) {
  CheckConv(ConvShape{2, 6, 5, 3, 3, 1}, 2, 3);
}

TEST(ConvLayer, BackwardMatchesFiniteDifferencesWithoutPadding) {
  CheckConv(ConvShape{3, 5, 6, 2, 3, 0}, 2, 4);
}

TEST(ConvLayer, BackwardMatchesFiniteDifferencesWithWidePadding) {
  CheckConv(ConvShape{1, 4, 4, 2, 5, 2}, 3, 5);
}

TEST(ConvLayer, ComputesAHandWorkedConvolution) {
  // One 3x3 image, one 2x2 kernel, no padding: a 2x2 output.
  std::vector<ParamTensor> params(2);
  params[0].value = {1, 0, 0, -1};
  params[0].grad.resize(4);
  params[1].value = {0.5f};
  params[1].grad.resize(1);
  ConvLayer layer(&params, 0, 1, ConvShape{1, 3, 3, 1, 2, 0});
  Matrix x(1, 9), out;
  x << 1, 2, 3, 4, 5, 6, 7, 8, 9;
  layer.Forward(x, &out, false);
  ASSERT_EQ(out.cols(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(out(0, i), -4.0f + 0.5f);
}

TEST(MaxPoolLayer, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(6);
  const int c = 2, h = 4, w = 6, batch = 2;
  // Distinct values 0.05 apart: a step of eps never changes which element is the maximum.
  std::vector<float> values(batch * c * h * w);
  std::iota(values.begin(), values.end(), 0.0f);
  std::shuffle(values.begin(), values.end(), rng);
  Matrix x(batch, c * h * w);
  for (size_t i = 0; i < values.size(); ++i) x.data()[i] = 0.05f * values[i] - 1.0f;
  MaxPoolLayer layer(c, h, w);
  CheckLayer(layer, nullptr, x, rng);
}

TEST(MaxPoolLayer, PicksTheMaximumOfEachWindow) {
  MaxPoolLayer layer(1, 2, 2);
  Matrix x(1, 4), out;
  x << 1, 7, 3, 2;
  layer.Forward(x, &out, false);
  EXPECT_EQ(out(0, 0), 7.0f);
}

TEST(SoftmaxCrossEntropy, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(7);
  Matrix logits = Random(4, 10, rng, -3.0f, 3.0f);
  const std::vector<uint8_t> labels = {0, 9, 3, 3};
  Matrix d;
  SoftmaxCrossEntropy(logits, labels.data(), &d);
  auto loss = [&] {
    return static_cast<double>(SoftmaxCrossEntropy(logits, labels.data(), nullptr));
  };
  for (Eigen::Index i = 0; i < logits.size(); ++i) {
    EXPECT_TRUE(Close(d.data()[i], Numeric(&logits.data()[i], 1e-2f, loss), 1e-3, 1e-2));
  }
}

TEST(SoftmaxCrossEntropy, IsLogClassesForUniformLogits) {
  Matrix logits = Matrix::Zero(2, 10);
  const std::vector<uint8_t> labels = {1, 2};
  EXPECT_NEAR(SoftmaxCrossEntropy(logits, labels.data(), nullptr), std::log(10.0), 1e-6);
}

TEST(SoftmaxCrossEntropy, StaysFiniteForHugeLogits) {
  Matrix logits = Matrix::Zero(1, 10);
  logits(0, 3) = 1e4f;
  const std::vector<uint8_t> labels = {3};
  Matrix d;
  const float loss = SoftmaxCrossEntropy(logits, labels.data(), &d);
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_TRUE(d.allFinite());
}

}  // namespace
}  // namespace adaps::trainer
