#include "worker/app/synthetic.h"

#include <cstdio>
#include <cstdlib>
#include <future>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/compressor.h"
#include "common/status_macros.h"
#include "worker/app/gradient_stream.h"
#include "worker/kinds.h"

namespace adaps {

absl::StatusOr<uint64_t> ParseCount(const std::string& text) {
  if (text.empty()) return absl::InvalidArgumentError("empty count");
  double scale = 1;
  std::string number = text;
  switch (text.back()) {
    case 'K': case 'k': scale = 1e3; number.pop_back(); break;
    case 'M': case 'm': scale = 1e6; number.pop_back(); break;
    case 'G': case 'g': scale = 1e9; number.pop_back(); break;
    default: break;
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || value <= 0 || value * scale > 4e12) {
    return absl::InvalidArgumentError(absl::StrCat("bad count '", text, "' (e.g. 25M, 1000)"));
  }
  return static_cast<uint64_t>(value * scale + 0.5);
}

namespace {

void FillGradient(std::vector<float>& g, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& v : g) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    // Roughly bell-shaped: sum of two uniforms in [-1, 1), scaled like a gradient.
    const float a = static_cast<float>(x & 0xFFFF) / 32768.0f - 1.0f;
    const float b = static_cast<float>((x >> 16) & 0xFFFF) / 32768.0f - 1.0f;
    v = 1e-3f * (a + b);
  }
}

// Steps of the realistic stream made per layer before the timed loop (taken in turn).
constexpr int kStreamSteps = 4;

// The synthetic model: `layers` tensors of about equal size, a few gradients each (steps take
// them in turn).
struct Layers {
  std::vector<std::string> names;
  std::vector<std::vector<float>> params;
  std::vector<std::vector<std::vector<float>>> grads;  // [layer][step % size]
};

// Layer `l`'s gradients on this worker (see SyntheticGradients).
std::vector<std::vector<float>> MakeGradients(const SyntheticConfig& config, int rank, int l,
                                              uint64_t len) {
  std::vector<std::vector<float>> grads;
  if (config.gradients == SyntheticGradients::kUniform) {
    for (int k = 0; k < 2; ++k) {
      grads.emplace_back(len);
      FillGradient(grads.back(), config.seed * 1000 + l * 2 + k + uint64_t(rank) * 7919);
    }
    return grads;
  }
  bench::GradientStreamOptions options =
      bench::GradientStream::Tuned1Percent(len, config.seed * 1000 + uint64_t(l) + 1);
  options.noise_seed = config.seed * 1000003 + uint64_t(rank) * 7919 + uint64_t(l) + 1;
  bench::GradientStream stream(options);
  for (int k = 0; k < kStreamSteps; ++k) {
    grads.emplace_back(len);
    stream.Next(absl::MakeSpan(grads.back()));
  }
  return grads;
}

absl::StatusOr<Layers> DeclareLayers(Worker& worker, const SyntheticConfig& config) {
  const int n = config.layers;
  Layers m;
  m.params.resize(n);
  m.grads.resize(n);
  for (int l = 0; l < n; ++l) {
    const uint64_t len = config.total_params / n + (uint64_t(l) < config.total_params % n ? 1 : 0);
    TensorSpec spec = config.layer;
    spec.name = absl::StrCat("layer", l);
    spec.shape = {static_cast<int64_t>(len)};
    m.params[l].assign(len, 0.0f);
    m.grads[l] = MakeGradients(config, worker.rank(), l, len);
    ADAPS_RETURN_IF_ERROR(worker.Declare(spec, absl::MakeSpan(m.params[l])));
    m.names.push_back(spec.name);
  }
  return m;
}

