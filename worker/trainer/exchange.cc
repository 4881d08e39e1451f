#include "worker/trainer/exchange.h"

namespace adaps::trainer {

CompressorOptions OptionsForTensor(const ParamTensor& tensor, const CompressionConfig& config) {
  CompressorOptions o;
  o.kind = config.kind;
  o.topk_fraction = config.topk_fraction;
  o.bin_size = tensor.kind == LayerKind::kConv ? config.bin_size_conv : config.bin_size_fc;
  if (tensor.kind == LayerKind::kBias && !config.compress_bias) o.kind = CompressorKind::kDense;
  return o;
}

}  // namespace adaps::trainer
