// The adaps scheduler: rendezvous, cluster view, tensor layout, barriers, heartbeats and
// coordinated shutdown (docs/architecture.md).
//
// Owns one Transport (ROUTER) and runs its socket loop: it reads each message, asks its parts
// what to do and sends the answers and views. The parts hold the state, without sockets:
// Roster (the nodes and the rank rules, scheduler/roster.h), TensorLayouts
// (scheduler/layout.h), Barriers (scheduler/barriers.h), RestoreStep (the step a restarting
// server restores, scheduler/restore_step.h), ServerOptimizerRule (the servers'
// --optimizer, scheduler/server_optimizer.h) and JobEnd (when the job ends and why,
// scheduler/job_end.h). All protocol state lives on the transport's I/O thread and is
// touched only there; the public methods are thread-safe.
//
// Shutdown: when every worker has left (Leave) or died, the scheduler sends Shutdown to the
// servers and WaitForShutdown returns.
//
// Restarts: a node that registers with a known identity gets its rank back (and everyone a
// new view when its address changed). A restarted scheduler knows nobody: nodes re-register
// when their heartbeat is refused, claiming their old rank and last epoch, and the cluster
// re-forms with the same ranks once every expected node is back (within
// SchedulerConfig::reform_timeout of the first, or the job ends naming who is missing);
// tensor layouts are recomputed identically when tensors are declared again in the same
// order.
#ifndef ADAPS_SCHEDULER_SCHEDULER_H_
#define ADAPS_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/transport.h"
#include "scheduler/barriers.h"
#include "scheduler/job_end.h"
#include "scheduler/layout.h"
#include "scheduler/restore_step.h"
#include "scheduler/roster.h"
#include "scheduler/scheduler_config.h"
#include "scheduler/server_optimizer.h"

namespace adaps {

class SchedulerMetrics;

class Scheduler {
 public:
  // `metrics` (null: none) must outlive the scheduler; see scheduler_metrics.h for what the
  // scheduler exports.
  explicit Scheduler(SchedulerConfig config, std::shared_ptr<TransportContext> context = nullptr,
                     Metrics* metrics = nullptr);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Binds and starts. kUnavailable when the address is in use; kInvalidArgument for a bad
  // config or endpoint.
  absl::Status Start();
  // The bound endpoint, e.g. tcp://127.0.0.1:40123.
  std::string endpoint() const;
  // Waits until the cluster has shut down. false when `timeout` passed first.
  bool WaitForShutdown(absl::Duration timeout);
  // After the shutdown: OK when the job completed (every worker left and no node is dead;
  // or an operator's Shutdown with code 0); else why not (the Shutdown's code and reason).
  absl::Status exit_status() const;
  void Stop();

 private:
  using Node = Roster::Node;

  void Handle(InMessage in);
  // A registration: a known identity rejoins (Rejoin); else the roster admits it (a rank
  // before the job forms, then Form once every node is in; a worker joining the formed job,
  // announced to every node and answered as a rejoined worker so it takes the current
  // parameters and skips the start-up barrier), holds it until the job forms, or refuses it.
  void OnRegister(InMessage& in);
  // A node re-registering with a known identity (`fresh`, from its Register) takes its rank
  // back; once the job formed, views tell everyone. false: no such node.
  bool Rejoin(const InMessage& in, const Node& fresh);
  // Every expected node is in: views to all, barriers released.
  void Form();
  void OnHeartbeat(InMessage& in);
  void OnBarrier(InMessage& in);
  void OnDeclare(InMessage& in);
  void OnLeave(InMessage& in);
  void CheckHeartbeats();
  // Sends `node` its view (answering request `reply_to`, 0: unsolicited); a server's carries
  // the step it restores (RestoreStep::For).
  void SendView(Node& node, uint64_t reply_to, bool rejoined = false);
  void BroadcastView();
  // One BroadcastView after the messages being handled now (posted to the I/O thread):
  // 64 workers leaving together make one or a few broadcasts, not 64 x 64 views queued
  // ahead of the answers to their Leave.
  void BroadcastViewSoon();
  // Makes BroadcastViewSoon's broadcast once it is due (the transport's timer, or at once).
  void FlushLeaveView();
  void ReleaseBarriers();
  void MaybeShutdown();
  // Tells every live node the job ended (Shutdown with `end`'s reason and code), once.
  void ShutdownCluster(const JobEnd::Reason& end);
  // The registered node that sent `in`: its role and rank match the envelope and it sent on
  // the connection it registered with. nullptr for anyone else (a forger claiming a rank).
  Node* Authenticated(const InMessage& in);
  void OnShutdownRequest(InMessage& in);
  // Answers `in` with `status` and counts the rejection under `reason` (metric_labels).
  void Reject(const InMessage& in, const absl::Status& status, const char* reason);
  void UpdateNodeMetrics();

  const SchedulerConfig config_;
  const std::string job_id_;  // config_.job_id, or a random one
  RoleLog log_;
  std::unique_ptr<Metrics> own_metrics_;  // a disabled one when none was given
  std::unique_ptr<SchedulerMetrics> metrics_;  // I/O thread only after Start
  std::unique_ptr<Transport> transport_;

  // I/O thread only.
  Roster roster_;
  TensorLayouts layouts_;
  Barriers barriers_;
  RestoreStep restore_step_;
  ServerOptimizerRule server_optimizer_;
  JobEnd job_end_;  // thread-safe
  uint32_t epoch_ = 0;
  uint32_t max_seen_epoch_ = 0;  // highest epoch a registering node reported
  // Workers that registered before the job formed, past --num_workers but within
  // --max_workers (Roster::Registered::Outcome::kHeld): they join it as soon as it forms.
  std::vector<InMessage> early_joiners_;
  // BroadcastViewSoon's broadcast, not yet made: when it is due (InfiniteFuture: none).
  absl::Time leave_view_due_ = absl::InfiniteFuture();
  absl::Time last_view_ = absl::InfinitePast();  // the latest BroadcastView
};

}  // namespace adaps

#endif  // ADAPS_SCHEDULER_SCHEDULER_H_
