#include "adaps/local_steps.h"

#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace adaps {

namespace {

struct TensorState {
  std::vector<float> anchor;
  std::vector<float> change;    // what this exchange pushes
  std::vector<float> mean;      // what it pulls
  std::vector<float> momentum;  // kNesterov's b (empty until the first exchange)
  // Recompressed pulls: the servers answer the running sum of the means added to the
  // declared values, which `replica` holds as of the last exchange; `mean` is then that sum.
  bool running = false;
  std::vector<float> replica;
  bool in_flight = false;
};

}  // namespace

struct LocalSteps::State {
  mutable absl::Mutex mu;
  std::map<std::string, TensorState, std::less<>> tensors ABSL_GUARDED_BY(mu);
};

LocalSteps::LocalSteps(Worker* worker, const LocalStepsOptions& options)
    : worker_(worker), options_(options), state_(std::make_unique<State>()) {}

LocalSteps::~LocalSteps() = default;

absl::StatusOr<std::unique_ptr<LocalSteps>> LocalSteps::Create(Worker* worker,
                                                               const LocalStepsOptions& options) {
  if (worker == nullptr) return absl::InvalidArgumentError("local steps: no worker");
  const std::string servers = worker->server_optimizer();
  if (servers != "mean") {
    return absl::FailedPreconditionError(absl::StrCat(
        "local steps need servers that answer the workers' mean change (adaps-server "
        "--optimizer=mean); these run '", servers.empty() ? "an unknown optimizer" : servers,
        "', which would step on the changes themselves"));
  }
  if (!(options.outer_lr > 0 && std::isfinite(options.outer_lr)) ||
      !(options.outer_momentum >= 0 && options.outer_momentum < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local steps: outer_lr must be > 0 and outer_momentum in [0, 1), got ",
        options.outer_lr, " and ", options.outer_momentum));
  }
  return std::unique_ptr<LocalSteps>(new LocalSteps(worker, options));
}

absl::Status LocalSteps::Declare(const TensorSpec& spec, absl::Span<float> values) {
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->tensors.count(spec.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("local steps: '", spec.name, "' is declared already"));
    }
  }
  if (spec.device >= 0) {
    return absl::UnimplementedError(absl::StrCat(
        "local steps: '", spec.name, "' on device ", spec.device,
        ": LocalSteps keeps its anchors and parameters in host memory; declare the tensor "
        "there (a trainer on a GPU copies its parameters every H steps)"));
  }
  const bool running = spec.pull == PullFormat::kRecompressed;
  if (worker_->rejoined() && options_.outer == LocalStepsOptions::Outer::kNesterov) {
    // The servers keep the running sum of the means, every anchor with the average outer
    // step; with Nesterov's each worker's anchor also holds its own momentum's steps.
    return absl::FailedPreconditionError(absl::StrCat(
        "local steps: this worker joined a running job (or registered again into it) with "
        "the Nesterov outer step: the servers keep the running sum of the exchanges' means, "
        "which is every worker's anchor only with Outer::kAverage; '", spec.name,
        "' would start without the others' outer momentum, offset from them for good. Use "
        "Outer::kAverage, or restart the whole job with the new worker count"));
  }
  // The servers keep every anchor (the running sum of the means added to the declared
  // values): a worker that joins starts from it (recompressed pulls answer nothing else).
  TensorSpec kept = spec;
  kept.keep_sum = true;
  if (absl::Status st = worker_->Declare(kept, values); !st.ok()) return st;
  TensorState t;
  t.running = running;
  if (running) t.replica.assign(values.begin(), values.end());
  t.anchor.assign(values.begin(), values.end());
  t.change.resize(values.size());
  t.mean.resize(values.size());
  absl::MutexLock lock(&state_->mu);
  state_->tensors.emplace(spec.name, std::move(t));
  return absl::OkStatus();
}

std::future<absl::Status> LocalSteps::Exchange(absl::string_view name, absl::Span<float> params) {
  auto ready = [](absl::Status st) {
    std::promise<absl::Status> p;
    p.set_value(std::move(st));
    return p.get_future();
  };
  TensorState* t = nullptr;
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->tensors.find(name);
    if (it == state_->tensors.end()) {
      return ready(absl::NotFoundError(absl::StrCat(
          "local steps: '", name, "' was not declared through LocalSteps::Declare")));
    }
    t = &it->second;
    if (params.size() != t->anchor.size()) {
      return ready(absl::InvalidArgumentError(
          absl::StrCat("local steps: '", name, "' has ", t->anchor.size(),
                       " elements, the exchange was given ", params.size())));
    }
    if (t->in_flight) {
      return ready(absl::FailedPreconditionError(absl::StrCat(
          "local steps: an exchange of '", name, "' is in flight; wait for its future first")));
    }
    t->in_flight = true;
  }
  // (The map's nodes are stable and only this exchange touches t's buffers now.)
  for (size_t i = 0; i < params.size(); ++i) t->change[i] = params[i] - t->anchor[i];
  std::future<absl::Status> pushed =
      worker_->PushPull(name, t->change, absl::MakeSpan(t->mean));
  return std::async(std::launch::deferred,
                    [this, t, params, pushed = std::move(pushed)]() mutable {
                      absl::Status st = pushed.get();
                      if (st.ok() && t->running) {
                        // The sum now less the sum before: this exchange's mean change.
                        for (size_t i = 0; i < params.size(); ++i) {
                          const float sum = t->mean[i];
                          t->mean[i] = sum - t->replica[i];
                          t->replica[i] = sum;
                        }
                      }
                      if (st.ok()) {
                        if (options_.outer == LocalStepsOptions::Outer::kNesterov) {
                          if (t->momentum.empty()) t->momentum.assign(t->mean.size(), 0.0f);
                          const float m = options_.outer_momentum, lr = options_.outer_lr;
                          for (size_t i = 0; i < params.size(); ++i) {
                            t->momentum[i] = m * t->momentum[i] + t->mean[i];
                            t->anchor[i] += lr * (t->mean[i] + m * t->momentum[i]);
                          }
                        } else if (t->running) {
                          t->anchor = t->replica;  // the servers' sum: every replica's
                        } else {
                          for (size_t i = 0; i < params.size(); ++i) t->anchor[i] += t->mean[i];
                        }
                        std::copy(t->anchor.begin(), t->anchor.end(), params.begin());
                      }
                      absl::MutexLock lock(&state_->mu);
                      t->in_flight = false;
                      return st;
                    });
}

absl::StatusOr<absl::Span<const float>> LocalSteps::Anchor(absl::string_view name) const {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->tensors.find(name);
  if (it == state_->tensors.end()) {
    return absl::NotFoundError(absl::StrCat("local steps: '", name, "' is not declared here"));
  }
  return absl::Span<const float>(it->second.anchor);
}

}  // namespace adaps
