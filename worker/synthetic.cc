#include "worker/synthetic.h"

#include <cstdio>
#include <cstdlib>
#include <future>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/compressor.h"
#include "common/status_macros.h"
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

}  // namespace

absl::Status RunSynthetic(Worker& worker, const SyntheticConfig& config) {
  ADAPS_RET_CHECK(config.layers >= 1 && config.total_params >= uint64_t(config.layers),
                  absl::StatusCode::kInvalidArgument, "need at least one element per layer");
  ADAPS_RET_CHECK(config.steps >= 1 && config.warmup >= 0, absl::StatusCode::kInvalidArgument,
                  "steps must be >= 1 and warmup >= 0");
  const int n = config.layers;
  std::vector<std::string> names;
  std::vector<std::vector<float>> params(n), grads_a(n), grads_b(n);
  for (int l = 0; l < n; ++l) {
    const uint64_t len = config.total_params / n + (uint64_t(l) < config.total_params % n ? 1 : 0);
    TensorSpec spec = config.layer;
    spec.name = absl::StrCat("layer", l);
    spec.shape = {static_cast<int64_t>(len)};
    params[l].assign(len, 0.0f);
    grads_a[l].resize(len);
    grads_b[l].resize(len);
    FillGradient(grads_a[l], config.seed * 1000 + l * 2 + worker.rank() * 7919);
    FillGradient(grads_b[l], config.seed * 1000 + l * 2 + 1 + worker.rank() * 7919);
    ADAPS_RETURN_IF_ERROR(worker.Declare(spec, absl::MakeSpan(params[l])));
    names.push_back(spec.name);
  }
  ADAPS_RETURN_IF_ERROR(worker.Barrier());
  const bool print = worker.rank() == 0;
  auto totals = [&]() -> absl::StatusOr<TrafficCounters> {
    TrafficCounters sum;
    for (const auto& name : names) {
      ADAPS_ASSIGN_OR_RETURN(TrafficCounters t, worker.Traffic(name));
      sum.push_wire_bytes += t.push_wire_bytes;
      sum.pull_wire_bytes += t.pull_wire_bytes;
      sum.push_dense_bytes += t.push_dense_bytes;
      sum.pull_dense_bytes += t.pull_dense_bytes;
    }
    return sum;
  };
  TrafficCounters before;
  absl::Duration timed = absl::ZeroDuration();
  for (int step = 0; step < config.warmup + config.steps; ++step) {
    if (step == config.warmup) {
      ADAPS_ASSIGN_OR_RETURN(before, totals());
    }
    const absl::Time start = absl::Now();
    std::vector<std::future<absl::Status>> futures;
    for (int l = 0; l < n; ++l) {
      auto& g = (step % 2 == 0) ? grads_a[l] : grads_b[l];
      futures.push_back(worker.PushPull(names[l], g, absl::MakeSpan(params[l])));
    }
    absl::Status status;
    for (auto& f : futures) {
      absl::Status s = f.get();
      if (status.ok()) status = s;
    }
    ADAPS_RETURN_IF_ERROR(status);
    const absl::Duration took = absl::Now() - start;
    if (step >= config.warmup) timed += took;
    if (print) {
      std::printf("step %d%s: %.1f ms\n", step, step < config.warmup ? " (warmup)" : "",
                  absl::ToDoubleMilliseconds(took));
    }
  }
  ADAPS_ASSIGN_OR_RETURN(TrafficCounters after, totals());
  const double steps = config.steps;
  const double step_s = absl::ToDoubleSeconds(timed) / steps;
  const double push_wire = (after.push_wire_bytes - before.push_wire_bytes) / steps;
  const double pull_wire = (after.pull_wire_bytes - before.pull_wire_bytes) / steps;
  const double push_dense = (after.push_dense_bytes - before.push_dense_bytes) / steps;
  const double pull_dense = (after.pull_dense_bytes - before.pull_dense_bytes) / steps;
  if (print) {
    std::printf(
        "SUMMARY compressor=%s pull=%s params=%llu layers=%d workers=%d servers=%d "
        "step_ms=%.2f push_wire_bytes=%.0f pull_wire_bytes=%.0f push_rate=%.1fx "
        "total_rate=%.2fx effective_GBps=%.3f wire_GBps=%.3f cluster_effective_GBps=%.3f\n",
        CompressorKindName(CodecKind(config.layer.compression)),
        config.layer.pull == PullFormat::kDense ? "dense" : "recompressed",
        static_cast<unsigned long long>(config.total_params), n, worker.num_workers(),
        worker.num_servers(), step_s * 1e3, push_wire, pull_wire,
        push_wire > 0 ? push_dense / push_wire : 0.0,
        push_wire + pull_wire > 0 ? (push_dense + pull_dense) / (push_wire + pull_wire) : 0.0,
        (push_dense + pull_dense) / step_s / 1e9, (push_wire + pull_wire) / step_s / 1e9,
        (push_dense + pull_dense) * worker.num_workers() / step_s / 1e9);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace adaps
