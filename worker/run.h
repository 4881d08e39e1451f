// Internal to the worker library: the runner, the path of one operation (a Run: a tensor's
// push and/or pull) from the caller to its future, surviving a server restart.
//
// Each Run is a RunOp (worker/tensor.h) whose stage (RunStage, RunOp::Advance) is one of:
//   queued    - posted to the compression pool in call order (Run);
//   prepared  - stale slices resynchronized, the push encoded, residues committed
//               (PrepareRun, a pool thread; the caller with no pool);
//   sent      - every slice's push and/or pull part handed to the transport, in call order
//               (SendParts). Each part's reply: a pull answer applied to the output
//               (DecodePull, a pool thread, a writer of `out`), then PartDone on the I/O
//               thread. A slice whose server went away is sent again as soon as its own
//               push and pull finished, while other slices' parts are still out (they may be
//               waiting for it through the other workers): still sent;
//   retrying  - the last part of an attempt found failed parts (a server gone, a refused
//               recompressed pull, a stale step): the retry thread waits for the server's next
//               incarnation, resynchronizes, and sends the failed slices again (Retry): sent;
//   decided   - the outcome is known (success, or the first error for good) while pull answers
//               are still being written into `out`: no new write starts;
//   settled   - the future is ready (RunOp::Settle, or the last writer's RunOp::EndWrite).
// A part whose server went away (kUnavailable, from a server with an identity, which can
// come back with its rank) is not reported: the retry thread learns the slice's parameters
// from the restored shard and sends the same encoded update again, for the same step: a
// slice's step never goes back (the restored shard goes on at the workers' steps and drops a
// push of a step it completed before the restart, see server/shard.h), so workers whose steps
// differed by one at the restart stay in step. Bounded: the operation fails with the first
// error once request_timeout has passed since its first failure. Residues stay as they are:
// the update being resent is the one they were committed for.
//
// Threads: docs/threading.md. The compression pool (options.compression_threads; none: the
// caller encodes and the I/O thread decodes) and the retry thread (a JobPool of one) are the
// runner's; Start starts them, CloseRetries and Stop end them around the transport's stop.
#ifndef ADAPS_WORKER_RUN_H_
#define ADAPS_WORKER_RUN_H_

#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "adaps/worker.h"
#include "common/logging.h"
#include "common/messages.h"
#include "worker/job_pool.h"
#include "worker/membership.h"
#include "worker/tensor.h"
#include "worker/worker_metrics.h"

namespace adaps {

class Runner {
 public:
  Runner(const WorkerOptions& options, const RoleLog& log, Membership& membership,
         WorkerMetrics& metrics);
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  void Start();

  // A Run of a tensor with its own slices (a bucket's internal one included); `on_done` (may
  // be empty) is called once with the outcome; `flush`: the push sends the residues, dense
  // (Worker::Leave).
  std::future<absl::Status> Run(Tensor& t, absl::Span<const float> grad, absl::Span<float> out,
                                bool push, bool pull,
                                std::function<void(const absl::Status&)> on_done,
                                bool flush = false, std::shared_ptr<DeviceMark> ready = nullptr);

  // Blocking dense pulls of `slices` at their current version: the parameters (format
  // Dense) or, for the replica of a tensor pulled recompressed, what the servers published
  // (Replica; kinds.h ReplicaFormat). Call it with no lock held.
  absl::StatusOr<std::vector<InMessage>> PullDense(const Tensor& t,
                                                   const std::vector<size_t>& slices,
                                                   const char* why,
                                                   msg::PullFormat format = msg::PullFormat::Dense);

  // A joiner's running sums of `slices` (Replica pulls of a TensorSpec::keep_sum tensor),
  // each at the version of its initial pull in `pulls`: when the job stepped between the
  // two, both are asked again (kUnavailable after a few tries). Call it with no lock held.
  absl::StatusOr<std::vector<InMessage>> PullSums(const Tensor& t,
                                                  const std::vector<size_t>& slices,
                                                  std::vector<InMessage>* pulls);