// Traffic and worker-side time of every layer together.
absl::StatusOr<TrafficCounters> Totals(Worker& worker, const Layers& m) {
  TrafficCounters sum;
  for (const auto& name : m.names) {
    ADAPS_ASSIGN_OR_RETURN(TrafficCounters t, worker.Traffic(name));
    sum.push_wire_bytes += t.push_wire_bytes;
    sum.pull_wire_bytes += t.pull_wire_bytes;
    sum.push_dense_bytes += t.push_dense_bytes;
    sum.pull_dense_bytes += t.pull_dense_bytes;
    sum.compress_seconds += t.compress_seconds;
    sum.decode_seconds += t.decode_seconds;
    sum.server_seconds += t.server_seconds;
    sum.pulls_answered_sparse += t.pulls_answered_sparse;
    sum.pulls_answered_forwarded += t.pulls_answered_forwarded;
    sum.pulls_answered_dense += t.pulls_answered_dense;
  }
  return sum;
}

// One step's phases in ms: the worker's compression and decoding (summed over its
// threads), and the rest of the step's wall time (the wire, the servers' work, waiting).
// `server`: the servers' engine work on the versions pulled, as they reported it (summed
// over slices; it overlaps the rest). `calls`: the caller's time inside PushPull (what the
// trainer's thread loses).
struct Phases {
  double step = 0, compress = 0, decode = 0, server = 0, calls = 0;
  double rest() const { return step - compress - decode; }
  void Add(const Phases& p) {
    step += p.step;
    compress += p.compress;
    decode += p.decode;
    server += p.server;
    calls += p.calls;
  }
};

// Pushes and pulls every layer (each after `backward`), all in flight together.
absl::StatusOr<Phases> RunStep(Worker& worker, Layers& m, int step, absl::Duration backward) {
  ADAPS_ASSIGN_OR_RETURN(TrafficCounters before, Totals(worker, m));
  const absl::Time start = absl::Now();
  absl::Duration in_calls;
  std::vector<std::future<absl::Status>> futures;
  for (size_t l = 0; l < m.names.size(); ++l) {
    if (backward > absl::ZeroDuration()) absl::SleepFor(backward);
    const auto& g = m.grads[l][static_cast<size_t>(step) % m.grads[l].size()];
    const absl::Time call = absl::Now();
    futures.push_back(worker.PushPull(m.names[l], g, absl::MakeSpan(m.params[l])));
    in_calls += absl::Now() - call;
  }
  absl::Status status;
  for (auto& f : futures) {
    absl::Status s = f.get();
    if (status.ok()) status = s;
  }
  ADAPS_RETURN_IF_ERROR(status);
  Phases p;
  p.step = absl::ToDoubleMilliseconds(absl::Now() - start);
  ADAPS_ASSIGN_OR_RETURN(TrafficCounters after, Totals(worker, m));
  p.compress = (after.compress_seconds - before.compress_seconds) * 1e3;
  p.decode = (after.decode_seconds - before.decode_seconds) * 1e3;
  p.server = (after.server_seconds - before.server_seconds) * 1e3;
  p.calls = absl::ToDoubleMilliseconds(in_calls);
  return p;
}

// The fraction of the elements the last step's pushes sent.
absl::StatusOr<double> LastDensity(Worker& worker, const Layers& m, uint64_t total) {
  uint64_t sent = 0;
  for (const auto& name : m.names) {
    ADAPS_ASSIGN_OR_RETURN(std::vector<uint32_t> indices, worker.LastSent(name));
    sent += indices.size();
  }
  return static_cast<double>(sent) / static_cast<double>(total);
}

