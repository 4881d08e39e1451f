// The adaps scheduler: rendezvous, cluster view, tensor layout, barriers, heartbeats and
// coordinated shutdown (docs/architecture.md).
//
// Owns one Transport (ROUTER). All protocol state lives on the transport's I/O thread and
// is touched only there; the public methods are thread-safe.
//
// Shutdown: when every worker has left (Leave) or died, the scheduler sends Shutdown to the
// servers and WaitForShutdown returns.
//
// Restarts: a node that registers with a known identity gets its rank back (and everyone a
// new view when its address changed). A restarted scheduler knows nobody: nodes re-register
// when their heartbeat is refused, claiming their old rank and last epoch, and the cluster
// re-forms with the same ranks once every expected node is back; tensor layouts are
// recomputed identically when tensors are declared again in the same order.
#ifndef ADAPS_SCHEDULER_SCHEDULER_H_
#define ADAPS_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/transport.h"

namespace adaps {

struct SchedulerConfig {
  std::string bind = "tcp://127.0.0.1:0";  // port 0: the OS picks; see endpoint()
  int num_servers = 1;
  int num_workers = 1;  // the workers the job starts with (it forms when they are in)
  // The most live workers at once: workers that register after the job started (a new
  // identity, not a restart) are admitted while fewer are live (elastic membership,
  // docs/reliability.md "Workers that join"). 0: num_workers (nobody joins).
  int max_workers = 0;
  absl::Duration heartbeat_interval = absl::Seconds(1);  // told to every node
  absl::Duration dead_timeout = absl::Seconds(30);       // silent this long: dead
  // Tensors with at least this many elements are split over all servers; smaller ones go
  // whole to the least-loaded server.
  uint64_t split_threshold = 1 << 16;
  // What a worker declared dead means: the others continue (sync steps average over the
  // live workers), or the whole cluster stops with an ABORTED shutdown naming the worker.
  enum class OnWorkerDeath { kContinue, kFail };
  OnWorkerDeath on_worker_death = OnWorkerDeath::kContinue;
  CurveKeys curve;  // enabled: only allowed_clients may connect (common/config.h)
  // What an operator's Shutdown request must carry; empty: Shutdown requests are refused.
  std::string admin_token;
  // The job's identity, sent in every ClusterView; servers write it into their checkpoints
  // and restore only a checkpoint of the same job. Empty: a random id made at start (give
  // one to resume a job after restarting the scheduler or the whole cluster).
  std::string job_id;
  std::string log_level = "info";
};

// kInvalidArgument naming the bad field.
absl::Status ValidateSchedulerConfig(const SchedulerConfig& config);

// One slice of a tensor as the scheduler lays it out.
struct SliceLayout {
  uint64_t offset = 0;
  uint32_t length = 0;
  int server = 0;
};

// Splits a tensor of `length` elements with bin size `bin_size` over servers with current
// loads `load` (bytes; updated). Slice boundaries are multiples of `bin_size`. Exposed for
// tests. kInvalidArgument for a zero length or bin size, or a slice longer than 2^32-1.
absl::StatusOr<std::vector<SliceLayout>> SplitTensor(uint64_t length, uint32_t bin_size,
                                                     uint64_t split_threshold,
                                                     std::vector<uint64_t>& load);

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
  struct Node {
    msg::Role role = msg::Role::Unknown;
    int rank = -1;
    std::string address;
    std::string identity;
    std::string route;
    uint64_t register_request = 0;
    absl::Time last_seen;
    bool alive = true;
    bool left = false;
    // Its rank is one it claimed (it had it before this scheduler started), not one given to
    // a fresh node before the job formed, which a claim of the same rank takes over.
    bool rank_claimed = false;
    std::string secret;  // workers: random, sent only in this node's views (kept on rejoin)
    // Servers: the steps of their step checkpoints (latest Register or Heartbeat).
    std::vector<uint64_t> checkpoint_steps;
    // Servers: their --optimizer (Register.optimizer; empty if they did not say).
    std::string optimizer;
    // Workers: the first barrier this one takes part in (one that joined a running job does
    // not hold up the barriers the others were already waiting at).
    uint64_t first_barrier = 0;
    // Workers that joined a running job: no barrier waits for them until they call one (a
    // trainer that joins skips the start-up barriers the others may not have reached yet).
    bool barrier_seen = true;
    // Workers: take part in the steps (NodeInfo.stepping): false for one that joined the
    // running job until it declares a tensor.
    bool stepping = true;
    // Workers: the L2 norm of their residues at the latest heartbeat (-1: never reported).
    float residue_norm = -1.0f;
  };
  struct Layout {
    uint32_t tensor_id = 0;
    uint64_t length = 0;
    uint32_t bin_size = 0;
    std::vector<SliceLayout> slices;
  };
  struct BarrierWaiter {
    std::string route;
    uint64_t request_id;
    int rank;
  };

