// The adaps server: owns the tensor slices assigned to its rank, one Shard each
// (server/shard.h: parameters, optimizer state, aggregation buffer, downlink residue), and
// routes pushes and pulls to them (docs/architecture.md). Membership (registering,
// heartbeats, re-registering, forged views) is common/cluster_client's, the live workers of a
// step server/step_members', checkpoints server/checkpoint_policy's (when and what; the
// format is server/checkpoint.h, a declaration's checks server/declaration's); this class is
// the wiring and the I/O thread's checks.
//
// Owns one Transport: a ROUTER for workers and a DEALER to the scheduler, and one Engine
// (server/engine.h): the engine threads own the slices and do all the work on them; the
// I/O thread checks what needs no slice state and routes each message to the slice's owner.
// Membership state is the I/O thread's; the public methods are thread-safe.
//
// Sync mode: a push for step t is decoded straight into the aggregation buffer; when every
// live worker has pushed, the buffer is averaged (summed for sum-only), the optimizer runs
// once, the version becomes t+1 and held pulls are answered. Async mode: each push is
// applied on arrival. Pulls: dense float32 (encoded once per version, the same bytes for
// every worker), or recompressed (sync mode only): AdaComp over the change since the last
// published state with a server-side residue, encoded once per version, so every worker
// applying the same messages holds a bitwise-identical replica.
#ifndef ADAPS_SERVER_SERVER_H_
#define ADAPS_SERVER_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/cluster_client.h"
#include "common/optimizer.h"
#include "common/metrics.h"
#include "common/transport.h"
#include "server/server_metrics.h"
#include "server/checkpoint_policy.h"
#include "server/declaration.h"
#include "server/engine.h"
#include "server/step_members.h"
#include "server/shard.h"

namespace adaps {

struct ServerConfig {
  std::string scheduler;                     // e.g. tcp://127.0.0.1:5000
  std::string bind = "tcp://127.0.0.1:0";   // port 0: the OS picks
  std::string advertise;                     // address workers use; empty: the bound one
  std::string identity;
  bool sync = true;
  OptimizerConfig optimizer;
  absl::Duration register_timeout = absl::Seconds(60);
  // Checkpoints: Checkpoint requests, the timer, and the restore at start all use
  // `checkpoint_dir/server-<rank>.ckpt` (the one before it kept as `.ckpt.prev`). A file is
  // written to a temporary name, fsynced and renamed, and carries a CRC-32; it holds per
  // slice the parameters, optimizer state, step and downlink residue. Restored slices exist
  // from the start (workers need not declare them again). Every file carries the job id
  // of the scheduler's view; `restore` takes only a checkpoint of the same job (another
  // job's, or one without a job id, is moved aside to <name>.job-<its id>, and the server
  // starts fresh). A final checkpoint is written at a clean shutdown.
  std::string checkpoint_dir;
  absl::Duration checkpoint_interval = absl::ZeroDuration();  // zero: no timer
  // Step checkpoints (server/checkpoint.h): every slice at each multiple of this step, the
  // same steps on every server; a restart restores the latest step every server has
  // (the scheduler's restore_step). 0: none. The newest kKeptStepCheckpoints are kept.
  uint64_t checkpoint_every_steps = 0;
  bool restore = true;
  // Restore from this file whatever job wrote it (format 2 files included), instead of
  // checkpoint_dir's. kNotFound/kDataLoss at Start when it cannot be read.
  std::string restore_from;
  // How long the server keeps serving without hearing from the scheduler (it re-registers
  // meanwhile when a restarted scheduler answers) before it stops with kUnavailable.
  absl::Duration scheduler_grace = absl::Seconds(60);
  // Largest slice a DeclareSlice may create (elements): memory a client can make us take.
  uint64_t max_slice_elements = uint64_t{1} << 28;
  // AdaComp bin size of the recompressed pulls (the downlink): each slice uses
  // min(pull_bin_size, the bin size its workers declared); 0: the declared one. A smaller
  // bin sends more of the parameters' change each version (pull bytes only; pushes keep the
  // workers' bin size). Fixed when the slice is created and kept in checkpoints: a server
  // restored from a checkpoint must run with the same value, or the workers' declarations
  // of its slices are refused as a bin size conflict.
  uint32_t pull_bin_size = 0;
  // Engine threads owning the slices (server/engine.h); 0: the cores this process may use
  // (sched_getaffinity). Never more are started than there are slices.
  int engine_threads = 0;
  // Memory all slices together may take (bytes, estimated as kSliceBytesPerElement per
  // element: parameters, optimizer state, aggregation, published replica, residue, answer).
  // A DeclareSlice beyond it is kResourceExhausted. 0: half of the physical memory.
  uint64_t max_memory = 0;
  // Stragglers (sync mode, "Revisiting Distributed Synchronous SGD"): a step completes once
  // all but this many live workers pushed; a late push is not dropped but added to the step
  // in progress (server/shard.h, AddPush). Not for a mean server (local mode: every
  // worker must apply every step's mean) nor for recompressed pulls (a late worker's
  // replica skips versions), refused at start and at DeclareSlice with the reason. 0: off.
  int backup_workers = 0;
  std::string log_level = "info";
  CurveKeys curve;  // enabled: encrypted; only allowed_clients may connect (common/config.h)
};

absl::Status ValidateServerConfig(const ServerConfig& config);

// Engine answers go out through the transport (thread-safe).
class TransportSink final : public EngineSink {
 public:
  explicit TransportSink(Transport* transport) : transport_(transport) {}
  void Send(const std::string& route, int peer, OutMessage message) override;
  Sender self() const override { return transport_->self(); }

