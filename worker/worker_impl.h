// Internal to the worker library: Worker::Impl, the body behind the public pImpl
// (adaps/worker.h).
//
// Parts: the data path (Declare, Barrier, SetHyper, Checkpoint; worker_impl.cc), pushes and
// pulls that survive a server restart (Run, resynchronizing and retrying; worker/run.cc)
// over per-tensor state (worker/tensor.h), and the membership part
// (worker/membership.cc: what cluster views and a shutdown mean for the worker, over
// common/cluster_client, which registers, heartbeats and re-registers).
//
// Threads: caller threads run the public methods; the transport's I/O thread runs Handle,
// OnView, OnShutdown, the cluster client and every reply callback; the compression pool
// (options_.compression_threads, worker/job_pool.h; started in Init, drained and joined in
// Stop) encodes and sends each Run in call order and applies pull answers; the retry thread
// (started in Init, joined in Stop) resends the parts of a Run whose server restarted. State marked "I/O thread" is
// checked with ADAPS_DCHECK_ON_IO_THREAD. No lock is held across a blocking call.
#ifndef ADAPS_WORKER_WORKER_IMPL_H_
#define ADAPS_WORKER_WORKER_IMPL_H_

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <thread>
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
#include "common/cluster_client.h"
#include "common/logging.h"
#include "common/messages.h"
#include "common/metrics.h"
#include "common/transport.h"
#include "worker/fusion.h"
#include "worker/job_pool.h"
#include "worker/server_links.h"
#include "worker/tensor.h"
#include "worker/worker_metrics.h"

namespace adaps {

class Worker::Impl {
 public:
  explicit Impl(const WorkerOptions& options);
  ~Impl();

  // Registers with the scheduler and connects to the servers (membership.cc).
  absl::Status Init();

  int rank() const { return rank_; }
  int num_workers() const { return num_workers_; }
  int live_workers() const { return live_workers_.load(); }
  bool rejoined() const { return rejoined_; }
  int num_servers() const { return num_servers_; }

  absl::Status Declare(const TensorSpec& spec, absl::Span<float> values);
  std::future<absl::Status> Run(absl::string_view name, absl::Span<const float> grad,
                                absl::Span<float> out, bool push, bool pull);
  absl::Status Barrier();
  absl::Status PullParameters(absl::string_view name, absl::Span<float> out);
  absl::StatusOr<std::vector<uint32_t>> LastSent(absl::string_view name) const;
  absl::Status Residue(absl::string_view name, absl::Span<float> out) const;
  absl::Status SetResidue(absl::string_view name, absl::Span<const float> values);
  absl::Status SaveResidues(const std::string& path) const;
  absl::Status LoadResidues(const std::string& path);
  absl::Status SetBinSize(absl::string_view name, uint32_t bin_size);
  void CloseFusionBuckets();  // fusion.cc
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
  JobPool* pool_for_testing() { return pool_.get(); }

 private:
  // A blocking request: waits for the answer (the transport answers by the deadline). Call
  // it with no lock held.
  template <typename T>
  absl::StatusOr<InMessage> Call(int peer, flatbuffers::FlatBufferBuilder& fbb,
                                 flatbuffers::Offset<T> body, SharedBytes payload,
                                 absl::Duration timeout);

  // A blocking request to server `server`, built by `build(fbb)` (returns the body offset),
  // that survives its restart: kUnavailable is asked again (new incarnation, or a server
  // still registering) until request_timeout has passed (so a server that is gone for good
  // fails it only then). Call it with no lock held.
  template <typename Build>
  absl::Status CallServerResuming(int server, Build build, SharedBytes payload = nullptr);

  absl::Status CheckRunning();
  absl::StatusOr<Tensor*> Find(absl::string_view name) const;
  std::string Secret() const;

  // Data path (worker_impl.cc).
  absl::StatusOr<std::unique_ptr<Tensor>> NewTensor(const TensorSpec& spec, uint64_t length);
  absl::Status DeclareSlices(Tensor& t, absl::Span<float> values);
  // Dense pulls of `slices`: the parameters (format Dense) or, for the replica of a tensor
  // pulled recompressed, what the servers published (Replica; kinds.h ReplicaFormat).
  absl::StatusOr<std::vector<InMessage>> PullAllDense(
      const Tensor& t, const std::vector<size_t>& slices, const char* why,
      msg::PullFormat format = msg::PullFormat::Dense);

