// The optimizer a server applies to a slice once per step, and the learning-rate schedules
// a trainer drives it with. One definition for the server, the in-process simulator
// (worker/app/trainer/simulated_cluster) and the cluster trainer (worker/app/train_mode).
//
// Ownership: plain values; each slice owns its OptimizerState. Thread-safety: the functions
// are pure; an OptimizerState is used by one thread at a time.
#ifndef ADAPS_COMMON_OPTIMIZER_H_
#define ADAPS_COMMON_OPTIMIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace adaps {

// kSumOnly: params += grad (the summed, not averaged, pushes). kMean: the parameters become
// the step's averaged gradient (params := agg / pushed workers; async: the pushed
// gradient), so a pull answers exactly the mean gradient of that step.
enum class OptimizerKind { kSumOnly, kMean, kSgd, kMomentum, kNesterov, kAdam };

// "sum", "mean", "sgd", "momentum", "nesterov", "adam"; kInvalidArgument otherwise.
absl::StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name);
// The name ParseOptimizerKind takes: "sum", "mean", "sgd", ...
absl::string_view OptimizerKindName(OptimizerKind kind);

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};

// SGD's step of one element, p -= lr * (g + wd * p): the one expression of the servers' full
// and sparse passes and of the tracked step push by push that a worker replays
// (ApplySgdParts, DecodeForwardedSgdCopy), so the server and the replay give the same floats.
// (The build turns off floating-point contraction, so no call site fuses it into an FMA
// another does not.)
inline void SgdStep(float lr, float wd, float g, float& p) { p -= lr * (g + wd * p); }

// Sets one hyper-parameter by name (learning_rate, momentum, weight_decay, beta1, beta2,
// epsilon). kInvalidArgument for an unknown name or a value out of range (config unchanged).
absl::Status SetHyperParam(OptimizerConfig& config, const std::string& name, double value);

// What one slice's optimizer carries between steps: momentum / first moment `m`, second
// moment `v` (each sized on first use), and the Adam step count.
struct OptimizerState {
  std::vector<float> m, v;
  uint64_t adam_t = 0;
};

// One optimizer step over one slice: params -= f(grad) (sum-only: params += grad; mean:
// params = grad). `grad` and `params` have the same length.
void ApplyOptimizer(const OptimizerConfig& config, absl::Span<const float> grad,
                    absl::Span<float> params, OptimizerState& state);

// The server's step in one pass over its aggregation buffer: ApplyOptimizer of
// grad[i] * grad_scale (the mean of the workers' sum; sum-only takes grad as it is), and
// grad[i] = 0 once read. The same floats as scaling, applying and clearing in three passes.
void ApplyOptimizerAndClear(const OptimizerConfig& config, float grad_scale,
                            absl::Span<float> grad, absl::Span<float> params,
                            OptimizerState& state);

// Whether a step of `config` changes only the elements whose gradient is nonzero, so that
// the step's change is as sparse as the pushes (sparse pulls, server/shard.h): sum, mean
// (whose untouched elements become exactly 0) and SGD without weight decay. OK, or
// kFailedPrecondition naming what makes the step dense.
absl::Status SparseStepAllowed(const OptimizerConfig& config);

// ApplyOptimizerAndClear at the elements `at` only (ascending, distinct, < params.size()):
// the same floats at those elements as the full pass. For the kinds SparseStepAllowed
// accepts, the full pass leaves every other element as it was (mean: sets it to 0, which
// the caller does for the elements it set before). Other kinds: a full pass.
void ApplyOptimizerAndClearAt(const OptimizerConfig& config, float grad_scale,
                              absl::Span<const uint32_t> at, absl::Span<float> grad,
                              absl::Span<float> params, OptimizerState& state);

enum class LrSchedule { kConstant, kCosine };

// "constant" or "cosine"; kInvalidArgument otherwise.
absl::StatusOr<LrSchedule> ParseLrSchedule(absl::string_view name);

// The cosine decay at progress t (clamped to [0, 1]): 0.5 * lr * (1 + cos(pi * t)), so lr
// at t = 0 and 0 at t = 1.
double CosineLearningRate(double lr, double t);

// The rate for `step` of a run of `total_steps` (t = step / total_steps): constant: lr;
// cosine: CosineLearningRate(lr, t), staying 0 after the end. total_steps <= 0: lr.
double ScheduledLearningRate(LrSchedule schedule, double lr, int64_t step, int64_t total_steps);

}  // namespace adaps

#endif  // ADAPS_COMMON_OPTIMIZER_H_
