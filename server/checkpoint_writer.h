// The checkpoint owner's writer (server/checkpoint_policy.h owns it): the writer thread, the
// step checkpoints being collected and the hyperparameters every checkpoint carries. The
// engine (server/engine.h) only runs the threads that own the slices; they report to this
// through CheckpointReports, a narrow interface (no pointer back to the engine).
//
// Writes: a timed or requested checkpoint is a CheckpointJob that every engine thread adds
// its shards' records to; the last one hands it on (Write). Step checkpoints
// (--checkpoint_every_steps): each engine thread reports a slice's record when its version
// reaches a multiple of the interval (AddStepRecord); once every slice of the server is
// recorded at a step, the file is written. The file format and its durable write are
// server/checkpoint.h, the restore policy server/checkpoint_policy.h; the writer thread writes one job at a time, in the
// order handed on, and then calls the job's `done`.
//
// Threads: Start/Stop, SetStepCheckpoints from the owner (the policy, on the server's I/O
// thread); the CheckpointReports methods from the engine (any engine thread; SetSlices from
// the I/O thread); SetHyper/hyper from the I/O
// thread. Everything is guarded by one leaf mutex (docs/threading.md).
#ifndef ADAPS_SERVER_CHECKPOINT_WRITER_H_
#define ADAPS_SERVER_CHECKPOINT_WRITER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/optimizer.h"
#include "server/engine_queue.h"
#include "server/shard.h"

namespace adaps {

// A checkpoint in progress: every engine thread adds its records, the last hands them on.
struct CheckpointJob {
  std::string path;
  std::string job_id;  // written into the file (server/checkpoint.h)
  HyperValues hyper;   // too
  // Runs on the writer thread (or on the caller's, when the writer is stopped) once.
  std::function<void(absl::Status, size_t slices)> done;
  std::mutex mu;  // (std::mutex: see engine_queue.h)
  std::vector<SliceRecord> records;  // guarded by mu
  int remaining = 0;                 // guarded by mu
};

// What an engine thread tells the checkpoint owner. Thread-safe.
class CheckpointReports {
 public:
  virtual ~CheckpointReports() = default;
  // A job every thread has added its records to: write it.
  virtual void Write(std::shared_ptr<CheckpointJob> job) = 0;
  // Slice `record` at step `step` (a multiple of checkpoint_every_steps).
  virtual void AddStepRecord(uint64_t step, SliceRecord record) = 0;
  // After a declaration of `key`: whether a shard holds it now. A key given an owner whose
  // declaration was refused is not waited for by the step records (a step already waiting
  // for it is given up when a later step completes).
  virtual void SetShardHeld(uint64_t key, bool held) = 0;
  // The number of slices the server holds (keys given an owner): a step checkpoint is
  // written once that many records (less the unheld keys) reached a step.
  virtual void SetSlices(size_t slices) = 0;
};

class CheckpointWriter final : public CheckpointReports {
 public:
  CheckpointWriter() = default;
  ~CheckpointWriter() override { Stop(); }
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void Start();
  // Closes the queue, writes what is queued, joins. A job handed on later fails at once.
  void Stop();

  // Where step checkpoints go: `path(step)`, of job `job_id`; `done(step, status, slices)`
  // runs on the writer thread. Until this is called, step records are not kept.
  void SetStepCheckpoints(std::function<std::string(uint64_t)> path, std::string job_id,
                          std::function<void(uint64_t, absl::Status, size_t)> done);
  // The hyperparameters set at run time, written into every later checkpoint.
  void SetHyper(HyperValues hyper);
  HyperValues hyper() const;

  void Write(std::shared_ptr<CheckpointJob> job) override;
  void AddStepRecord(uint64_t step, SliceRecord record) override;
  void SetShardHeld(uint64_t key, bool held) override;
  void SetSlices(size_t slices) override { slices_ = slices; }

 private:
  void Run();

  std::atomic<size_t> slices_{0};
  mutable std::mutex mu_;  // the step records, their destination, the hyperparameters
  std::map<uint64_t, std::vector<SliceRecord>> step_records_;  // by step
  std::function<std::string(uint64_t)> step_path_;
  std::string step_job_id_;
  std::function<void(uint64_t, absl::Status, size_t)> step_done_;
  HyperValues hyper_;
  std::set<uint64_t> unheld_;  // keys with an owner but no shard
  ClosableQueue<std::shared_ptr<CheckpointJob>> writes_;
  std::thread thread_;
};

}  // namespace adaps

#endif  // ADAPS_SERVER_CHECKPOINT_WRITER_H_
