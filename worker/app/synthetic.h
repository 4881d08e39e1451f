// The synthetic mode of adaps-worker: declares tensors of given sizes and pushes and pulls
// them as fast as it can, reporting step time, bytes on the wire and compression rate.
#ifndef ADAPS_WORKER_APP_SYNTHETIC_H_
#define ADAPS_WORKER_APP_SYNTHETIC_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaps/worker.h"

namespace adaps {

// What the synthetic mode pushes.
enum class SyntheticGradients {
  // A realistic stream (worker/app/gradient_stream.h, tuned so that AdaComp at bin 500 sends
  // about 1% of the elements, as it does on the trainer's fully-connected layers): heavy-
  // tailed per-coordinate scales and drifts shared by every worker (the same model), minibatch
  // noise of its own per worker, correlated between steps. Four steps per layer are made
  // before the timed loop and taken in turn.
  kStream,
  // Each element the sum of two uniforms, two gradients per layer in turn: every element is
  // alike, so AdaComp sends 4.5-10% of them (a worst case for the sparse formats).
  kUniform,
};

struct SyntheticConfig {
  uint64_t total_params = 25'000'000;
  int layers = 10;
  int steps = 20;
  int warmup = 2;  // steps not timed
  TensorSpec layer;  // template: compression, bin size, top-k fraction, pull format
  uint64_t seed = 1;
  SyntheticGradients gradients = SyntheticGradients::kStream;
  // A stand-in for the trainer's backward pass on an accelerator (the CPU stays free): the
  // step sleeps this long before each layer's PushPull, as a backward pass produces the
  // gradients one by one. Zero: every layer is pushed at once.
  absl::Duration backward_per_layer = absl::ZeroDuration();
  // Asked before each step (null: never): true ends the run there with kCancelled.
  std::function<bool()> stop_requested;
};

// "25M", "1.5K", "1000", "2G" (decimal). kInvalidArgument otherwise.
absl::StatusOr<uint64_t> ParseCount(const std::string& text);

// Runs the benchmark; rank 0 prints per-step lines and a final "SUMMARY ..." line to stdout.
absl::Status RunSynthetic(Worker& worker, const SyntheticConfig& config);

}  // namespace adaps

#endif  // ADAPS_WORKER_APP_SYNTHETIC_H_
