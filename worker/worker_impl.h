// Internal to the worker library: Worker::Impl, the body behind the public pImpl
// (adaps/worker.h).
//
// Parts: the data path (Declare, Run: push/pull, Resync, Barrier, SetHyper, Checkpoint;
// worker_impl.cc) over per-tensor state (worker/tensor.h), and the membership part
// (worker/membership.cc: what cluster views and a shutdown mean for the worker, over
// common/cluster_client, which registers, heartbeats and re-registers).
//
// Threads: caller threads run the public methods; the transport's I/O thread runs Handle,
// OnView, OnShutdown, the cluster client and every reply callback. State marked "I/O thread" is
// checked with ADAPS_DCHECK_ON_IO_THREAD. No lock is held across a blocking call.
#ifndef ADAPS_WORKER_WORKER_IMPL_H_
#define ADAPS_WORKER_WORKER_IMPL_H_

#include <atomic>
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
#include "common/cluster_client.h"
#include "common/logging.h"
#include "common/messages.h"
#include "common/metrics.h"
#include "common/transport.h"
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
  int num_servers() const { return num_servers_; }

  absl::Status Declare(const TensorSpec& spec, absl::Span<float> values);
  std::future<absl::Status> Run(absl::string_view name, absl::Span<const float> grad,
                                absl::Span<float> out, bool push, bool pull);
  absl::Status Barrier();
  absl::Status SetHyper(const std::vector<std::pair<std::string, double>>& params);
  absl::Status Checkpoint(const std::string& directory);
  absl::StatusOr<TrafficCounters> Traffic(absl::string_view name) const;
  absl::StatusOr<std::vector<SliceInfo>> Slices(absl::string_view name) const;
  std::vector<std::string> TensorNames() const;
  absl::Status Stop();

 private:
  // A blocking request: waits for the answer (the transport answers by the deadline). Call
  // it with no lock held.
  template <typename T>
  absl::StatusOr<InMessage> Call(int peer, flatbuffers::FlatBufferBuilder& fbb,
                                 flatbuffers::Offset<T> body, SharedBytes payload,
                                 absl::Duration timeout);

  absl::Status CheckRunning();
  absl::StatusOr<Tensor*> Find(absl::string_view name) const;
  int ServerPeer(int server) const;

  // Data path (worker_impl.cc).
  absl::StatusOr<std::unique_ptr<Tensor>> NewTensor(const TensorSpec& spec, uint64_t length);
  absl::Status DeclareSlices(Tensor& t, absl::Span<float> values);
  absl::StatusOr<std::vector<InMessage>> PullAllDense(const Tensor& t, const char* why);
  absl::Status Resync(Tensor& t);
  absl::Status StartPush(Tensor& t, absl::Span<const float> grad, const std::shared_ptr<Op>& op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  void StartPull(Tensor& t, absl::Span<float> out, const std::shared_ptr<Op>& op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);

  // Membership (membership.cc): common/cluster_client registers, heartbeats, re-registers
  // and guards views and shutdowns; OnView and OnShutdown are its callbacks (I/O thread).
  absl::Status StartMetrics();
  absl::Status ApplyRegistration(const msg::ClusterView& view);
  absl::Status ConnectServers(const msg::ClusterView& view);
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
  // Set in Init, read-only afterwards.
  int rank_ = -1;
  int num_workers_ = 0;
  int num_servers_ = 0;
  bool rejoined_ = false;  // we re-registered into a formed cluster
  std::vector<int> server_peer_ ABSL_GUARDED_BY(mu_);  // changes when a server moves
  std::atomic<uint64_t> server_generation_{0};          // bumped when a server moved
  std::atomic<uint64_t> barrier_seq_{0};
  // I/O thread only (ADAPS_DCHECK_ON_IO_THREAD).
  std::vector<std::string> server_address_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Tensor>> tensors_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
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

}  // namespace adaps

#endif  // ADAPS_WORKER_WORKER_IMPL_H_