  void Handle(InMessage in);
  void OnRegister(InMessage& in);
  // A node re-registering with a known identity: takes its rank back. false: no such node.
  bool Rejoin(const InMessage& in, const std::string& identity, const std::string& address);
  // A worker registering into the formed job (--max_workers): admitted with a new rank,
  // announced to every node, answered as a rejoined worker (it takes the current parameters
  // and skips the start-up barrier). false: the job is full (the caller refuses it).
  bool Join(const InMessage& in, const std::string& identity);
  // The workers' ranks the views announce: one past the highest (joined ones included).
  int WorkerRanks() const;
  // The rank for a new node of `role`: the one it claims when free, else the lowest free.
  int PickRank(msg::Role role, int claimed, int want) const;
  // Every expected node is in: views to all, barriers released.
  void Form();
  void OnHeartbeat(InMessage& in);
  void OnBarrier(InMessage& in);
  void OnDeclare(InMessage& in);
  void OnLeave(InMessage& in);
  void CheckHeartbeats();
  void SendView(const Node& node, uint64_t reply_to, bool rejoined = false);
  // Step checkpoints (restore_step.cc): the latest step every server reported
  // (server/checkpoint.h; 0: none); the step `node` restores, which, when `answering` its
  // registration, also drops its reported steps after it (the server removes those files).
  uint64_t CommonStep() const;
  uint64_t RestoreStepFor(const Node& node, bool answering);
  // A server's --optimizer from its Register ("" for a worker's, or a server that did not
  // say); OK for "" or a name the servers know that no other server of the job contradicts
  // (a node with the same non-empty identity, restarting, is not compared with itself).
  static std::string ServerOptimizerOf(const msg::Register& reg);
  absl::Status CheckServerOptimizer(const std::string& optimizer,
                                    const std::string& identity) const;
  static std::vector<uint64_t> StepList(const flatbuffers::Vector<uint64_t>* steps);
  void BroadcastView();
  // One BroadcastView after the messages being handled now (posted to the I/O thread):
  // 64 workers leaving together make one or a few broadcasts, not 64 x 64 views queued
  // ahead of the answers to their Leave.
  void BroadcastViewSoon();
  void ReleaseBarriers();
  void MaybeShutdown();
  void ShutdownCluster(const std::string& reason,
                       absl::StatusCode code = absl::StatusCode::kOk);
  Node* FindNode(msg::Role role, int rank);
  // The registered node that sent `in`: its role and rank match the envelope and it sent on
  // the connection it registered with. nullptr for anyone else (a forger claiming a rank).
  Node* Authenticated(const InMessage& in);
  void OnShutdownRequest(InMessage& in);
  // Answers `in` with `status` and counts the rejection under `reason` (metric_labels).
  void Reject(const InMessage& in, const absl::Status& status, const char* reason);
  void UpdateNodeMetrics();
  int AliveWorkers() const;

  const SchedulerConfig config_;
  const std::string job_id_;  // config_.job_id, or a random one
  RoleLog log_;
  std::unique_ptr<Metrics> own_metrics_;  // a disabled one when none was given
  std::unique_ptr<SchedulerMetrics> metrics_;  // I/O thread only after Start
  std::unique_ptr<Transport> transport_;

  // I/O thread only.
  std::vector<Node> nodes_;
  bool formed_ = false;
  uint32_t epoch_ = 0;
  uint32_t max_seen_epoch_ = 0;  // highest epoch a registering node reported
  std::map<std::string, Layout> layouts_;
  std::vector<uint64_t> server_load_;
  std::map<uint64_t, std::vector<BarrierWaiter>> barriers_;
  // Workers that registered before the job formed, past --num_workers but within
  // --max_workers: they join it (Join) as soon as it forms.
  std::vector<InMessage> early_joiners_;
  uint64_t next_barrier_ = 0;  // one past the highest barrier released
  bool view_broadcast_posted_ = false;  // BroadcastViewSoon's, not yet run

  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status exit_status_ ABSL_GUARDED_BY(mu_);  // why the job ended, when not completed
};

}  // namespace adaps

#endif  // ADAPS_SCHEDULER_SCHEDULER_H_