 private:
  Transport* const transport_;
};

class Server {
 public:
  // `metrics` (null: none) must outlive the server; server/server_metrics.h says what it
  // exports.
  explicit Server(ServerConfig config, std::shared_ptr<TransportContext> context = nullptr,
                  Metrics* metrics = nullptr);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds, connects to the scheduler and registers; returns once the cluster view arrived.
  // kUnavailable: address in use / scheduler unreachable; kDeadlineExceeded: the cluster did
  // not form within register_timeout; kInvalidArgument: bad config.
  absl::Status Start();
  std::string endpoint() const;
  int rank() const { return transport_->rank(); }
  // Waits for the scheduler's Shutdown (or for losing the scheduler). false on timeout.
  bool WaitForShutdown(absl::Duration timeout);
  // Why the server stopped: OK for a clean Shutdown, kUnavailable when the scheduler is gone.
  absl::Status exit_status() const;
  void Stop();

 private:
  // Routing of worker messages to the engine (server.cc), on the I/O thread.
  void Handle(InMessage in);
  void OnDeclare(InMessage& in);
  // Fills the answer's address into `work`, moves the message into it, queues it to `owner`.
  void Route(InMessage in, int owner, EngineWork work);
  // The sender's rank when it is a worker of the latest view, else -1.
  int KnownWorker(const msg::Envelope& env) const;
  void OnPush(InMessage& in);
  void OnPull(InMessage& in);
  // A worker's msg::Resume after this server restarted (Shard::ResumeAt on the owner).
  void OnResume(InMessage& in);
  void OnSetHyper(InMessage& in);
  void OnCheckpoint(InMessage& in);
  // Sync: completes every step the lost workers were holding up (membership code calls it
  // when workers are lost); the engine threads learn the live workers and complete them.
  void CompleteStepsWithoutLostWorkers();
  // Hands the live workers to the engine when they changed since it last heard.
  void SyncLiveWorkers();
  // What a restore read (CheckpointPolicy::RestoreAtStart): the slices go to the engine
  // (and count against the memory budget), the hyperparameters over the flags.
  absl::Status InstallSlices(std::vector<SliceRecord> records, const HyperValues& hyper);
  // Hyperparameters set at run time: remembered for checkpoints, and restored from one.
  void RememberHyper(const std::string& name, double value);
  void RestoreHyper(const HyperValues& hyper);
  void ReplyError(const InMessage& in, const absl::Status& status);
  // kPermissionDenied unless `secret` is one of the job's workers' (from the views).
  absl::Status CheckWorkerSecret(const flatbuffers::String* secret, const char* what) const;

  // common/cluster_client registers, heartbeats, re-registers and guards views and
  // shutdowns; these are its callbacks, on the I/O thread.
  void OnView(const msg::ClusterView& view);
  void Finish(absl::Status status);

  const ServerConfig config_;
  RoleLog log_;
  std::unique_ptr<Metrics> own_metrics_;  // a disabled one when none was given
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<Transport> transport_;

  std::unique_ptr<TransportSink> sink_;
  // When checkpoints are written and what a restart restores; outlives the engine, which
  // reports to it.
  std::unique_ptr<CheckpointPolicy> checkpoints_;
  // Owns the slices; fed by the I/O thread; stopped (drained and joined) in the destructor.
  std::unique_ptr<Engine> engine_;

  // I/O thread only.
  OptimizerConfig optimizer_;  // what SetHyper validates against (the engine has copies)
  HyperValues hyper_set_;      // what SetHyper set (by name, latest value): checkpointed
  bool serving_ = false;  // registered, and restored when there was a checkpoint
  bool finishing_ = false;  // Finish ran (the final checkpoint may still be in progress)
  std::string job_id_;    // of the latest cluster view
  std::set<std::string> worker_secrets_;  // every worker secret of this job's views
  const uint64_t memory_budget_;          // config_.max_memory, or its default
  uint64_t memory_used_ = 0;              // budgeted bytes of the slices with an owner
  std::unique_ptr<ClusterClient> cluster_;
  uint64_t restore_step_ = 0;  // of the latest view (the step checkpoint to restore)
  // The workers a sync step waits for (server/step_members.h; I/O thread only).
  StepMembers members_;
  // Counts worker `rank` from now on (a declaration or push of a joined worker).
  void CountWorker(int rank);

  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status exit_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace adaps

#endif  // ADAPS_SERVER_SERVER_H_
