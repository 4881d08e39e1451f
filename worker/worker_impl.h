// Internal to the worker library: Worker::Impl, the body behind the public pImpl
// (adaps/worker.h). It is wiring and the tensor table: the parts are objects of their own,
// each in its own files, and Impl owns them, starts them in Init and stops them in order:
//   - Membership (worker/membership.h): the transport, the cluster client, the server links
//     (worker/server_links.h), the requests the other parts make, stopped/shutdown;
//   - Runner (worker/run.h): the stages of an operation from the caller to its future, the
//     compression pool and the retry thread;
//   - FusionTable (worker/fusion.h): which tensors are fused into which bucket, and a member's
//     Run staged into its bucket's (to the runner a bucket is a tensor with a segmented
//     encoder, worker/bucket.h);
//   - Devices (worker/devices.h): the devices tensors live on (TensorSpec::device), opened
//     at their first tensor;
//   - WorkerMetrics (worker/worker_metrics.h).
// Impl itself keeps the tensor table (name -> Tensor, worker/tensor.h) and what reads or
// writes a tensor as a whole: Declare, PullParameters, residues, Leave, bin sizes,
// hyperparameters, checkpoints and traffic.
//
// Threads: caller threads run the public methods; the transport's I/O thread runs
// membership's callbacks, the timers and every reply callback; the runner's pool encodes and
// sends each Run in call order and applies pull answers; its retry thread resends the parts
// of a Run whose server restarted (docs/threading.md). No lock is held across a blocking
// call.
#ifndef ADAPS_WORKER_WORKER_IMPL_H_
#define ADAPS_WORKER_WORKER_IMPL_H_

#include <future>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "adaps/worker.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "worker/devices.h"
#include "worker/fusion.h"
#include "worker/job_pool.h"
#include "worker/membership.h"
#include "worker/run.h"
#include "worker/tensor.h"
#include "worker/worker_metrics.h"

namespace adaps {

class Worker::Impl {
 public:
  explicit Impl(const WorkerOptions& options);
  ~Impl();

  // Starts the metrics, the parts and the transport, and registers with the scheduler.
  absl::Status Init();

  int rank() const { return membership_->rank(); }
  int num_workers() const { return membership_->num_workers(); }
  int live_workers() const { return membership_->live_workers(); }
  bool rejoined() const { return membership_->rejoined(); }
  int num_servers() const { return membership_->num_servers(); }
  const std::string& server_optimizer() const { return membership_->server_optimizer(); }

  absl::Status Declare(const TensorSpec& spec, absl::Span<float> values);
  std::future<absl::Status> Run(absl::string_view name, absl::Span<const float> grad,
                                absl::Span<float> out, bool push, bool pull);
  // Run for a tensor on a device: device pointers, ordered after the trainer's `stream`.
  std::future<absl::Status> RunOnDevice(absl::string_view name, const float* grad, float* out,
                                        bool push, bool pull, void* stream);
  absl::Status Barrier();
  absl::Status PullParameters(absl::string_view name, absl::Span<float> out);
  absl::StatusOr<std::vector<uint32_t>> LastSent(absl::string_view name) const;
  absl::Status Residue(absl::string_view name, absl::Span<float> out) const;
  absl::Status SetResidue(absl::string_view name, absl::Span<const float> values);
  absl::Status SaveResidues(const std::string& path) const;
  absl::Status LoadResidues(const std::string& path);
  absl::Status SetBinSize(absl::string_view name, uint32_t bin_size);
  void CloseFusionBuckets();
  absl::Status SetHyper(const std::vector<std::pair<std::string, double>>& params);
  absl::Status Checkpoint(const std::string& directory);
  std::string ResidueCheckpointPath(const std::string& directory) const;
  absl::StatusOr<TrafficCounters> Traffic(absl::string_view name) const;
  absl::StatusOr<std::vector<SliceInfo>> Slices(absl::string_view name) const;
  std::vector<std::string> TensorNames() const;
  // Pushes every compressed tensor's residue (Worker::Leave), then Stop.
  absl::Status Leave();
  absl::Status Stop();

  // Tests only: the compression pool (null with compression_threads = 0).
  JobPool* pool_for_testing() { return runner_->pool(); }

 private:
  absl::StatusOr<Tensor*> Find(absl::string_view name) const;
  // Checks the spec and asks the scheduler for the layout; the tensor is not yet published.
  absl::StatusOr<std::unique_ptr<Tensor>> NewTensor(const TensorSpec& spec, uint64_t length);
  // Creates the slices on the servers (rank 0 sends the initial values), meets the others at
  // a barrier and pulls everyone's starting values into `values`.
  absl::Status DeclareSlices(Tensor& t, absl::Span<float> values);
  // Writes `values` (the whole tensor's, checked) into t's residues, dropping a pending one.
  absl::Status WriteResidue(Tensor& t, absl::Span<const float> values);
  absl::Status StartMetrics();
  // The L2 norm of every tensor's residues as last measured (the heartbeat reports it).
  float ResidueNorm() const;

  const WorkerOptions options_;
  RoleLog log_;
  // Before the parts: they report to them until they stop. Replaced in Init when
  // options_.metrics_port >= 0, before any part exists; never null.
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<WorkerMetrics> worker_metrics_;
  // Made in Init (null before, and after an Init that failed its checks), in this order; the
  // later ones use the earlier ones.
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<Runner> runner_;
  std::unique_ptr<FusionTable> fusion_;
  // Made in the constructor; never null.
  const std::unique_ptr<Devices> devices_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Tensor>> tensors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaps

#endif  // ADAPS_WORKER_WORKER_IMPL_H_
