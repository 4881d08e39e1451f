// Internal to the worker library: a fusion bucket (worker/fusion.h) as the runner sees it: a
// tensor (its internal one) whose push encoder is segmented, one part per member, each
// member compressed with its own compressor and residue.
//
// Thread-safety: a bucket's `mu` guards its staging, and no other lock is taken while it is
// held; encoding takes internal.mu, then each member's Tensor::mu in turn.
#ifndef ADAPS_WORKER_BUCKET_H_
#define ADAPS_WORKER_BUCKET_H_

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/wire_codec.h"
#include "worker/tensor.h"

namespace adaps {

// The name prefix of buckets (reserved: a trainer's tensor may not start with it).
inline constexpr char kFusionPrefix[] = "adaps.fusion/";
// A bucket's capacity in elements: under the scheduler's default split threshold (65536),
// so that it is laid out as one slice.
inline constexpr uint32_t kFusionCapacity = 65535;

// One step of a bucket being sent: the members' promises and output buffers, the staged
// gradients and the bucket's answer buffer. Shared by the bucket's Run and its completion.
struct FusionBatch {
  std::vector<std::promise<absl::Status>> promises;
  std::vector<absl::Span<float>> outs;
  std::vector<bool> given;
  std::vector<float> grad, out;
};

struct FusionBucket {
  struct Member {
    Tensor* t = nullptr;
    uint64_t offset = 0;
    uint32_t length = 0;
  };
  Tensor internal;  // the bucket as the servers see it (internal.length: the members' total)
  absl::Mutex mu;
  // Appended while open (Declare), read-only once closed.
  std::vector<Member> members;
  bool closed ABSL_GUARDED_BY(mu) = false;
  // The step being staged (null: none).
  std::shared_ptr<FusionBatch> staged ABSL_GUARDED_BY(mu);
  int given ABSL_GUARDED_BY(mu) = 0;
  bool push ABSL_GUARDED_BY(mu) = false, pull ABSL_GUARDED_BY(mu) = false;
  absl::Time deadline ABSL_GUARDED_BY(mu);
  // Sum of the members' segment bytes pushed (internal.mu): the rest of the bucket's push
  // bytes is shared overhead (envelope, container header), counted to members by length.
  uint64_t segment_push_bytes = 0;
};

// The segment table of `b`'s members.
std::vector<WireSegment> SegmentTable(const FusionBucket& b);

// The bucket's push payload: each member compressed with its own residue left pending, then
// committed only when every member succeeded (as EncodePush). A member whose encoding would
// be larger than its dense encoding is sent dense (residue + gradient) and its residue
// becomes zero: exact error feedback, and no member's bytes exceed its dense bytes. Counts
// each member's push traffic. `flush`: every member is sent dense (Worker::Leave). Needs
// internal.mu; takes each member's mu.
absl::StatusOr<std::vector<SharedBytes>> EncodeFusedPush(FusionBucket& b,
                                                         absl::Span<const float> grad,
                                                         IndexCoding coding, bool flush = false)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(b.internal.mu);

// A member's traffic: its own pushes and exact segment bytes, plus its share (by length) of
// the bucket's overhead and of the bucket's pulls.
TrafficCounters FusedTraffic(Tensor& member);

}  // namespace adaps

#endif  // ADAPS_WORKER_BUCKET_H_
