#include "worker/app/trainer/exchange.h"

#include "absl/strings/str_cat.h"

namespace adaps::trainer {

CompressorOptions OptionsForTensor(const ParamTensor& tensor, const CompressionConfig& config) {
  CompressorOptions o;
  o.kind = config.kind;
  o.topk_fraction = config.topk_fraction;
  o.bin_size = tensor.kind == LayerKind::kConv ? config.bin_size_conv : config.bin_size_fc;
  if (tensor.kind == LayerKind::kBias && config.bin_size_bias > 0) {
    o.bin_size = config.bin_size_bias;
  }
  if (tensor.kind == LayerKind::kBias && !config.compress_bias) o.kind = CompressorKind::kDense;
  return o;
}

void MomentumCorrection::AddTensor(size_t size) {
  velocity_.emplace_back(momentum_ > 0.0f ? size : 0, 0.0f);
}

absl::StatusOr<absl::Span<const float>> MomentumCorrection::Push(size_t index,
                                                                  absl::Span<const float> grad) {
  if (index >= velocity_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("momentum correction: no tensor ", index));
  }
  if (momentum_ <= 0.0f) return grad;
  std::vector<float>& u = velocity_[index];
  if (grad.size() != u.size()) {
    return absl::InvalidArgumentError(absl::StrCat("momentum correction: ", grad.size(),
                                                   " gradients for a tensor of ", u.size()));
  }
  for (size_t j = 0; j < u.size(); ++j) u[j] = momentum_ * u[j] + grad[j];
  return absl::MakeConstSpan(u);
}

}  // namespace adaps::trainer
