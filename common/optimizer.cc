#include "common/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/scatter.h"
#include "common/status_macros.h"

namespace adaps {

absl::StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  if (name == "sum") return OptimizerKind::kSumOnly;
  if (name == "mean") return OptimizerKind::kMean;
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "nesterov") return OptimizerKind::kNesterov;
  if (name == "adam") return OptimizerKind::kAdam;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown optimizer '", name, "' (expected sum, mean, sgd, momentum, nesterov or adam)"));
}

absl::string_view OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSumOnly:
      return "sum";
    case OptimizerKind::kMean:
      return "mean";
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kMomentum:
      return "momentum";
    case OptimizerKind::kNesterov:
      return "nesterov";
    case OptimizerKind::kAdam:
      return "adam";
  }
  return "";
}

absl::Status SetHyperParam(OptimizerConfig& c, const std::string& name, double value) {
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("hyper-parameter ", name, " is not finite"));
  }
  const float f = static_cast<float>(value);
  auto in_unit = [&](float* field) -> absl::Status {
    ADAPS_RET_CHECK(f >= 0.0f && f < 1.0f, absl::StatusCode::kInvalidArgument,
                    absl::StrCat(name, " must be in [0, 1)"));
    *field = f;
    return absl::OkStatus();
  };
  if (name == "learning_rate") {
    ADAPS_RET_CHECK(f >= 0.0f, absl::StatusCode::kInvalidArgument,
                    "learning_rate must be non-negative");
    c.learning_rate = f;
    return absl::OkStatus();
  }
  if (name == "weight_decay") {
    ADAPS_RET_CHECK(f >= 0.0f, absl::StatusCode::kInvalidArgument,
                    "weight_decay must be non-negative");
    c.weight_decay = f;
    return absl::OkStatus();
  }
  if (name == "epsilon") {
    ADAPS_RET_CHECK(f > 0.0f, absl::StatusCode::kInvalidArgument, "epsilon must be positive");
    c.epsilon = f;
    return absl::OkStatus();
  }
  if (name == "momentum") return in_unit(&c.momentum);
  if (name == "beta1") return in_unit(&c.beta1);
  if (name == "beta2") return in_unit(&c.beta2);
  return absl::InvalidArgumentError(absl::StrCat("unknown hyper-parameter '", name, "'"));
}

namespace {

// The gradient as the optimizers read it: grad[i] * scale, and with kClear grad[i] = 0 after.
// (x * 1.0f is x: ApplyOptimizer's plain reads are the same floats.)
template <bool kClear>
struct Grad {
  float* g;
  float scale;
  float operator()(size_t i) const {
    const float v = g[i] * scale;
    if (kClear) g[i] = 0.0f;
    return v;
  }
};

template <typename G>
void ApplyMomentum(const OptimizerConfig& c, G grad, absl::Span<float> p, std::vector<float>& m) {
  const size_t n = p.size();
  if (m.size() != n) m.assign(n, 0.0f);
  const float lr = c.learning_rate, wd = c.weight_decay, mu = c.momentum;
  const bool nesterov = c.kind == OptimizerKind::kNesterov;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad(i) + wd * p[i];
    m[i] = mu * m[i] + g;
    p[i] -= lr * (nesterov ? g + mu * m[i] : m[i]);
  }
}

template <typename G>
void ApplyAdam(const OptimizerConfig& c, G grad, absl::Span<float> p, OptimizerState& s) {
  const size_t n = p.size();
  if (s.m.size() != n) s.m.assign(n, 0.0f);
  if (s.v.size() != n) s.v.assign(n, 0.0f);
  ++s.adam_t;
  const float lr = c.learning_rate, wd = c.weight_decay, b1 = c.beta1, b2 = c.beta2;
  const float c1 = 1.0f - std::pow(b1, static_cast<float>(s.adam_t));
  const float c2 = 1.0f - std::pow(b2, static_cast<float>(s.adam_t));
  for (size_t i = 0; i < n; ++i) {
    const float g = grad(i) + wd * p[i];
    s.m[i] = b1 * s.m[i] + (1.0f - b1) * g;
    s.v[i] = b2 * s.v[i] + (1.0f - b2) * g * g;
    p[i] -= lr * (s.m[i] / c1) / (std::sqrt(s.v[i] / c2) + c.epsilon);
  }
}

// The elementwise kinds' step of one element: one expression for the full pass and for
// the pass over touched elements (ApplyOptimizerAndClearAt), so both give the same floats.
inline void SumStep(float g, float& p) { p += g; }
inline void MeanStep(float g, float& p) { p = g; }

