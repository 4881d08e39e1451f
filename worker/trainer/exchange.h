// GradientExchange: what the training loop calls once per step to hand its gradients to
// the parameter server and get the new parameters back. The same loop (trainer.h) runs
// over the in-process simulation (simulated_cluster.h) and over the cluster worker
// library (an adapter over worker/include/adaps/worker.h).
//
// Also here: which compressor each tensor gets (CompressionConfig), shared by every
// implementation so the simulation and the cluster compress the same way.
#ifndef ADAPS_WORKER_TRAINER_EXCHANGE_H_
#define ADAPS_WORKER_TRAINER_EXCHANGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/compressor.h"
#include "worker/trainer/layers.h"

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
// their layer type (DESIGN.md section 1: about 50 for conv, about 500 for fc).
struct CompressionConfig {
  CompressorKind kind = CompressorKind::kAdaComp;
  uint32_t bin_size_conv = 50;
  uint32_t bin_size_fc = 500;
  double topk_fraction = 0.001;
  bool compress_bias = false;
};

// The compressor options for one tensor under `config`.
CompressorOptions OptionsForTensor(const ParamTensor& tensor, const CompressionConfig& config);

}  // namespace adaps::trainer

#endif  // ADAPS_WORKER_TRAINER_EXCHANGE_H_
