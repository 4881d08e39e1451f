// The built-in trainer's models for 28x28 single-channel images in 10 classes:
//   mlp: 784-256-128-10, ReLU.
//   cnn: conv 5x5 1->8, ReLU, 2x2 max pool, conv 5x5 8->16, ReLU, 2x2 max pool,
//        fc 784->128, ReLU, fc 128->10.
// Both end in softmax cross-entropy.
//
// A model exposes its parameters as a list of named flat float tensors, each with a layer
// kind and a shape, and their gradients beside them (ParamTensor, layers.h), so that a
// parameter-server exchange can push every tensor on its own.
//
// Ownership: the model owns its tensors and layers; `params()` hands out a reference that
// stays valid for the model's lifetime (the list never changes size). Thread-safety:
// thread-compatible; use one model per thread.
#ifndef ADAPS_WORKER_APP_TRAINER_MODEL_H_
#define ADAPS_WORKER_APP_TRAINER_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/app/trainer/idx_reader.h"
#include "worker/app/trainer/layers.h"

namespace adaps::trainer {

enum class ModelKind : uint8_t { kMlp = 0, kCnn = 1 };
// "mlp" or "cnn"; kInvalidArgument otherwise.
absl::StatusOr<ModelKind> ParseModelKind(const std::string& name);
const char* ModelKindName(ModelKind kind);

class Model {
 public:
  // Weights drawn He-normal from `seed` (the same seed gives the same model), biases zero.
  static std::unique_ptr<Model> Create(ModelKind kind, uint64_t seed);

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  ModelKind kind() const { return kind_; }
  int input_size() const;
  int num_classes() const { return 10; }
  std::vector<ParamTensor>& params() { return params_; }
  const std::vector<ParamTensor>& params() const { return params_; }
  size_t num_parameters() const;

  // Forward and backward pass over a batch (rows of `images`, each input_size() wide):
  // overwrites every params()[i].grad with the gradient of the mean loss, returns the mean
  // loss. kInvalidArgument for a batch of the wrong width or with no rows.
  absl::StatusOr<float> ComputeGradients(const Matrix& images, absl::Span<const uint8_t> labels);

  // Logits for a batch, without keeping anything for a backward pass.
  absl::Status Logits(const Matrix& images, Matrix* logits);

 private:
  explicit Model(ModelKind kind) : kind_(kind) {}
  int AddParam(std::string name, LayerKind kind, std::vector<int> shape, int fan_in, uint64_t seed);

  ModelKind kind_;
  std::vector<ParamTensor> params_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Matrix> activations_;
  std::vector<Matrix> deltas_;
};

// Copies the images at `indices` of `data` into `batch` (one row each) and their labels.
void GatherBatch(const Dataset& data, absl::Span<const uint32_t> indices, Matrix* batch,
                 std::vector<uint8_t>* labels);

struct EvalResult {
  double accuracy = 0.0;
  double loss = 0.0;
};
// Accuracy and mean loss of `model` over all of `data`. kInvalidArgument for an empty set
// or images of the wrong size.
absl::StatusOr<EvalResult> Evaluate(Model& model, const Dataset& data, int batch_size = 500);

}  // namespace adaps::trainer

#endif  // ADAPS_WORKER_APP_TRAINER_MODEL_H_