template <typename G>
void Apply(const OptimizerConfig& c, G grad, absl::Span<float> p, OptimizerState& state) {
  const size_t n = p.size();
  const float lr = c.learning_rate, wd = c.weight_decay;
  switch (c.kind) {
    case OptimizerKind::kSumOnly:
      for (size_t i = 0; i < n; ++i) SumStep(grad(i), p[i]);
      return;
    case OptimizerKind::kMean:
      for (size_t i = 0; i < n; ++i) MeanStep(grad(i), p[i]);
      return;
    case OptimizerKind::kSgd:
      for (size_t i = 0; i < n; ++i) SgdStep(lr, wd, grad(i), p[i]);
      return;
    case OptimizerKind::kMomentum:
    case OptimizerKind::kNesterov:
      return ApplyMomentum(c, grad, p, state.m);
    case OptimizerKind::kAdam:
      return ApplyAdam(c, grad, p, state);
  }
}

}  // namespace

void ApplyOptimizer(const OptimizerConfig& c, absl::Span<const float> grad,
                    absl::Span<float> p, OptimizerState& state) {
  // Read only: Grad<false> never writes through the pointer.
  Apply(c, Grad<false>{const_cast<float*>(grad.data()), 1.0f}, p, state);
}

void ApplyOptimizerAndClear(const OptimizerConfig& c, float grad_scale, absl::Span<float> grad,
                            absl::Span<float> p, OptimizerState& state) {
  const float scale = c.kind == OptimizerKind::kSumOnly ? 1.0f : grad_scale;
  Apply(c, Grad<true>{grad.data(), scale}, p, state);
}

absl::Status SparseStepAllowed(const OptimizerConfig& c) {
  switch (c.kind) {
    case OptimizerKind::kSumOnly:
    case OptimizerKind::kMean:
      return absl::OkStatus();
    case OptimizerKind::kSgd:
      if (c.weight_decay == 0.0f) return absl::OkStatus();
      return absl::FailedPreconditionError(absl::StrCat(
          "the servers' SGD has weight_decay ", c.weight_decay,
          ", which changes every parameter each step"));
    case OptimizerKind::kMomentum:
      return absl::FailedPreconditionError(
          "the servers run momentum, which changes every parameter with a velocity each step");
    case OptimizerKind::kNesterov:
      return absl::FailedPreconditionError(
          "the servers run Nesterov momentum, which changes every parameter with a velocity "
          "each step");
    case OptimizerKind::kAdam:
      return absl::FailedPreconditionError(
          "the servers run Adam, which changes every parameter with a moment each step");
  }
  return absl::FailedPreconditionError("unknown optimizer");
}

void ApplyOptimizerAndClearAt(const OptimizerConfig& c, float grad_scale,
                              absl::Span<const uint32_t> at, absl::Span<float> grad,
                              absl::Span<float> p, OptimizerState& state) {
  if (!SparseStepAllowed(c).ok()) return ApplyOptimizerAndClear(c, grad_scale, grad, p, state);
  const float scale = c.kind == OptimizerKind::kSumOnly ? 1.0f : grad_scale;
  const Grad<true> g{grad.data(), scale};
  const float lr = c.learning_rate, wd = c.weight_decay;
  switch (c.kind) {
    case OptimizerKind::kSumOnly:
      return ForEachScattered(
          at.data(), at.size(), [&](size_t j) { SumStep(g(at[j]), p[at[j]]); }, grad.data(),
          p.data());
    case OptimizerKind::kMean:
      return ForEachScattered(
          at.data(), at.size(), [&](size_t j) { MeanStep(g(at[j]), p[at[j]]); }, grad.data(),
          p.data());
    default:
      return ForEachScattered(
          at.data(), at.size(), [&](size_t j) { SgdStep(lr, wd, g(at[j]), p[at[j]]); }, grad.data(),
          p.data());
  }
}

absl::StatusOr<LrSchedule> ParseLrSchedule(absl::string_view name) {
  if (name == "constant") return LrSchedule::kConstant;
  if (name == "cosine") return LrSchedule::kCosine;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown learning-rate schedule '", name, "' (constant or cosine)"));
}

double CosineLearningRate(double lr, double t) {
  t = std::min(1.0, std::max(0.0, t));
  return 0.5 * lr * (1.0 + std::cos(M_PI * t));
}

double ScheduledLearningRate(LrSchedule schedule, double lr, int64_t step, int64_t total_steps) {
  if (schedule == LrSchedule::kConstant || total_steps <= 0) return lr;
  return CosineLearningRate(lr, static_cast<double>(step) / static_cast<double>(total_steps));
}

}  // namespace adaps
