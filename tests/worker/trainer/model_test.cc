#include "worker/app/trainer/model.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/trainer/gradient_check.h"

namespace adaps::trainer {
namespace {

using testing::Close;
using testing::Numeric;

struct Batch {
  Matrix images;
  std::vector<uint8_t> labels;
};

Batch RandomBatch(int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Batch b{Matrix(rows, cols), std::vector<uint8_t>(rows)};
  for (Eigen::Index i = 0; i < b.images.size(); ++i) b.images.data()[i] = n(rng);
  for (int i = 0; i < rows; ++i) b.labels[i] = static_cast<uint8_t>(rng() % 10);
  return b;
}

// The whole model's gradient at a few elements of every tensor against central differences.
void CheckModel(ModelKind kind) {
  auto model = Model::Create(kind, 3);
  Batch b = RandomBatch(4, model->input_size(), 11);
  ASSERT_TRUE(model->ComputeGradients(b.images, b.labels).ok());
  std::vector<std::vector<float>> grads;
  for (const ParamTensor& p : model->params()) grads.push_back(p.grad);
  auto loss = [&] {
    Matrix logits;
    EXPECT_TRUE(model->Logits(b.images, &logits).ok());
    return static_cast<double>(SoftmaxCrossEntropy(logits, b.labels.data(), nullptr));
  };
  std::mt19937 rng(5);
  for (size_t t = 0; t < model->params().size(); ++t) {
    ParamTensor& p = model->params()[t];
    for (int k = 0; k < 6; ++k) {
      const size_t i = rng() % p.size();
      EXPECT_TRUE(Close(grads[t][i], Numeric(&p.value[i], 2e-3f, loss), 2e-3, 5e-2))
          << p.name << " element " << i;
    }
  }
}

TEST(Model, MlpGradientsMatchFiniteDifferences) { CheckModel(ModelKind::kMlp); }
TEST(Model, CnnGradientsMatchFiniteDifferences) { CheckModel(ModelKind::kCnn); }

TEST(Model, ExposesNamedTensorsWithLayerKinds) {
  auto mlp = Model::Create(ModelKind::kMlp, 1);
  ASSERT_EQ(mlp->params().size(), 6u);
  EXPECT_EQ(mlp->params()[0].name, "fc1.weight");
  EXPECT_EQ(mlp->params()[0].kind, LayerKind::kFullyConnected);
  EXPECT_EQ(mlp->params()[0].shape, (std::vector<int>{784, 256}));
  EXPECT_EQ(mlp->params()[1].kind, LayerKind::kBias);
  EXPECT_EQ(mlp->num_parameters(), 784u * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  auto cnn = Model::Create(ModelKind::kCnn, 1);
  EXPECT_EQ(cnn->params()[0].kind, LayerKind::kConv);
  EXPECT_EQ(cnn->params()[0].shape, (std::vector<int>{8, 1, 5, 5}));
}

TEST(Model, SameSeedGivesSameWeights) {
  auto a = Model::Create(ModelKind::kCnn, 9);
  auto b = Model::Create(ModelKind::kCnn, 9);
  auto c = Model::Create(ModelKind::kCnn, 10);
  EXPECT_EQ(a->params()[2].value, b->params()[2].value);
  EXPECT_NE(a->params()[2].value, c->params()[2].value);
}

TEST(Model, RejectsABatchOfTheWrongWidth) {
  auto model = Model::Create(ModelKind::kMlp, 1);
  Batch b = RandomBatch(2, 100, 1);
  EXPECT_EQ(model->ComputeGradients(b.images, b.labels).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Model, LearnsAFixedBatch) {
  auto model = Model::Create(ModelKind::kMlp, 2);
  Batch b = RandomBatch(16, model->input_size(), 4);
  float first = 0.0f, last = 0.0f;
  for (int step = 0; step < 30; ++step) {
    auto loss = model->ComputeGradients(b.images, b.labels);
    ASSERT_TRUE(loss.ok());
    if (step == 0) first = *loss;
    last = *loss;
    for (ParamTensor& p : model->params()) {
      for (size_t i = 0; i < p.size(); ++i) p.value[i] -= 0.05f * p.grad[i];
    }
  }
  EXPECT_LT(last, 0.2f * first);
}

}  // namespace
}  // namespace adaps::trainer
