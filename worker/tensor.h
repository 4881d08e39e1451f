// Internal to the worker library: the state of one declared tensor and the encode/decode of
// its pushes and pulls.
//
// Ownership: the Worker owns its Tensors for its whole life; reply callbacks on the
// transport's I/O thread keep raw pointers to them (the transport stops before they go).
// Thread-safety: `Tensor::mu` guards the mutable per-slice state and is taken by the threads
// that encode pushes and decode pulls (the compression pool; with compression_threads = 0
// the caller and the I/O thread), by the sending thread and the retry thread: held for one
// tensor's encode or one slice's decode at most, never across a blocking call. With a pool
// the I/O thread never takes it, so it never waits behind an encode. `meta`, `spec`,
// `length` and `tensor_id` are set before the tensor is published and read-only afterwards;
// `compressor` is replaced (under `mu`) only by Worker::SetBinSize.
#ifndef ADAPS_WORKER_TENSOR_H_
#define ADAPS_WORKER_TENSOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "adaps/worker.h"
#include "common/compressor.h"
#include "common/messages.h"
#include "common/wire_codec.h"
#include "worker/device.h"
#include "worker/tensor_metrics.h"

namespace adaps {

// What never changes about a slice once declared.
struct SliceMeta {
  SliceInfo info;
  uint64_t key = 0;
};

// What changes: the error feedback, the step, and the replica of recompressed pulls.
struct SliceRt {
  std::unique_ptr<SliceState> residue;  // null for dense tensors (no error feedback)
  // A tensor on a device (Tensor::device): the residue lives there instead (null for dense
  // tensors), and so does a copy of `replica` that the pull answers are added to on the
  // device (recompressed pulls; `replica` stays the host's, which resynchronisations write
  // and which is uploaded to this one then).
  std::unique_ptr<DeviceResidue> device_residue;
  std::unique_ptr<DeviceArray> device_replica;
  // Recompressed and sparse pulls: what the server published (empty for dense pulls). Its
  // elements are `replica_own`'s, or the caller's buffer itself (TensorSpec::pull_in_place).
  absl::Span<float> replica;
  std::vector<float> replica_own;
  uint64_t replica_version = 0;
  uint64_t step = 0;  // the step this slice pushes next (the server's version)
  // The incarnation of the slice's server (ServerLinks, worker/server_links.h) that `step`
  // and `replica` were learned from; another one means resynchronize first.
  uint64_t incarnation = 0;
  // The version of the last pull answer applied (initial, resync or a step's): what this
  // worker tells a restarted server it saw (Runner::AnnounceSeen).
  uint64_t seen_version = 0;
  // A resync found the server behind: a pull alone waits for this version.
  uint64_t pull_floor = UINT64_MAX;
  // The buffer of this slice's last push, written again by the next one once nobody else
  // holds it (the transport sent it and no RunOp keeps it for a retry): no allocation and
  // no page faults per step for a dense slice of megabytes.
  std::shared_ptr<Bytes> push_bytes;