  // A tensor with its own slices (a bucket's internal one included), once its initial pull
  // set their steps: AnnounceSeen tells a restarted server what this worker saw of them.
  void Track(Tensor* t);

  // Stopping (Worker::Impl::Stop): closes the retry queue before the transport stops (a retry
  // posted from then on fails its operation at once); Stop after it joins the retry thread
  // and drains the pool (queued Runs fail, decodes finish).
  void CloseRetries();
  void Stop();

  // Tests only: the compression pool (null with compression_threads = 0).
  JobPool* pool() { return pool_.get(); }

 private:
  // A slice is stale when its server's incarnation changed since the slice learned its step;
  // ResyncSlices learns step and replica again from the (restored) server. Call both with no
  // lock held.
  std::vector<size_t> StaleSlices(Tensor& t);
  absl::Status ResyncSlices(Tensor& t, const std::vector<size_t>& slices);
  // ResyncSlices, asked again while the server answers kUnavailable, until `deadline`.
  absl::Status ResyncWithin(Tensor& t, const std::vector<size_t>& slices, absl::Time deadline);
  // Prepared: resynchronizes stale slices, encodes the push. Returns the next stage, run in
  // call order: send every part, or fail the future.
  JobPool::Job PrepareRun(const std::shared_ptr<RunOp>& op, absl::Span<const float> grad);
  // Sent: the push and/or pull parts of `slices` (op->encoded holds the pushes).
  void SendParts(const std::shared_ptr<RunOp>& op, const std::vector<size_t>& slices);
  void SendPush(const std::shared_ptr<RunOp>& op, size_t i, int peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op->t->mu);
  void SendPull(const std::shared_ptr<RunOp>& op, size_t i, int peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op->t->mu);
  // Answered: applies a pull answer of slice `i` to op->out (unless op settled) and ends the
  // part.
  void DecodePull(const std::shared_ptr<RunOp>& op, size_t i, const InMessage& reply,
                  size_t request_bytes, uint64_t step);
  // One part finished (I/O thread; the sending thread once the transport stopped); the last
  // one ends the attempt (EndAttempt: settled, or retrying). A slice whose server went away
  // is retried as soon as its own parts finished, while other slices' parts are still out.
  void PartDone(const std::shared_ptr<RunOp>& op, size_t i, bool pull_part, absl::Status status);
  void EndAttempt(const std::shared_ptr<RunOp>& op, absl::Time retry_until);
  // An early retry sent again: gives back the count of `outstanding` it held.
  void ReleaseHold(const std::shared_ptr<RunOp>& op);
  bool Retryable(RunOp& op, size_t i, bool pull_part, const absl::Status& status);
  // Retrying (the retry thread): waits for the restarted servers, resynchronizes (or takes
  // the published replica again after a refused recompressed pull), sends again. `holds`:
  // an early retry of one slice, holding a count of `outstanding` until it sent.
  void Retry(const std::shared_ptr<RunOp>& op, std::vector<size_t> slices, bool holds);
  // The retry thread, once server `server` came back: tells it, for every tracked slice it
  // holds, the highest version this worker applied (msg::Resume). A slice with no operation
  // in flight is told no other way, and a restored slice behind what a worker saw waits for
  // that worker's push of a step it had pushed already (docs/reliability.md).
  void AnnounceSeen(int server);

  const WorkerOptions& options_;
  const RoleLog& log_;
  Membership& membership_;
  Transport& transport_;
  ServerLinks& links_;
  WorkerMetrics& metrics_;
  // Null with compression_threads = 0. Stopped (drained) after the transport in Stop.
  std::unique_ptr<JobPool> pool_;
  // The retry thread (Retry and AnnounceSeen jobs, one at a time).
  JobPool retries_{1};
  absl::Mutex tracked_mu_;
  std::vector<Tensor*> tracked_ ABSL_GUARDED_BY(tracked_mu_);
};

}  // namespace adaps

#endif  // ADAPS_WORKER_RUN_H_
