// A synthetic but realistic gradient stream: the input of the codec and engine benchmarks and
// the default of adaps-worker's synthetic mode (worker/app/synthetic.h).
//
// Model (per coordinate i, step t, all deterministic given the seed):
//
//   x[t][i] = rho * x[t-1][i] + sqrt(1 - rho^2) * z[t][i],   z ~ N(0, 1) i.i.d.,
//   x[0][i] = z[0][i]                                          (unit variance at every step)
//   g[t][i] = scale[i] * (drift[i] + x[t][i])
//
// - `scale[i]` is `sigma` for most coordinates and `sigma * heavy_multiplier` for a random
//   `heavy_fraction` of them (the "few large coordinates" of real gradients: embeddings of
//   frequent tokens, biases, the last layer), each further multiplied by a log-normal
//   factor exp(lognormal_sigma * N(0,1)) so magnitudes are heavy-tailed rather than two-valued.
// - `drift[i]` ~ drift * N(0, 1), fixed per coordinate: the slowly-moving "signal" part of a
//   gradient, which error feedback accumulates; the AR(1) term is the minibatch noise, which
//   changes slowly between steps when rho is close to 1.
//
// The defaults give a stream on which AdaComp sends roughly 1-4% of the elements depending
// on the bin size; `Tuned1Percent()` returns options measured to give about 1% at T=500.
//
// Thread-safety: a GradientStream is thread-compatible. Cost: Next() is one pass with a
// fast counter-based Gaussian generator (about 2-4 ns per element), so generate steps ahead
// of any timed region.
#ifndef ADAPS_WORKER_APP_GRADIENT_STREAM_H_
#define ADAPS_WORKER_APP_GRADIENT_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace adaps {
namespace bench {

struct GradientStreamOptions {
  size_t length = 0;
  uint64_t seed = 1;
  float sigma = 1e-3f;            // background standard deviation
  double heavy_fraction = 0.002;  // fraction of coordinates with a large scale
  float heavy_multiplier = 20.0f;
  float lognormal_sigma = 0.5f;   // spread of per-coordinate scales
  float rho = 0.9f;               // AR(1) correlation of consecutive steps
  float drift = 0.3f;             // per-coordinate mean, in units of the coordinate's scale
  // Nonzero: the minibatch noise (z) comes from this seed while the per-coordinate scales and
  // drifts come from `seed`: data-parallel workers of one model (same `seed`, each its own
  // `noise_seed`) share which coordinates are large and where they drift.
  uint64_t noise_seed = 0;
};

class GradientStream {
 public:
  explicit GradientStream(const GradientStreamOptions& options);

  const GradientStreamOptions& options() const { return options_; }
  size_t size() const { return options_.length; }
  // Number of steps produced so far.
  uint64_t step() const { return step_; }

  // Writes the next step's gradient into `out` (size() elements; a shorter or longer span
  // is a programmer error and aborts).
  void Next(absl::Span<float> out);

  // Options on which AdaComp with the given bin size sends about 1% of the elements.
  static GradientStreamOptions Tuned1Percent(size_t length, uint64_t seed);

 private:
  GradientStreamOptions options_;
  std::vector<float> scale_;
  std::vector<float> drift_;
  std::vector<float> state_;  // x[t-1]
  uint64_t rng_;
  uint64_t step_ = 0;
};

}  // namespace bench
}  // namespace adaps

#endif  // ADAPS_WORKER_APP_GRADIENT_STREAM_H_