  // `replica` = `n` elements of its own (zeros), or `in_place` (the caller's, kept as is).
  // (A tensor with dense pulls keeps none: n = 0, kinds.h KeepsReplica.)
  void SetReplica(size_t n, float* in_place = nullptr) {
    if (in_place != nullptr) {
      replica_own = {};
      replica = absl::MakeSpan(in_place, n);
    } else {
      replica_own.assign(n, 0.0f);
      replica = absl::MakeSpan(replica_own);
    }
  }
  // An own `replica` grown to `n` elements, the ones it held kept (a fusion bucket's next
  // member); false, changing nothing, when the replica is the caller's.
  bool GrowReplica(size_t n) {
    if (!replica.empty() && replica.data() != replica_own.data()) return false;
    replica_own.resize(n, 0.0f);
    replica = absl::MakeSpan(replica_own);
    return true;
  }
};

struct FusionBucket;  // worker/fusion.h

// The elements one push sent (Worker::LastSent): ascending tensor indices, or all of them
// (`all`: a dense push, kept as a flag so that it costs nothing).
struct SentElements {
  std::vector<uint32_t> indices;
  bool all = false;
  void Clear() {
    indices.clear();  // (keeps the capacity)
    all = false;
  }
  // Adds a slice's: `update`'s indices (AdaComp, Top-k) shifted by the slice's offset, or
  // every element (`update` null: a dense slice; or a dense/sign update) by setting `all`.
  void Add(const CompressedUpdate* update, const SliceInfo& info);
};

struct Tensor {
  TensorSpec spec;
  uint64_t length = 0;
  uint32_t tensor_id = 0;
  std::vector<SliceMeta> meta;
  absl::Mutex mu;
  std::unique_ptr<Compressor> compressor ABSL_GUARDED_BY(mu);  // its scratch space changes
  std::vector<SliceRt> slices ABSL_GUARDED_BY(mu);
  // TensorSpec::pull_in_place: the caller's buffer, the slices' replicas; else null.
  float* in_place = nullptr;
  // TensorSpec::device: the device its gradients, parameters and residues live on (set
  // before the tensor is published); null: host memory.
  std::shared_ptr<Device> device;
  // Its codec there (AdaComp at the tensor's bin size; a dense tensor's adds pull answers).
  std::unique_ptr<DeviceCodec> device_codec ABSL_GUARDED_BY(mu);
  std::vector<float> host_staging ABSL_GUARDED_BY(mu);  // a dense push or a flush of a device tensor
  CompressedUpdate update ABSL_GUARDED_BY(mu);
  CompressedUpdate pull_update ABSL_GUARDED_BY(mu);  // a device tensor's pull answer, decoded
  TrafficCounters traffic ABSL_GUARDED_BY(mu);
  SentElements last_sent ABSL_GUARDED_BY(mu);  // by the last successful push
  // EncodePush collects a push's elements here and swaps it with last_sent on success: the
  // index buffers are reused from push to push instead of grown anew.
  SentElements sent_scratch ABSL_GUARDED_BY(mu);
  TensorMetrics metrics ABSL_GUARDED_BY(mu);  // mirrors `traffic` (worker/tensor_metrics.h)
  // The squared L2 norm of the residues, measured after a push at most once a second (and
  // after every flush): read without the lock by the heartbeat (Worker::Impl, I/O thread).
  std::atomic<double> residue_sq{0.0};
  absl::Time residue_measured ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  // Fusion (worker/fusion.h), set before the tensor is published: the bucket this tensor
  // is (`bucket`) or is a member of (`fused_into`, as member `fusion_index`); else null.
  FusionBucket* bucket = nullptr;
  FusionBucket* fused_into = nullptr;
  size_t fusion_index = 0;
};

// The stages of a Run, in order (worker/run.h says what each does and which thread runs it).
// Sent and retrying alternate while failed slices are sent again; decided and settled are
// the end: decided while pull answers are still being written into the caller's buffer,
// settled once the promise is set.
enum class RunStage : uint8_t { kQueued, kPrepared, kSent, kRetrying, kDecided, kSettled };
const char* RunStageName(RunStage stage);

// One Run (push and/or pull of every slice of a tensor) that outlives a server restart.
// Each slice has a push part and a pull part; a part that failed because its server went
// away (kUnavailable) is sent again, once the server came back and the slice resynchronized,
// with the same encoded update (its residue was committed when it was encoded), until
// `retry_until`. The promise is set once: at the first error that is not retried, or when no
// part is outstanding; a part answered after a failure does not touch the caller's buffers.
struct RunOp {
  struct Part {
    uint64_t sent_incarnation = 0;    // the server incarnation the parts were sent to
    uint64_t synced_incarnation = 0;  // the one the slice's step came from, at sending
    absl::Status error;           // the first error of this slice's parts in this attempt
    uint64_t push_step = UINT64_MAX;  // the step of its push, the same in every attempt
    // Its push was acknowledged by the incarnation it was sent to: an attempt to the same
    // incarnation (a pull refused for a replica that fell behind) sends only the pull.
    bool pushed = false;
    int in_flight = 0;  // its push and pull messages of this attempt not finished yet
  };
  RunOp(Tensor* tensor, bool do_push, bool do_pull, absl::Span<float> dst, bool do_flush = false)
      : t(tensor),
        push(do_push),
        pull(do_pull),
        flush(do_flush),
        out(dst),
        parts(tensor->meta.size()) {}

