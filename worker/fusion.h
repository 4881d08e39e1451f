// Internal to the worker library: fusion of small tensors (Horovod's tensor fusion, DDP's
// buckets; docs/architecture.md "Fusion").
//
// Tensors smaller than WorkerOptions::fusion_threshold_bytes are members of a bucket: one
// internal tensor, declared to the scheduler and the servers like any other (one slice, so
// one server and one engine thread own it), with a segment table (each member's length and
// bin size, one after another from offset 0) sent in DeclareSlice. A member keeps its own
// compressor and residue (its Tensor); a push of the bucket is one segmented container
// (common/wire_codec.h) of the members' encodings, a pull one dense answer or one container
// of per-member recompressed updates. A member's Run stages its gradient and output buffer;
// when every member of the bucket was given for this step, the bucket is encoded and sent as
// one Run of its internal tensor (so resynchronizing and retrying after a server restart are
// those of any tensor), and each member's future becomes ready when the bucket's answer was
// applied. A member given twice before the bucket is complete fails at once; a bucket left
// incomplete past request_timeout fails its given members with kDeadlineExceeded.
//
// A bucket takes members while it is open: from its first member's Declare until the first
// Run of any member (the server lets its table grow only until it steps).
//
// Ownership: the FusionTable owns its buckets for the worker's whole life (reply callbacks
// hold raw pointers to `internal`). Thread-safety: a bucket's `mu` guards its staging, and no
// other lock is taken while it is held; encoding takes internal.mu, then each member's
// Tensor::mu in turn; the table's own `mu_` (the bucket list and the open buckets) may take a
// bucket's `mu`. Declare must not run concurrently with a Run of the same bucket's members
// (Declare is collective and ordered anyway).
#ifndef ADAPS_WORKER_FUSION_H_
#define ADAPS_WORKER_FUSION_H_

#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "adaps/worker.h"
#include "common/logging.h"
#include "worker/bucket.h"
#include "worker/membership.h"
#include "worker/run.h"
#include "worker/tensor.h"
#include "worker/worker_metrics.h"

namespace adaps {

// The worker's fusion buckets: which tensors are fused, into which bucket, and how a member's
// Run becomes its bucket's. To the runner a bucket is a tensor like any other (its internal
// one) whose push encoder is segmented.
class FusionTable {
 public:
  FusionTable(const WorkerOptions& options, const RoleLog& log, Membership& membership,
              Runner& runner, WorkerMetrics& metrics);
  FusionTable(const FusionTable&) = delete;
  FusionTable& operator=(const FusionTable&) = delete;

  // Whether a tensor of `spec` and `length` elements is fused (when a bucket takes it).
  bool Takes(const TensorSpec& spec, uint64_t length) const;
  // A member's Tensor (spec, length, compressor and residue; no layout of its own yet).
  static absl::StatusOr<std::unique_ptr<Tensor>> NewMember(const TensorSpec& spec, uint64_t length);
  // Declares member `t` into the open bucket, creating one when needed, and pulls its starting
  // values into `values`; false in *fused when the tensor cannot be fused (fusion turned off:
  // it is then declared as usual).
  absl::Status Declare(Tensor& t, absl::Span<float> values, bool* fused);
  // A member's Run: staged until every member of its bucket was given for this step.
  std::future<absl::Status> Run(Tensor& member, absl::Span<const float> grad, absl::Span<float> out,
                                bool push, bool pull);
  // Worker::CloseFusionBuckets: later tensors go to new buckets.
  void Close();
  // I/O thread timer: fails the staged members of buckets incomplete past their deadline.
  void Expire();
  // Fails every staged member (Stop).
  void FailStaged(const absl::Status& status);
  // The internal tensors that hold residues (Worker::Leave): each bucket that stepped with a
  // compressed member (a bucket that never ran holds nothing).
  std::vector<Tensor*> ResidueHolders();

 private:
  absl::StatusOr<FusionBucket*> OpenBucket(const Tensor& t);
  std::vector<FusionBucket*> Buckets();

  const WorkerOptions& options_;
  const RoleLog& log_;
  Membership& membership_;
  Runner& runner_;
  WorkerMetrics& metrics_;
  mutable absl::Mutex mu_;
  // In declaration order; the open one per pull format.
  std::vector<std::unique_ptr<FusionBucket>> buckets_ ABSL_GUARDED_BY(mu_);
  FusionBucket* open_bucket_[3] ABSL_GUARDED_BY(mu_) = {nullptr, nullptr, nullptr};
  bool fusion_off_ ABSL_GUARDED_BY(mu_) = false;  // a bucket was laid out as several slices
};

}  // namespace adaps

#endif  // ADAPS_WORKER_FUSION_H_
