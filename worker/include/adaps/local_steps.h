// Local steps for a C++ trainer (DiLoCo's and SparseLoCo's shape): each worker takes H steps
// of its own optimizer on its own batches, then exchanges the change of its parameters since
// the last exchange. The change is pushed as declared (AdaComp with error feedback: what it
// holds back waits in the residue for the next exchange); the servers (--optimizer=mean)
// answer the workers' mean change; every replica becomes where the last exchange left it
// (its anchor) plus the outer step of that mean:
//
//   kAverage   the mean change itself (outer SGD at rate 1 without momentum; H = 1 is the
//              update exchange of adaps.torch's local mode)
//   kNesterov  DiLoCo's outer SGD with Nesterov momentum on the outer gradient -mean:
//              b = momentum * b + mean, change = lr * (mean + momentum * b)
//
//   auto steps = adaps::LocalSteps::Create(worker.get(), {});        // servers: mean
//   steps->Declare({"fc.w", {512, 256}, 500}, absl::MakeSpan(w));    // instead of Worker::Declare
//   for (int step = 1; ...; ++step) {
//     my_optimizer_step(w);                                          // H times
//     if (step % H == 0) steps->Exchange("fc.w", absl::MakeSpan(w)).get();
//   }
//
// adaps.torch's DistributedOptimizer(local_steps=H) is the same exchange for PyTorch. It
// declares AdaComp tensors with pull = PullFormat::kRecompressed and pull_bin_divisor 10 from
// 2 workers on, pushing at a quarter of the bin: at 4 workers, exact pulls of pushes at the
// bin left the zoo's transformer 4.1% above dense where these held it (docs/local-steps.md).
#ifndef ADAPS_LOCAL_STEPS_H_
#define ADAPS_LOCAL_STEPS_H_

#include <future>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "adaps/worker.h"

namespace adaps {

struct LocalStepsOptions {
  enum class Outer { kAverage, kNesterov };
  Outer outer = Outer::kAverage;
  float outer_lr = 0.7f;        // kNesterov (DiLoCo's values)
  float outer_momentum = 0.9f;  // kNesterov
};

class LocalSteps {
 public:
  // Over `worker` (not owned: it must outlive this object), whose servers run
  // --optimizer=mean: kFailedPrecondition otherwise (the servers would step on the changes
  // themselves), kInvalidArgument for an outer rate or momentum out of range.
  static absl::StatusOr<std::unique_ptr<LocalSteps>> Create(Worker* worker,
                                                            const LocalStepsOptions& options);
  ~LocalSteps();
  LocalSteps(const LocalSteps&) = delete;
  LocalSteps& operator=(const LocalSteps&) = delete;

  // Worker::Declare (collective; rank 0's values become everyone's), and `values` as they
  // come back become the tensor's anchor. The servers keep the running sum of the means
  // added to these values (TensorSpec::keep_sum, set here; with kRecompressed that sum is
  // the slice itself): with kAverage every anchor is that sum, bit for bit, and a worker that
  // joined a running job starts from it. A joiner with kNesterov (the others' anchors hold
  // their outer momentum's steps) gets kFailedPrecondition saying why, and nothing is
  // declared.
  absl::Status Declare(const TensorSpec& spec, absl::Span<float> values);

  // Collective (every worker, every declared tensor, at the same exchange): pushes
  // `params` - anchor, waits for the mean change and writes anchor + outer step into
  // `params`, which becomes the anchor. `params` must stay valid and untouched until the
  // future is ready; its get() finishes the exchange on the calling thread. On an error
  // (kNotFound: not declared here; kInvalidArgument: another length; or the push-pull's)
  // `params` and the anchor are left as they were; what the push sent stays sent.
  std::future<absl::Status> Exchange(absl::string_view name, absl::Span<float> params);

  // The anchor of `name` (where the last exchange left it), e.g. to checkpoint it with the
  // worker's residues; kNotFound if not declared here.
  absl::StatusOr<absl::Span<const float>> Anchor(absl::string_view name) const;

 private:
  struct State;
  LocalSteps(Worker* worker, const LocalStepsOptions& options);
  Worker* worker_;
  LocalStepsOptions options_;
  std::unique_ptr<State> state_;
};

}  // namespace adaps

#endif  // ADAPS_LOCAL_STEPS_H_
