#include "worker/app/trainer/model.h"

#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace adaps::trainer {

absl::StatusOr<ModelKind> ParseModelKind(const std::string& name) {
  if (name == "mlp") return ModelKind::kMlp;
  if (name == "cnn") return ModelKind::kCnn;
  return absl::InvalidArgumentError(absl::StrCat("unknown model '", name, "' (mlp or cnn)"));
}

const char* ModelKindName(ModelKind kind) { return kind == ModelKind::kMlp ? "mlp" : "cnn"; }

int Model::AddParam(std::string name, LayerKind kind, std::vector<int> shape, int fan_in,
                    uint64_t seed) {
  ParamTensor p;
  p.name = std::move(name);
  p.kind = kind;
  const size_t n = std::accumulate(shape.begin(), shape.end(), size_t{1},
                                   [](size_t a, int d) { return a * static_cast<size_t>(d); });
  p.shape = std::move(shape);
  p.value.assign(n, 0.0f);
  p.grad.assign(n, 0.0f);
  if (kind != LayerKind::kBias) {
    std::mt19937_64 rng(seed * 1315423911ULL + params_.size() + 1);
    std::normal_distribution<float> normal(0.0f, std::sqrt(2.0f / static_cast<float>(fan_in)));
    for (float& v : p.value) v = normal(rng);
  }
  params_.push_back(std::move(p));
  return static_cast<int>(params_.size()) - 1;
}

std::unique_ptr<Model> Model::Create(ModelKind kind, uint64_t seed) {
  std::unique_ptr<Model> m(new Model(kind));
  auto dense = [&](const std::string& name, int in, int out, bool relu) {
    const int w = m->AddParam(name + ".weight", LayerKind::kFullyConnected, {in, out}, in, seed);
    const int b = m->AddParam(name + ".bias", LayerKind::kBias, {out}, in, seed);
    m->layers_.push_back(std::make_unique<DenseLayer>(&m->params_, w, b, in, out));
    if (relu) m->layers_.push_back(std::make_unique<ReluLayer>(out));
  };
  if (kind == ModelKind::kMlp) {
    dense("fc1", 784, 256, true);
    dense("fc2", 256, 128, true);
    dense("fc3", 128, 10, false);
  } else {
    auto conv = [&](const std::string& name, ConvShape s) {
      const int w =
          m->AddParam(name + ".weight", LayerKind::kConv,
                      {s.out_channels, s.in_channels, s.kernel, s.kernel}, s.patch_size(), seed);
      const int b = m->AddParam(name + ".bias", LayerKind::kBias, {s.out_channels}, 1, seed);
      m->layers_.push_back(std::make_unique<ConvLayer>(&m->params_, w, b, s));
      const int out = s.out_channels * s.out_height() * s.out_width();
      m->layers_.push_back(std::make_unique<ReluLayer>(out));
      m->layers_.push_back(
          std::make_unique<MaxPoolLayer>(s.out_channels, s.out_height(), s.out_width()));
    };
    conv("conv1", ConvShape{1, 28, 28, 8, 5, 2});
    conv("conv2", ConvShape{8, 14, 14, 16, 5, 2});
    dense("fc1", 16 * 7 * 7, 128, true);
    dense("fc2", 128, 10, false);
  }
  m->activations_.resize(m->layers_.size() + 1);
  m->deltas_.resize(2);
  return m;
}

int Model::input_size() const { return layers_.front()->input_size(); }

size_t Model::num_parameters() const {
  size_t n = 0;
  for (const ParamTensor& p : params_) n += p.size();
  return n;
}

absl::StatusOr<float> Model::ComputeGradients(const Matrix& images,
                                              absl::Span<const uint8_t> labels) {
  if (images.cols() != input_size() || images.rows() == 0 ||
      static_cast<size_t>(images.rows()) != labels.size()) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", images.rows(), "x", images.cols(),
                                                   " with ", labels.size(), " labels; model takes ",
                                                   input_size(), " inputs per row"));
  }
  activations_[0] = images;
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->Forward(activations_[i], &activations_[i + 1], /*training=*/true);
  }
  const float loss = SoftmaxCrossEntropy(activations_.back(), labels.data(), &deltas_[0]);
  for (size_t i = layers_.size(); i-- > 0;) {
    layers_[i]->Backward(deltas_[0], &deltas_[1]);
    std::swap(deltas_[0], deltas_[1]);
  }
  return loss;
}

absl::Status Model::Logits(const Matrix& images, Matrix* logits) {
  if (images.cols() != input_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("images have ", images.cols(), " values; model takes ", input_size()));
  }
  Matrix a = images, b;
  for (auto& layer : layers_) {
    layer->Forward(a, &b, /*training=*/false);
    std::swap(a, b);
  }
  *logits = std::move(a);
  return absl::OkStatus();
}

void GatherBatch(const Dataset& data, absl::Span<const uint32_t> indices, Matrix* batch,
                 std::vector<uint8_t>* labels) {
  const int size = data.image_size();
  batch->resize(static_cast<Eigen::Index>(indices.size()), size);
  labels->resize(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    std::copy_n(data.image(static_cast<int>(indices[i])), size,
                batch->data() + i * static_cast<size_t>(size));
    (*labels)[i] = data.labels[indices[i]];
  }
}

absl::StatusOr<EvalResult> Evaluate(Model& model, const Dataset& data, int batch_size) {
  if (data.count == 0) return absl::InvalidArgumentError("empty evaluation set");
  if (data.image_size() != model.input_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("images of ", data.image_size(), " pixels; model takes ", model.input_size()));
  }
  Matrix batch, logits;
  std::vector<uint8_t> labels;
  std::vector<uint32_t> idx;
  int correct = 0;
  double loss = 0.0;
  for (int start = 0; start < data.count; start += batch_size) {
    const int n = std::min(batch_size, data.count - start);
    idx.resize(n);
    std::iota(idx.begin(), idx.end(), static_cast<uint32_t>(start));
    GatherBatch(data, idx, &batch, &labels);
    ADAPS_RETURN_IF_ERROR(model.Logits(batch, &logits));
    loss += SoftmaxCrossEntropy(logits, labels.data(), nullptr) * n;
    for (int i = 0; i < n; ++i) {
      Eigen::Index arg;
      logits.row(i).maxCoeff(&arg);
      if (arg == labels[i]) ++correct;
    }
  }
  return EvalResult{static_cast<double>(correct) / data.count, loss / data.count};
}

}  // namespace adaps::trainer