void PrintSummary(Worker& worker, const SyntheticConfig& config, const TrafficCounters& before,
                  const TrafficCounters& after, const Phases& timed, double density) {
  const double steps = config.steps;
  const double step_s = timed.step / 1e3 / steps;
  const double push_wire = (after.push_wire_bytes - before.push_wire_bytes) / steps;
  const double pull_wire = (after.pull_wire_bytes - before.pull_wire_bytes) / steps;
  const double push_dense = (after.push_dense_bytes - before.push_dense_bytes) / steps;
  const double pull_dense = (after.pull_dense_bytes - before.pull_dense_bytes) / steps;
  std::printf(
      "SUMMARY compressor=%s pull=%s gradients=%s density=%.4f params=%llu layers=%d "
      "workers=%d servers=%d "
      "step_ms=%.2f push_wire_bytes=%.0f pull_wire_bytes=%.0f push_rate=%.1fx "
      "total_rate=%.2fx effective_GBps=%.3f wire_GBps=%.3f cluster_effective_GBps=%.3f "
      "compress_ms=%.2f wire_server_ms=%.2f decode_ms=%.2f server_ms=%.2f in_calls_ms=%.2f "
      "sparse_answers=%llu forwarded_answers=%llu dense_answers=%llu\n",
      CompressorKindName(CodecKind(config.layer.compression)),
      config.layer.pull == PullFormat::kDense    ? "dense"
      : config.layer.pull == PullFormat::kSparse ? "sparse"
                                                 : "recompressed",
      config.gradients == SyntheticGradients::kStream ? "stream" : "uniform", density,
      static_cast<unsigned long long>(config.total_params), config.layers, worker.num_workers(),
      worker.num_servers(), step_s * 1e3, push_wire, pull_wire,
      push_wire > 0 ? push_dense / push_wire : 0.0,
      push_wire + pull_wire > 0 ? (push_dense + pull_dense) / (push_wire + pull_wire) : 0.0,
      (push_dense + pull_dense) / step_s / 1e9, (push_wire + pull_wire) / step_s / 1e9,
      (push_dense + pull_dense) * worker.num_workers() / step_s / 1e9, timed.compress / steps,
      timed.rest() / steps, timed.decode / steps, timed.server / steps, timed.calls / steps,
      static_cast<unsigned long long>(after.pulls_answered_sparse - before.pulls_answered_sparse),
      static_cast<unsigned long long>(after.pulls_answered_forwarded -
                                      before.pulls_answered_forwarded),
      static_cast<unsigned long long>(after.pulls_answered_dense - before.pulls_answered_dense));
  std::fflush(stdout);
}

}  // namespace

absl::Status RunSynthetic(Worker& worker, const SyntheticConfig& config) {
  ADAPS_RET_CHECK(config.layers >= 1 && config.total_params >= uint64_t(config.layers),
                  absl::StatusCode::kInvalidArgument, "need at least one element per layer");
  ADAPS_RET_CHECK(config.steps >= 1 && config.warmup >= 0, absl::StatusCode::kInvalidArgument,
                  "steps must be >= 1 and warmup >= 0");
  ADAPS_ASSIGN_OR_RETURN(Layers m, DeclareLayers(worker, config));
  // (The start-up barrier is behind a worker that joined a running job.)
  if (!worker.rejoined()) ADAPS_RETURN_IF_ERROR(worker.Barrier());
  const bool print = worker.rank() == 0;
  TrafficCounters before;
  Phases timed;
  for (int step = 0; step < config.warmup + config.steps; ++step) {
    if (config.stop_requested && config.stop_requested()) {
      return absl::CancelledError(absl::StrCat("stop requested before step ", step));
    }
    if (step == config.warmup) {
      ADAPS_ASSIGN_OR_RETURN(before, Totals(worker, m));
    }
    ADAPS_ASSIGN_OR_RETURN(Phases p, RunStep(worker, m, step, config.backward_per_layer));
    if (step >= config.warmup) timed.Add(p);
    if (print) {
      std::printf("step %d%s: %.1f ms (worker compress %.1f ms, wire+server %.1f ms, "
                  "worker decode %.1f ms; servers' work %.1f ms; caller in PushPull %.1f ms)\n",
                  step, step < config.warmup ? " (warmup)" : "", p.step, p.compress, p.rest(),
                  p.decode, p.server, p.calls);
    }
  }
  ADAPS_ASSIGN_OR_RETURN(TrafficCounters after, Totals(worker, m));
  if (print) {
    ADAPS_ASSIGN_OR_RETURN(double density, LastDensity(worker, m, config.total_params));
    PrintSummary(worker, config, before, after, timed, density);
  }
  return absl::OkStatus();
}

}  // namespace adaps
