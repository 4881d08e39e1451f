// The node side of the cluster protocol, shared by servers and workers: register with the
// scheduler, heartbeat, re-register after a scheduler restart, follow cluster-view epochs,
// leave, and handle Shutdown. The one implementation of these for every role.
//
// Protocol (schemas/adaps.fbs): Register is answered with a ClusterView once the cluster has
// formed. Then the node heartbeats every `heartbeat_interval_ms` of the view; the scheduler
// answers HeartbeatAck, or kFailedPrecondition when it does not know the node (it
// restarted): the client then registers again with its rank and last epoch, and the node
// keeps working on the view it has meanwhile. Unsolicited ClusterViews (a node died or
// moved) and Shutdown arrive on the DEALER to the scheduler.
//
// Grace policy (one for every role): a node that has not heard from the scheduler for
// `scheduler_grace` (no heartbeat answered, no re-registration accepted) gives up: the
// shutdown callback runs once with kUnavailable. A Shutdown from the scheduler runs it once
// with OK (a clean end, code 0) or the status the scheduler sent.
//
// Forged-message policy: ClusterView and Shutdown are accepted only from the scheduler's
// peer (our DEALER to it). The same bodies arriving any other way (a server's ROUTER, a
// server's DEALER) are refused: answered kPermissionDenied when they are requests, counted
// in refused(), and never passed on.
//
// Threads: the client lives on its Transport's I/O thread. Callbacks run there and must
// not block. Register and Leave block the calling thread (never the I/O thread) up to
// their deadlines. Construct the client before Transport::Start (it adds a timer).
#ifndef ADAPS_COMMON_CLUSTER_CLIENT_H_
#define ADAPS_COMMON_CLUSTER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/transport.h"

namespace adaps {

struct ClusterClientOptions {
  std::string scheduler;  // e.g. tcp://127.0.0.1:5000
  std::string address;    // servers: the address workers use; workers: empty
  std::string identity;   // optional stable identity (a restarted node keeps its rank)
  std::string optimizer;  // servers: their --optimizer, sent in Register; workers: empty
  // Servers: the rank this node had before it restarted (server/checkpoint.h RankFilePath),
  // claimed in the first Register, so that a scheduler restarted meanwhile gives it back;
  // -1: none.
  int claim_rank = -1;
  absl::Duration register_timeout = absl::Seconds(60);
  // How long the node keeps going without hearing from the scheduler (re-registering
  // meanwhile) before the shutdown callback runs with kUnavailable.
  absl::Duration scheduler_grace = absl::Seconds(60);
  // Servers: the steps of their step checkpoints, sent in Register and every Heartbeat
  // (server/checkpoint.h). Called on the registering thread and the I/O thread.
  std::function<std::vector<uint64_t>()> checkpoint_steps;
  // Servers: the latest step checkpoint every server has, from each HeartbeatAck (I/O thread).
  std::function<void(uint64_t)> on_common_step;
  // Workers: the L2 norm of their residues, sent in every Heartbeat (I/O thread; must not
  // wait for a lock held across an encode).
  std::function<float()> residue_norm;
};

// Why `endpoint` cannot be reached right now, in words: "connection refused", "no route to
// host", "unknown host 'x'", "no answer within 1s"; empty when a TCP connection to it
// succeeds or the endpoint is not tcp:// (inproc, ipc). Blocks up to `timeout`.
std::string ProbeEndpoint(const std::string& endpoint, absl::Duration timeout);

// The status a Shutdown stands for: OK for a clean end (code 0 or out of range), else
// the scheduler's code with "cluster stopped: <reason>".
absl::Status ShutdownStatus(const msg::Shutdown& shutdown);

class ClusterClient {
 public:
  struct Callbacks {
    // Every accepted ClusterView, in epoch order (older epochs are dropped), including the
    // answer to Register and to a re-registration. I/O thread.
    std::function<void(const msg::ClusterView&)> on_view;
    // Once: Shutdown from the scheduler (OK or its status), or the scheduler lost for
    // longer than the grace period (kUnavailable). I/O thread.
    std::function<void(const absl::Status&)> on_shutdown;
  };

  // `transport` must outlive the client; its role is the node's role. Adds a timer: call
  // before transport.Start().
  ClusterClient(Transport& transport, RoleLog& log, ClusterClientOptions options,
                Callbacks callbacks);
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // Connects to the scheduler and registers; returns the ClusterView message once the
  // cluster has formed. `on_registered`, when given, runs on the I/O thread right after
  // on_view for that view and before any later message is handled (a server restores its
  // checkpoint there); its error becomes Register's. kUnavailable: scheduler unreachable;
  // kDeadlineExceeded: no view within register_timeout; kDataLoss: a wrong answer.
  absl::StatusOr<InMessage> Register(std::function<absl::Status()> on_registered = nullptr);

  // The address registered (servers: known only once the ROUTER is bound). Call before
  // Register.
  void SetAddress(std::string address) { address_ = std::move(address); }

  // I/O thread: handles ClusterView and Shutdown (from the scheduler, or refuses them).
  // Returns true when the message was one of those, false for any other body.
  bool Handle(const InMessage& in);

  // Tells the scheduler this node is done (waits up to `timeout` for the answer) and stops
  // heartbeating. A no-op after a shutdown.
  absl::Status Leave(absl::Duration timeout);

  // The peer id of the scheduler on the transport (-1 before Register).
  int scheduler_peer() const { return scheduler_peer_.load(); }
  // The newest epoch seen.
  uint32_t epoch() const { return epoch_.load(); }
  // ClusterView/Shutdown messages refused as not coming from the scheduler.
  uint64_t refused() const { return refused_.load(); }
  // True once the shutdown callback ran.
  bool finished() const { return finished_.load(); }

 private:
  void OnView(const msg::ClusterView& view);
  void Heartbeat();
  void Reregister();
  // A Register request: a first registration (options_.claim_rank, epoch 0) or a
  // re-registration that claims the rank and last epoch this node had.
  OutMessage RegisterMessage(uint64_t request_id, int rank, uint32_t epoch);
  void Finish(const absl::Status& status);

  Transport& transport_;
  RoleLog& log_;
  const ClusterClientOptions options_;
  const Callbacks callbacks_;
  std::string address_;  // set before Register, read-only afterwards
  // Register.instance: random, never 0, the same in every registration of this client (a
  // restarted process has another, which tells the others it restarted).
  const uint64_t instance_;

  std::atomic<int> scheduler_peer_{-1};
  std::atomic<uint32_t> epoch_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<bool> registered_{false};
  std::atomic<bool> finished_{false};
  std::atomic<bool> left_{false};

  // I/O thread only.
  absl::Duration heartbeat_interval_ = absl::Seconds(1);
  absl::Time last_heartbeat_sent_;
  absl::Time last_heard_;  // last answer of the scheduler
  bool reregistering_ = false;
};

}  // namespace adaps

#endif  // ADAPS_COMMON_CLUSTER_CLIENT_H_
