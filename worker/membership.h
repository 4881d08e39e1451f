// Internal to the worker library: the worker's membership in the cluster. Owns the transport,
// common/cluster_client (which registers, heartbeats, re-registers with a restarted scheduler
// and refuses forged views and shutdowns) and the directory of server links
// (worker/server_links.h); turns the registration answer into rank and servers, later views
// into servers declared dead or moved, and a shutdown into failing what is in flight. It is
// also the worker's one way to ask something and wait: a request to a peer, to the scheduler,
// or to a server that may restart meanwhile.
//
// Threads: Start and Stop from the thread that creates and stops the worker; the requests and
// the state queries from any thread; Handle, OnView and OnShutdown on the transport's I/O
// thread (asserted). `mu_` guards the stopped/shutdown state and the secret; it is a leaf
// (docs/threading.md, "The worker library's locks").
#ifndef ADAPS_WORKER_MEMBERSHIP_H_
#define ADAPS_WORKER_MEMBERSHIP_H_

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adaps/worker.h"
#include "common/cluster_client.h"
#include "common/logging.h"
#include "common/messages.h"
#include "common/transport.h"
#include "worker/server_links.h"

namespace adaps {

class Membership {
 public:
  // `residue_norm` (the heartbeat reports it) is called on the I/O thread.
  Membership(const WorkerOptions& options, RoleLog& log, std::function<float()> residue_norm);
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Timers go in before Start.
  Transport& transport() { return *transport_; }
  ServerLinks& links() { return *links_; }

  // Starts the transport, registers with the scheduler and connects to the servers.
  absl::Status Start();

  // Set by Start (registration), read-only afterwards.
  int rank() const { return rank_; }
  int num_workers() const { return num_workers_; }
  int num_servers() const { return num_servers_; }
  // The servers' --optimizer from the registration's view (empty: they did not say).
  const std::string& server_optimizer() const { return server_optimizer_; }
  bool rejoined() const { return rejoined_; }
  // The live workers of the latest view (this one included): the job's worker count now.
  int live_workers() const { return live_workers_.load(); }
  // This worker's secret from its latest view: proves to servers it is a worker of the job.
  std::string Secret() const;

  // OK while the worker runs; the reason otherwise (stopped, or the cluster shut down).
  absl::Status CheckRunning() const;

  // A blocking request: waits for the answer (the transport answers by the deadline). Call it
  // with no lock held.
  template <typename T>
  absl::StatusOr<InMessage> Call(int peer, flatbuffers::FlatBufferBuilder& fbb,
                                 flatbuffers::Offset<T> body, SharedBytes payload,
                                 absl::Duration timeout);
  // The same to the scheduler, with the request timeout.
  template <typename T>
  absl::StatusOr<InMessage> CallScheduler(flatbuffers::FlatBufferBuilder& fbb,
                                          flatbuffers::Offset<T> body) {
    return Call(cluster_->scheduler_peer(), fbb, body, nullptr, options_.request_timeout);
  }
  // A blocking request to server `server`, built by `build(fbb)` (returns the body offset),
  // that survives its restart: kUnavailable is asked again (new incarnation, or a server
  // still registering) until request_timeout has passed (so a server that is gone for good
  // fails it only then). Call it with no lock held. The answer, or the last error.
  template <typename Build>
  absl::StatusOr<InMessage> CallServerResuming(int server, Build build,
                                               SharedBytes payload = nullptr);

  // The job's next barrier: returns once every live worker reached it.
  absl::Status Barrier();

  // Stopping, in the order Worker::Impl::Stop keeps: BeginStop marks the worker stopped and
  // closes the server links (a retry waiting for a server gives up); false when it was
  // stopped already. `*leave`: the worker registered and the cluster did not shut down, so it
  // should say goodbye (Leave). StopTransport fails what is still in flight.
  bool BeginStop(bool* leave);
  absl::Status Leave();
  void StopTransport();

 private:
  absl::Status ApplyRegistration(const msg::ClusterView& view);
  void Handle(InMessage in);
  void OnShutdown(const absl::Status& status);
  void OnView(const msg::ClusterView& view);

  const WorkerOptions& options_;
  RoleLog& log_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<ClusterClient> cluster_;
  // The servers' peers, incarnations and liveness (its own lock; after the transport).
  std::unique_ptr<ServerLinks> links_;
  // Set in Start, read-only afterwards.
  int rank_ = -1;
  int num_workers_ = 0;
  int num_servers_ = 0;
  std::string server_optimizer_;
  bool rejoined_ = false;  // we re-registered into (or joined) a formed cluster
  absl::Time registered_at_;
  std::atomic<int> live_workers_{0};
  std::atomic<uint64_t> barrier_seq_{0};

  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::string secret_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status shutdown_status_ ABSL_GUARDED_BY(mu_);
};

template <typename T>
absl::StatusOr<InMessage> Membership::Call(int peer, flatbuffers::FlatBufferBuilder& fbb,
                                           flatbuffers::Offset<T> body, SharedBytes payload,
                                           absl::Duration timeout) {
  const uint64_t id = transport_->NewRequestId();
  auto promise = std::make_shared<std::promise<absl::StatusOr<InMessage>>>();
  auto future = promise->get_future();
  transport_->Request(
      peer, id, FinishEnvelope(fbb, transport_->self(), body, id, 0, std::move(payload)),
      absl::Now() + timeout,
      [promise](absl::StatusOr<InMessage> reply) { promise->set_value(std::move(reply)); });
  // The transport answers every request by its deadline; the margin only guards a bug.
  if (future.wait_for(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout) + 5000)) !=
      std::future_status::ready) {
    return absl::DeadlineExceededError("request not answered");
  }
  return future.get();
}

template <typename Build>
absl::StatusOr<InMessage> Membership::CallServerResuming(int server, Build build,
                                                         SharedBytes payload) {
  const absl::Time deadline = absl::Now() + options_.request_timeout;
  while (true) {
    uint64_t incarnation = 0;
    const int peer = links_->Peer(server, &incarnation);
    flatbuffers::FlatBufferBuilder fbb(256);
    auto body = build(fbb);
    absl::StatusOr<InMessage> reply = Call(peer, fbb, body, payload, options_.request_timeout);
    if (reply.ok()) return reply;
    const absl::Status st = reply.status();
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

#endif  // ADAPS_WORKER_MEMBERSHIP_H_