  // Runs that survive a server restart (run.cc). A slice is stale when its server's
  // incarnation changed since the slice learned its step; ResyncSlices learns step and
  // replica again from the (restored) server. Call both with no lock held.
  std::vector<size_t> StaleSlices(Tensor& t);
  absl::Status ResyncSlices(Tensor& t, const std::vector<size_t>& slices);
  // ResyncSlices, asked again while the server answers kUnavailable, until `deadline`.
  absl::Status ResyncWithin(Tensor& t, const std::vector<size_t>& slices, absl::Time deadline);
  // The body of Run for a tensor with its own slices (a bucket's internal one included);
  // `on_done` (may be empty) is called once with the outcome; `flush`: the push sends the
  // residues, dense (Leave).
  std::future<absl::Status> RunTensor(Tensor& t, absl::Span<const float> grad,
                                      absl::Span<float> out, bool push, bool pull,
                                      std::function<void(const absl::Status&)> on_done,
                                      bool flush = false);

  // Fusion of small tensors (fusion.cc, worker/fusion.h). DeclareFused declares a member
  // `t` (spec, length, compressor and residue set) into the open bucket, creating one when
  // needed; false in *fused when the tensor cannot be fused (it is then declared as usual).
  absl::Status DeclareFused(Tensor& t, absl::Span<float> values, bool* fused);
  absl::StatusOr<std::unique_ptr<Tensor>> NewMember(const TensorSpec& spec, uint64_t length);
  absl::StatusOr<FusionBucket*> OpenBucket(const Tensor& t);
  std::future<absl::Status> RunFused(Tensor& member, absl::Span<const float> grad,
                                     absl::Span<float> out, bool push, bool pull);
  // I/O thread timer: fails the staged members of buckets incomplete past their deadline.
  void ExpireFusion();
  // Fails every staged member (Stop).
  void FailStagedFusion(const absl::Status& status);

  // The first half of a Run (a pool thread; the caller with no pool): resynchronizes stale
  // slices, encodes the push. Returns the second half, run in call order: send every part,
  // or fail the future.
  JobPool::Job PrepareRun(const std::shared_ptr<RunOp>& op, absl::Span<const float> grad);
  // Applies a pull answer of slice `i` to op->out (unless op finished) and ends the part.
  void DecodePull(const std::shared_ptr<RunOp>& op, size_t i, const InMessage& reply,
                  size_t request_bytes, uint64_t step);
  // Sends the push and/or pull parts of `slices` (op->encoded holds the pushes).
  void SendParts(const std::shared_ptr<RunOp>& op, const std::vector<size_t>& slices);
  void SendPush(const std::shared_ptr<RunOp>& op, size_t i, int peer, uint64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op->t->mu);
  void SendPull(const std::shared_ptr<RunOp>& op, size_t i, int peer, uint64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op->t->mu);
  // One part finished (I/O thread; the sending thread once the transport stopped); the
  // last one ends the attempt (done, or a retry queued).
  void PartDone(const std::shared_ptr<RunOp>& op, size_t i, bool pull_part,
                absl::Status status);
  bool Retryable(RunOp& op, size_t i, bool pull_part, const absl::Status& status);
  // Retry thread (retries_): waits for the restarted servers, resynchronizes (or takes the
  // published replica again after a refused recompressed pull), sends again.
  void Retry(const std::shared_ptr<RunOp>& op, std::vector<size_t> slices);

  // Membership (membership.cc): common/cluster_client registers, heartbeats, re-registers
  // and guards views and shutdowns; OnView and OnShutdown are its callbacks (I/O thread).
  // Writes `values` (the whole tensor's, checked) into t's residues, dropping a pending one.
  void WriteResidue(Tensor& t, absl::Span<const float> values);
  absl::Status StartMetrics();
  // The L2 norm of every tensor's residues as last measured (the heartbeat reports it).
  float ResidueNorm() const;
  absl::Status ApplyRegistration(const msg::ClusterView& view);
  void Handle(InMessage in);
  void OnShutdown(const absl::Status& status);
  void OnView(const msg::ClusterView& view);