  // The stage (mu held). Advance moves to the next one: prepared from queued, sent from
  // prepared, retrying or sent again; a Run decided meanwhile stays where it is (a part that
  // failed for good may decide it while a retry is being sent), and the ends are reached
  // only through Settle and EndWrite. A move out of order is a bug: a debug assertion.
  RunStage stage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stage_; }
  bool Decided() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stage_ >= RunStage::kDecided; }
  void Advance(RunStage to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Decides the outcome (the first call wins): settles at once, or, while pull answers are
  // being written into `out`, leaves it to the last of those writers (EndWrite), so that a
  // ready future never sees `out` written later.
  void Settle(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A writer of `out` (a pull answer being applied): BeginWrite is false once the outcome is
  // decided (leave `out` alone); EndWrite settles an outcome decided meanwhile.
  bool BeginWrite() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void EndWrite() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  Tensor* const t;
  const bool push, pull;
  const bool flush;  // the push sends the residues, dense (Worker::Leave)
  const absl::Span<float> out;  // device memory for a tensor on a device
  // A tensor on a device: what the trainer had given to its stream when it gave this Run;
  // the library's work on the device waits for it before it reads the gradient.
  std::shared_ptr<DeviceMark> ready;
  std::vector<SharedBytes> encoded;  // per slice (push): set before the first send
  std::promise<absl::Status> promise;
  // Called once with the status the promise is set to, right after it (a fusion bucket's
  // members learn their outcome this way). May be empty.
  std::function<void(const absl::Status&)> on_done;
  absl::Mutex mu;
  absl::Time retry_until ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();  // first failure + timeout
  std::vector<Part> parts ABSL_GUARDED_BY(mu);
  int outstanding ABSL_GUARDED_BY(mu) = 0;

 private:
  void SetPromise(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  RunStage stage_ ABSL_GUARDED_BY(mu) = RunStage::kQueued;
  int writing_ ABSL_GUARDED_BY(mu) = 0;  // pull answers being written into `out`
  absl::Status outcome_ ABSL_GUARDED_BY(mu);  // decided, not yet settled
};

// A future that is ready with `status` (an operation refused before it started).
inline std::future<absl::Status> ReadyFuture(absl::Status status) {
  std::promise<absl::Status> p;
  p.set_value(std::move(status));
  return p.get_future();
}

// The compressor a tensor's spec asks for (kind, bin size, Top-k fraction), checked:
// kInvalidArgument for a bad option or a zero bin size.
absl::StatusOr<std::unique_ptr<Compressor>> MakeTensorCompressor(const TensorSpec& spec);

// The wire payload of every slice of one push, in two phases: each slice is compressed with
// its new residue left pending, and the residues are committed only when every slice
// succeeded. On any error (kInvalidArgument for NaN/Inf, kOutOfRange for a residue overflow)
// no residue of any slice changed. Dense slices are encoded straight from the gradient with
// the finiteness check fused into that one copy. `flush` (Worker::Leave): every slice sends
// its residue plus `grad` dense, and its residue becomes zero. A tensor on a device: `grad`
// is device memory, except for a flush, which sends the residue alone (Leave's gradient is
// zero).
absl::StatusOr<std::vector<SharedBytes>> EncodePush(Tensor& t, absl::Span<const float> grad,
                                                    IndexCoding coding, bool flush = false)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);

// Uploads slice `i`'s host replica to its device copy (after a resynchronisation or the
// initial pull wrote it); nothing for a tensor in host memory or without a replica.
absl::Status UploadReplica(Tensor& t, size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);

// Measures t.residue_sq when a second passed since the last time, or when `now_anyway`
// (a tensor on a device: only then, since it costs a copy of the residue to the host).
void MeasureResidue(Tensor& t, bool now_anyway) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);

// Everything `residue` holds plus `grad`, dense, into `bytes`; the residue's pending next
// value is zero (Commit or Discard it as after CompressPending).
absl::Status EncodeAllPending(SliceState& residue, absl::Span<const float> grad,
                              IndexCoding coding, Bytes* bytes);

// On a compression-pool thread (the I/O thread with compression_threads = 0): writes slice
// `i` of a pull answer into `out` (dense copy, or the recompressed update applied to the
// replica), counts `wire_bytes` of traffic and the time it took (decode_seconds).
// `own_push`: this slice's push of the step before resp.version() when the operation sent
// one (a forwarded answer may leave it out), else null. kDataLoss for an answer that does
// not fit the slice. Takes t.mu.
absl::Status ApplyPull(Tensor& t, size_t i, const msg::PullResponse& resp,
                       absl::Span<const uint8_t> payload, uint64_t wire_bytes,
                       absl::Span<float> out, const Bytes* own_push = nullptr);

}  // namespace adaps

#endif  // ADAPS_WORKER_TENSOR_H_
