// Internal to the worker library: the compression pool of a Worker (WorkerOptions::
// compression_threads). A FIFO of jobs run by a few threads: the encoding of pushes (each
// with an in-order stage that sends it) and the decoding of pull answers. The worker's
// retries (waiting for a restarted server, resynchronizing, sending again) run on a pool
// of one thread of their own.
//
// Order: jobs start in the order they were posted. An ordered job returns its second stage
// (the send); stages run one at a time in the order their jobs were posted, whatever thread
// finished first, so a later tensor never overtakes an earlier one even with several
// threads. Every ordered job's stage runs exactly once (a null stage only keeps the order).
// No thread waits for the order: the thread that completes the missing job runs the stages
// that were waiting for it.
//
// Ownership and threads: the runner (worker/run.h) owns its pools; Start starts the threads,
// Stop closes the queue (later posts are refused: the caller then runs or fails the job
// itself), lets the threads finish every queued job and joins them. Thread-safe.
#ifndef ADAPS_WORKER_JOB_POOL_H_
#define ADAPS_WORKER_JOB_POOL_H_

#include <cstdint>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace adaps {

class JobPool {
 public:
  using Job = absl::AnyInvocable<void()>;
  // Returns its in-order stage (may be null).
  using OrderedJob = absl::AnyInvocable<Job()>;

  explicit JobPool(int threads) : threads_(threads) {}
  ~JobPool() { Stop(); }
  JobPool(const JobPool&) = delete;
  JobPool& operator=(const JobPool&) = delete;

  void Start();
  // False once stopped (the job was not taken).
  bool Post(Job job);
  bool PostOrdered(OrderedJob job);
  // Closes the queue: later posts are refused; what is queued still runs. Idempotent.
  void Close();
  // Closes the queue, runs what is queued, joins. Idempotent; never from a pool thread.
  void Stop();

 private:
  struct Entry {
    Job job;                // plain job, or
    OrderedJob ordered;     // an ordered one with
    uint64_t ticket = 0;    // its place in the order
  };
  void Loop();
  // Runs `stage` (the stage of `ticket`) once every earlier ticket's stage ran.
  void InOrder(uint64_t ticket, Job stage);

  const int threads_;
  std::vector<std::thread> workers_;
  absl::Mutex mu_;
  std::deque<Entry> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  // The order of stages: the next ticket to run, the stages finished early, and whether a
  // thread is running stages now (only one does at a time).
  absl::Mutex order_mu_;
  uint64_t next_stage_ ABSL_GUARDED_BY(order_mu_) = 0;
  std::map<uint64_t, Job> early_ ABSL_GUARDED_BY(order_mu_);
  bool staging_ ABSL_GUARDED_BY(order_mu_) = false;
};

}  // namespace adaps

#endif  // ADAPS_WORKER_JOB_POOL_H_
