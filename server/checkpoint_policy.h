// The server's one checkpoint owner: when checkpoints are written (timed, once new slices'
// declarations pause, on request, at a clean end, at every --checkpoint_every_steps), which
// one a restart restores (the step every server has, else the latest, else the previous;
// another job's is moved aside), which step checkpoints are kept, and the writer thread
// (server/checkpoint_writer.h) that writes them. The file format is server/checkpoint.h.
//
// The engine reports to it through CheckpointReports (reports(); no pointer to the engine
// here) and is asked for snapshots through the `snapshot` function it is given; the server
// installs what a restore read (the slices and the memory they take are the server's).
//
// Threads: StepCheckpoints and SetCommonStep from any thread (the cluster client's
// heartbeats); everything else on the server's I/O thread. `done` callbacks run on the
// writer thread.
#ifndef ADAPS_SERVER_CHECKPOINT_POLICY_H_
#define ADAPS_SERVER_CHECKPOINT_POLICY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/optimizer.h"
#include "server/checkpoint_writer.h"
#include "server/server_metrics.h"
#include "server/shard.h"

namespace adaps {

// The newest step checkpoints kept on disk (never the one a restart may be told to restore).
constexpr size_t kKeptStepCheckpoints = 3;

struct CheckpointPolicyOptions {
  std::string dir;  // empty: no checkpoints at all
  absl::Duration interval = absl::ZeroDuration();  // timed checkpoints; zero: none
  uint64_t every_steps = 0;                        // step checkpoints; 0: none
  bool restore = true;                             // restore dir's at registration
  std::string restore_from;                        // restore this file, whatever its job
  std::string identity;  // names the step checkpoints (the rank when empty)
};

class CheckpointPolicy {
 public:
  // Asks the engine to snapshot every slice into `job` (Engine::Snapshot).
  using Snapshot = std::function<void(std::shared_ptr<CheckpointJob>)>;
  // Hands restored slices and hyperparameters to the server.
  using Install = std::function<absl::Status(std::vector<SliceRecord>, const HyperValues&)>;

  // `rank` tells the server's rank (-1 before it registered); `log` and `metrics` must
  // outlive this.
  CheckpointPolicy(CheckpointPolicyOptions options, std::function<int()> rank, RoleLog& log,
                   ServerMetrics* metrics, Snapshot snapshot);
  ~CheckpointPolicy();
  CheckpointPolicy(const CheckpointPolicy&) = delete;
  CheckpointPolicy& operator=(const CheckpointPolicy&) = delete;

  // The writer thread. Stop writes what is queued and joins; call it after the engine
  // stopped (its threads may still hand snapshots on).
  void Start() { writer_.Start(); }
  void Stop() { writer_.Stop(); }

  bool enabled() const { return !options_.dir.empty(); }
  const std::string& dir() const { return options_.dir; }
  bool step_checkpoints() const { return enabled() && options_.every_steps > 0; }
  CheckpointReports* reports() { return &writer_; }

  // At registration, before any worker message is handled: restores what the policy says
  // (restore_from; else the step every server has, `restore_step`, falling back to the
  // latest checkpoint of this job) through `install`, then arms the step checkpoints.
  // OK without a checkpoint; an error when every candidate is damaged.
  absl::Status RestoreAtStart(const std::string& job_id, uint64_t restore_step,
                              const Install& install);

  // Writes every slice to dir/server-<rank>.ckpt; `done` runs on the writer thread once the
  // file is durable (or failed). The caller does not wait.
  void Write(const std::string& job_id, std::function<void(absl::Status)> done);
  // A new slice was declared: it is written once declarations pause (timed mode), not a
  // whole interval later (a server killed in between would come back without it).
  void SliceDeclared(absl::Time now);
  // The timer: a timed checkpoint when one is due.
  void Tick(absl::Time now, const std::string& job_id);
  // The hyperparameters set at run time, carried by every later checkpoint.
  void SetHyper(HyperValues hyper) { writer_.SetHyper(std::move(hyper)); }

  // The rank this server had before it restarted (RankFilePath: with --identity and a
  // checkpoint directory), claimed in its first Register; -1 when it has none (a damaged
  // file is logged and ignored: the scheduler then picks a rank as for a fresh server).
  int RememberedRank() const;
  // Remembers `rank` for the next start (a failure is logged: the server goes on).
  void RememberRank(int rank);

  // The step checkpoints on disk (Register and heartbeats report them). Any thread.
  std::vector<uint64_t> StepCheckpoints() const;
  // The scheduler's latest step every server has (from heartbeats), never pruned. Any thread.
  void SetCommonStep(uint64_t step);

 private:
  std::string StepName() const;
  absl::Status RestoreStep(uint64_t step, const std::string& job_id, const Install& install);
  absl::Status RestoreLatest(const std::string& job_id, const Install& install);
  absl::Status RestoreFrom(const std::string& job_id, const Install& install);
  void SetAside(const std::string& path, const std::string& job_id);
  void OnStepCheckpoint(uint64_t step, const absl::Status& status, size_t slices);

  const CheckpointPolicyOptions options_;
  const std::function<int()> rank_;
  RoleLog& log_;
  ServerMetrics* const metrics_;
  const Snapshot snapshot_;
  CheckpointWriter writer_;

  // I/O thread only.
  absl::Time last_timed_;
  bool new_slices_ = false;  // declared since the last timed checkpoint started
  absl::Time new_slice_at_;  // the latest declaration
  // One timed checkpoint at a time: a slow disk skips ticks instead of piling up snapshots.
  std::shared_ptr<std::atomic<bool>> timed_busy_ = std::make_shared<std::atomic<bool>>(false);

  mutable absl::Mutex steps_mu_;  // a leaf
  std::vector<uint64_t> step_checkpoints_ ABSL_GUARDED_BY(steps_mu_);
  uint64_t common_step_ ABSL_GUARDED_BY(steps_mu_) = 0;
};

}  // namespace adaps

#endif  // ADAPS_SERVER_CHECKPOINT_POLICY_H_
