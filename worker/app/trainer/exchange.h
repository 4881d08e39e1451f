// GradientExchange: what the training loop calls once per step to hand its gradients to
// the parameter server and get the new parameters back. The same loop (trainer.h) runs
// over the in-process simulation (simulated_cluster.h) and over the cluster worker
// library (an adapter over worker/include/adaps/worker.h).
//
// Also here: which compressor each tensor gets (CompressionConfig), shared by every
// implementation so the simulation and the cluster compress the same way.
#ifndef ADAPS_WORKER_APP_TRAINER_EXCHANGE_H_
#define ADAPS_WORKER_APP_TRAINER_EXCHANGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/compressor.h"
#include "worker/app/trainer/layers.h"

namespace adaps::trainer {

class GradientExchange {
 public:
  virtual ~GradientExchange() = default;

  // Pushes params[i].grad of every tensor for global step `step` (steps count from 0 and
  // go up by one per call) and, when it returns OK, params[i].value holds the parameters
  // after the server applied that step. The list must have the same names, order and
  // sizes on every call. On error the values are unspecified; kInvalidArgument for a list
  // that does not match, kDeadlineExceeded / kUnavailable when the server or a peer does
  // not answer, kFailedPrecondition for a step out of order or after a failed exchange.
  // Thread-safety: one thread per exchange object.
  virtual absl::Status Exchange(int64_t step, std::vector<ParamTensor>& params) = 0;
};

// The per-layer-type compression of a run. Biases are tiny (one per output unit) and go
// dense unless `compress_bias`; the compressor of the other tensors gets the bin size of
// their layer type (docs/algorithm.md: about 50 for conv, about 500 for fc).
struct CompressionConfig {
  CompressorKind kind = CompressorKind::kAdaComp;
  uint32_t bin_size_conv = 50;
  uint32_t bin_size_fc = 500;
  double topk_fraction = 0.001;
  bool compress_bias = false;
  uint32_t bin_size_bias = 0;  // with compress_bias: the biases' bin size (0: bin_size_fc)
};

// The compressor options for one tensor under `config`.
CompressorOptions OptionsForTensor(const ParamTensor& tensor, const CompressionConfig& config);

// Momentum correction (Lin et al., "Deep Gradient Compression", ICLR 2018): each worker
// keeps a velocity u = m u + g per tensor and compresses and pushes u instead of g, so the
// compressor's residue accumulates velocity; the servers then run plain SGD. With dense
// pushes this is exactly the servers' momentum (mean of the u's = the momentum of the mean
// gradient); with sparse pushes, momentum is no longer applied to updates that were held
// back in the residue, which is what the paper found to cost accuracy.
// Thread-compatible: one per exchange.
class MomentumCorrection {
 public:
  // `momentum` in [0, 1); 0 pushes the gradient unchanged.
  explicit MomentumCorrection(float momentum) : momentum_(momentum) {}
  float momentum() const { return momentum_; }
  // Adds a tensor of `size` elements (velocity 0); tensors are numbered in order from 0.
  void AddTensor(size_t size);
  // What to push for tensor `index` this step: `grad` itself when momentum is 0, else the
  // updated velocity (valid until the next call for the tensor). `grad` must have the
  // tensor's size (kInvalidArgument otherwise, or for an unknown index; nothing changes).
  absl::StatusOr<absl::Span<const float>> Push(size_t index, absl::Span<const float> grad);

 private:
  float momentum_;
  std::vector<std::vector<float>> velocity_;
};

}  // namespace adaps::trainer

#endif  // ADAPS_WORKER_APP_TRAINER_EXCHANGE_H_