  const WorkerOptions options_;
  RoleLog log_;
  // Before the transport: its callbacks use them until it stops. Replaced in Init when
  // options_.metrics_port >= 0, before the transport starts; never null.
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<WorkerMetrics> worker_metrics_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<ClusterClient> cluster_;
  // The servers' peers, incarnations and liveness (its own lock; after the transport).
  std::unique_ptr<ServerLinks> links_;
  // Set in Init, read-only afterwards.
  int rank_ = -1;
  int num_workers_ = 0;
  int num_servers_ = 0;
  bool rejoined_ = false;  // we re-registered into (or joined) a formed cluster
  absl::Time registered_at_;
  // The live workers of the latest view (this one included): the job's worker count now.
  std::atomic<int> live_workers_{0};
  std::atomic<uint64_t> barrier_seq_{0};

  // Null with compression_threads = 0. Stopped (drained) after the transport in Stop.
  std::unique_ptr<JobPool> pool_;
  // The retry thread (Retry jobs, one at a time); closed in Stop before the transport stops
  // (a retry posted from then on fails its operation at once), joined after it.
  JobPool retries_{1};

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Tensor>> tensors_ ABSL_GUARDED_BY(mu_);
  // Fusion buckets (worker/fusion.h), in declaration order; the open one per pull format.
  std::vector<std::unique_ptr<FusionBucket>> buckets_ ABSL_GUARDED_BY(mu_);
  FusionBucket* open_bucket_[3] ABSL_GUARDED_BY(mu_) = {nullptr, nullptr, nullptr};
  bool fusion_off_ ABSL_GUARDED_BY(mu_) = false;  // a bucket was laid out as several slices
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // This worker's secret from its latest view: proves to servers it is a worker of the job.
  std::string secret_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status shutdown_status_ ABSL_GUARDED_BY(mu_);
};

template <typename T>
absl::StatusOr<InMessage> Worker::Impl::Call(int peer, flatbuffers::FlatBufferBuilder& fbb,
                                             flatbuffers::Offset<T> body, SharedBytes payload,
                                             absl::Duration timeout) {
  const uint64_t id = transport_->NewRequestId();
  auto promise = std::make_shared<std::promise<absl::StatusOr<InMessage>>>();
  auto future = promise->get_future();
  transport_->Request(peer, id,
                      FinishEnvelope(fbb, transport_->self(), body, id, 0, std::move(payload)),
                      absl::Now() + timeout, [promise](absl::StatusOr<InMessage> reply) {
                        promise->set_value(std::move(reply));
                      });
  // The transport answers every request by its deadline; the margin only guards a bug.
  if (future.wait_for(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout) + 5000)) !=
      std::future_status::ready) {
    return absl::DeadlineExceededError("request not answered");
  }
  return future.get();
}

template <typename Build>
absl::Status Worker::Impl::CallServerResuming(int server, Build build, SharedBytes payload) {
  const absl::Time deadline = absl::Now() + options_.request_timeout;
  while (true) {
    uint64_t incarnation = 0;
    const int peer = links_->Peer(server, &incarnation);
    flatbuffers::FlatBufferBuilder fbb(256);
    auto body = build(fbb);
    absl::Status st = Call(peer, fbb, body, payload, options_.request_timeout).status();
    // A worker that joined a running job may reach a server before the view that tells it
    // the new worker's secret (they travel on different connections): ask again, briefly.
    const bool unseen_secret = st.code() == absl::StatusCode::kPermissionDenied && rejoined_ &&
                               absl::Now() < registered_at_ + absl::Seconds(5);
    if ((st.code() != absl::StatusCode::kUnavailable && !unseen_secret) ||
        absl::Now() >= deadline) {
      return st;
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopped_ || shutdown_) return st;
    }
    // Wait for the restarted server's view (or pace a server still registering), then ask
    // again either way.
    links_->WaitForNewIncarnation(server, incarnation,
                                  std::min(deadline, absl::Now() + absl::Milliseconds(100)));
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace adaps

#endif  // ADAPS_WORKER_WORKER_IMPL_H_
