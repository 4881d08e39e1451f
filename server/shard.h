// One slice of the server's parameters with everything it needs to serve it: parameters,
// optimizer state, the aggregation buffer of the current step, the published (downlink)
// replica with its residue, the encoded pull answers of the current
// version, and the pulls held until a later version (docs/architecture.md).
//
// Sync mode: AddPush decodes a worker's wire payload straight into the aggregation buffer;
// CompleteStepIfReady averages it (sum-only: not), runs the optimizer once and advances
// the version when every live worker has pushed. Async mode: ApplyPush applies each push.
// Pulls: dense float32, or recompressed (AdaComp over the change since the last published
// state, with the shard's downlink residue); each is encoded at most once per version and
// the same bytes go to every worker, so workers applying the same messages hold
// bitwise-identical replicas.
//
// A fusion bucket (docs/architecture.md "Fusion") is a shard too: several small tensors of
// the workers laid out one after another, each a segment with its own bin size. Its pushes
// are segmented containers (common/wire_codec.h), decode-added segment by segment; the
// optimizer runs over the whole (it is elementwise, so each member steps exactly as a
// shard of its own would); a recompressed pull is recompressed segment by segment with each
// member's bin size, into one container. Its segment table grows by one member per
// declaration until the bucket first steps.
//
// Knows nothing of sockets or FlatBuffers: takes spans, returns status and bytes. Ownership:
// a shard owns all its state (no globals, nothing shared with another shard); answer
// bytes are shared with whoever sends them and never changed while anyone else holds them.
// Thread-safety: none; one thread owns a shard (its engine thread, server/engine.h).
#ifndef ADAPS_SERVER_SHARD_H_
#define ADAPS_SERVER_SHARD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/compressor.h"
#include "common/optimizer.h"
#include "common/wire_codec.h"
#include "server/checkpoint.h"

namespace adaps {

// The bin size of recompressed pulls of a slice (or a bucket's member) declared with bin size
// `declared`: min(pull_bin_size, declared / divisor) (at least 1; pull_bin_size 0: no cap,
// the server's --pull_bin_size; divisor: DeclareSlice.pull_bin_divisor, 0 or 1: none).
uint32_t PullBinSize(uint32_t declared, uint32_t pull_bin_size, uint32_t divisor = 1);

class Shard {
 public:
  // The same type as SharedBytes in common/messages.h (an immutable shared payload).
  using PayloadBytes = std::shared_ptr<const std::vector<uint8_t>>;
  // kReplica: published_ (what recompressed pulls have published) as dense floats, the
  // answer's base being its version down_version_ and its version the shard's, as for a
  // dense answer (nothing is published for it): the replica a worker takes when it declares
  // or resynchronizes a tensor it pulls recompressed.
  // kSparse: the step's exact change (schemas/README.md "Sparse pulls"): the new values at
  // the elements some worker sent in the step, answered as kSparse, or as kDense when that
  // is no larger or the only exact answer (the step was not tracked, or ran a dense
  // optimizer, or the puller's replica is not at the version before).
  // kForwarded: an answer format only (to a kSparse pull, when it is the smallest exact
  // answer of a mean step): the step's pushes as they came, which the worker replays.
  enum class Format { kDense, kRecompressed, kReplica, kSparse, kForwarded };
  // A pull waiting for (or being answered at) a version. `route` is opaque to the shard.
  struct Pull {
    std::string route;
    uint64_t request_id = 0;
    uint64_t min_version = 0;
    uint64_t have_version = 0;
    Format format = Format::kDense;
    int peer = -1;  // opaque too: the route's alternative (a DEALER peer) when >= 0
    // The puller's rank (-1: unknown) and the step + 1 of its push to this slice that it
    // holds (0: none): a forwarded answer at the version that step made leaves it out.
    int worker = -1;
    uint64_t held_push = 0;
  };
  // What a pull is answered with: the version it brings the puller to, the version the
  // payload is a change from (recompressed; 0 for dense), and the payload (null: nothing
  // new since have_version).
  struct Answer {
    uint64_t version = 0;
    uint64_t base = 0;
    PayloadBytes payload;
    Format format = Format::kDense;  // what the payload is (a kSparse pull: kSparse,
                                     // kForwarded or kDense)
    bool zero_base = false;          // kSparse: the elements not listed are 0 (mean)
  };

  // A fresh slice of zeros. kInvalidArgument for a zero length or bin size.
  static absl::StatusOr<Shard> Create(uint64_t key, std::string name, uint32_t length,
                                      uint32_t bin_size);
  // A fresh fusion bucket of zeros holding the segments of `table`. kInvalidArgument for an
  // empty table, an empty segment, a bin size of zero or more than 2^32-1 elements in all.
  static absl::StatusOr<Shard> CreateBucket(uint64_t key, std::string name,
                                            absl::Span<const WireSegment> table);
  // A slice as a checkpoint recorded it (marked restored: initial values are then ignored).
  // kDataLoss for a record whose arrays do not match its length.
  static absl::StatusOr<Shard> FromRecord(SliceRecord record);
  SliceRecord ToRecord() const;

  Shard(Shard&&) = default;
  Shard& operator=(Shard&&) = default;

  uint64_t key() const { return key_; }
  const std::string& name() const { return name_; }
  uint32_t length() const { return length_; }
  uint32_t bin_size() const { return bin_size_; }
  uint64_t version() const { return version_; }
  bool restored() const { return restored_; }
  absl::Span<const float> params() const { return params_; }
  absl::Span<const float> published() const { return published_; }
  size_t held_pulls() const { return held_.size(); }
  // A bucket's segments (empty for a plain slice, and for a bucket restored from a
  // checkpoint until a declaration or a push told it its table again).
  const std::vector<WireSegment>& segments() const { return segments_; }
  // A fusion bucket's recompressed pulls encode each member at min(its bin size, cap) (the
  // server's --pull_bin_size; 0: the member's own). A plain shard's downlink bin is the one
  // it was created with.
  void set_downlink_bin_cap(uint32_t cap) { down_bin_cap_ = cap; }
  // A bucket's members' downlink bins are their bin sizes divided by this first (at least
  // 1; DeclareSlice.pull_bin_divisor; kept in checkpoints). A plain shard's is folded into
  // its bin size.
  void set_downlink_bin_divisor(uint32_t divisor) { down_bin_divisor_ = std::max(1u, divisor); }

  // Running mean (a slice declared with recompressed pulls on servers running `mean`, local
  // mode's update exchange): each step adds the step's mean to the parameters instead of
  // replacing them with it, so they are the initial values plus every mean so far, the
  // workers' replica, and a recompressed pull sends their change. Kept in checkpoints.
  void set_running_mean() { running_mean_ = true; }
  bool running_mean() const { return running_mean_; }

  // A worker's declaration of a bucket with segments `table` (and, from rank 0, the values
  // of the table's last segment in `init_of_last`, checked by CheckInitialValues). A table
  // the shard's extends (an earlier declaration) is accepted as it is; one that extends the
  // shard's grows the slice by the new segments (zeros, then `init_of_last`), but only while
  // nothing happened yet (version 0, no push, not restored): kFailedPrecondition otherwise.
  // A restored bucket that lost its table takes one of exactly its length. kInvalidArgument
  // for a table that contradicts the shard's, or for a plain slice. Unchanged on error.
  absl::Status DeclareSegments(absl::Span<const WireSegment> table,
                               absl::Span<const uint8_t> init_of_last);

  // Whether `bytes` are `length` finite float32 values. kInvalidArgument otherwise.
  static absl::Status CheckInitialValues(uint32_t length, absl::Span<const uint8_t> bytes);
  // Takes checked initial values as the parameters (and the published replica) while
  // nothing happened yet: version 0, no push of step 0, not restored. Ignored otherwise.
  void Initialize(absl::Span<const uint8_t> bytes);

  // Sync: adds worker `worker`'s push for `step` (a wire-encoded update) to the step's sum.
  // kInvalidArgument for a payload of another length, kFailedPrecondition for another
  // step or a second push of the worker, the codec's error (kDataLoss...) for bad bytes;
  // the state is then unchanged. A restored shard, until its first step completes, takes
  // the workers' steps (their steps went on after the checkpoint): a later step moves the
  // version there (dropping the sum of the earlier one: that step completed before the
  // restart), an earlier one is acknowledged and not applied (it was applied already).
  // With `backup_workers` > 0 (--backup_workers), a push for a step that completed without
  // it (a straggler's) is not refused: it is added to the step in progress, so nothing it
  // carried is lost (kFailedPrecondition for a second push of a step the worker had pushed).
  // `step_each_push` (the engine: servers running SGD that a sparse step allows): a tracked
  // step keeps its pushes decoded instead of adding them into the sum, and its completion
  // steps the parameters with each in turn (ApplySgdParts, common/wire_codec.h): no pass over
  // a sum of the slice's size, and the step a forwarded SGD answer replays.
  absl::Status AddPush(int worker, uint64_t step, absl::Span<const uint8_t> payload,
                       int backup_workers = 0, bool step_each_push = false);
  // Sync: a worker saw version `seen` of this slice before a restart (Resume). A restored
  // shard that completed no step since and is behind it moves there, as a push for step
  // `seen` would move it (the sum of the step in progress is dropped: it completed before
  // the restart). true when it moved; false (nothing changes) otherwise.
  bool ResumeAt(uint64_t seen);
  // Sync: when some worker pushed this step and at most `backup_workers` of `live` did not,
  // averages the sum over the pushes it holds (late ones included; not for sum-only),
  // applies `optimizer` and advances the version. true when the step completed.
  bool CompleteStepIfReady(const std::set<int>& live, const OptimizerConfig& optimizer,
                           int backup_workers = 0);
  // Async: applies one push at once and advances the version. Errors as AddPush (length,
  // codec); on error the parameters are unchanged.
  absl::Status ApplyPush(absl::Span<const uint8_t> payload, const OptimizerConfig& optimizer);

  // The engine's time on this shard (for the workers' per-step breakdown): `elapsed` of
  // work on the step in progress (pushes), closing that step when `completed` (the step's
  // work becomes the new version's); CountPublishWork adds the encoding of the current
  // version's answers to it. version_work_us(): the current version's work so far.
  void CountStepWork(absl::Duration elapsed, bool completed);
  void CountPublishWork(absl::Duration elapsed) { version_work_ += elapsed; }
  uint64_t version_work_us() const {
    return static_cast<uint64_t>(absl::ToInt64Microseconds(version_work_));
  }

  // Whether the current version's change is known element by element (the last step was
  // tracked and ran an optimizer SparseStepAllowed accepts): sparse answers are possible.
  bool sparse_step() const { return last_sparse_; }
  // The elements the last step changed (ascending), when sparse_step().
  absl::Span<const uint32_t> last_touched() const { return last_touched_; }

  // Tracks the elements of every step from the next one on, so a sparse pull's answer is
  // exact without the dense one: called when a worker declares the slice with sparse pulls
  // (and by the first sparse pull held or answered, for a shard restored without that).
  void TrackSteps() { track_touched_ = true; }
  // Keeps a pull until the version reaches its min_version.
  void Hold(Pull pull);
  // Removes and returns the held pulls the current version satisfies, in arrival order.
  std::vector<Pull> TakeReadyPulls();
  // The answer to `pull` at the current version, encoding it if this version has not been
  // yet. Recompressed: kFailedPrecondition when the puller's replica (have_version) is
  // neither the current version nor the one before; the codec's error if encoding fails
  // (the published replica is then unchanged).
  absl::StatusOr<Answer> AnswerPull(const Pull& pull);

 private:
  Shard() = default;
  // Length and segment table of a push; `learned` receives the table of a segmented push
  // to a bucket that has none yet (restored), to be adopted once the push is applied.
  absl::Status CheckLength(absl::Span<const uint8_t> payload,
                           std::vector<WireSegment>* learned) const;
  absl::Status PublishRecompressed();
  // The tracked step's elements, ascending and distinct, into touched_ (a single push's list
  // as it is; otherwise from touched_bits_, which it leaves all zero).
  void CollectTouched();
  // Encodes the current version's sparse answer (or decides it is dense), once per version.
  absl::Status PublishSparse();
  // The forwarded answer for `pull`: without its own push when it holds that, else the
  // one for everybody.
  PayloadBytes ForwardedFor(const Pull& pull);
  // The last step's pushes forwarded (a mean's, or an SGD step's with its rate).
  absl::Status EncodeForwardedFor(absl::Span<const absl::Span<const uint8_t>> pushes,
                                  std::vector<uint8_t>* out, int own) const;
  // The dense answer's bytes at the current version, encoded once.
  void PublishDense();
  uint32_t DownlinkBin(uint32_t member_bin) const;
  absl::Status PublishRecompressedSegments();
  void Grow(absl::Span<const WireSegment> table);
  // A step kept push by push whose completion needs the sum after all (an optimizer that
  // the sparse step does not allow, or not SGD): the kept pushes added into agg_.
  void AddKeptPushes();
  // Resuming: goes on at `step`, dropping the step in progress (AddPush, ResumeAt).
  void JumpTo(uint64_t step);
  // `bytes` if nobody else holds it (to overwrite it in place), else a new buffer.
  static std::shared_ptr<std::vector<uint8_t>> Reusable(
      std::shared_ptr<std::vector<uint8_t>>& bytes);

  uint64_t key_ = 0;
  std::string name_;
  uint32_t length_ = 0;
  uint32_t bin_size_ = 0;
  uint64_t version_ = 0;
  absl::Duration step_work_, version_work_;  // CountStepWork
  bool restored_ = false;
  bool resuming_ = false;  // restored, and no step completed since (see AddPush)
  std::vector<float> params_;
  OptimizerState optimizer_;
  std::vector<float> agg_;  // sync: the step's sum; async: the push being applied
  std::set<int> pushed_;    // worker ranks that pushed the current step (sync)
  size_t late_in_step_ = 0;  // stragglers' pushes of earlier steps added to this one
  std::map<int, uint64_t> last_late_;  // each straggler's last late step added
  std::vector<Pull> held_;

  std::shared_ptr<std::vector<uint8_t>> dense_bytes_;
  uint64_t dense_version_ = UINT64_MAX;

  // Downlink (recompressed pulls): what workers hold, the residue of what they do not yet,
  // the change from down_base_ to down_version_, and buffers reused from version to version.
  std::vector<float> published_;
  std::unique_ptr<SliceState> down_residue_;
  std::shared_ptr<std::vector<uint8_t>> down_bytes_, down_spare_;
  uint64_t down_base_ = 0, down_version_ = 0;
  // Scratch of the fused pass (common/compressor.h, internal::AdaCompChangeStep), kept
  // from version to version: no allocation per version once sized.
  std::vector<float> down_gmax_, down_scratch_;
  CompressedUpdate down_update_;

  // Sparse pulls: tracking of the elements each step touches starts with a declaration
  // with sparse pulls or the first sparse pull (track_touched_); step_tracked_: the step in progress is tracked from its first
  // push; touched_bits_: its elements so far, one bit each (a bitmap of length_ / 64 words,
  // a 32nd of the parameters' bytes: setting a bit per element pushed and one scan at the
  // step's end cost less than merging the pushes' index lists, 14% of a server's step at 4
  // workers); touched_pending_: some bit may be set; touched_: the first push's elements
  // (then each later push's, as decoded, until they go into the bitmap), then the step's
  // (ascending, distinct); last_touched_: the last
  // step's when last_sparse_. mean_zero_outside_: (mean) every parameter outside
  // last_touched_ is 0, so a step need only clear those.
  bool track_touched_ = false, step_tracked_ = false, last_sparse_ = false;
  bool mean_zero_outside_ = false, touched_pending_ = false;
  std::vector<uint32_t> touched_, last_touched_;
  std::vector<uint64_t> touched_bits_;
  // The tracked step's pushes as they came (step_pushes_[0, step_push_count_), buffers kept
  // from step to step), and the last step's with the scale of its mean, when
  // last_forwardable_ (a tracked mean step, or SGD's: last_sgd_, at rate last_lr_): what a
  // forwarded answer carries.
  std::vector<std::vector<uint8_t>> step_pushes_, last_pushes_;
  // A tracked step stepped push by push (AddPush's step_each_push, decided at its first
  // push): its pushes decoded, step_parts_[0, step_parts_used_); agg_ stays 0 for it.
  bool step_by_push_ = false;
  std::vector<DecodedPart> step_parts_;
  size_t step_parts_used_ = 0;
  std::vector<int> step_push_workers_, last_push_workers_;  // who sent each
  size_t step_push_count_ = 0, last_push_count_ = 0;
  // This version's forwarded answers without one worker's own push, made on first ask.
  std::vector<std::pair<int, std::shared_ptr<std::vector<uint8_t>>>> forwarded_without_;
  float last_scale_ = 1.0f, last_lr_ = 0.0f;
  bool last_forwardable_ = false, last_sgd_ = false;
  // The current version's sparse answer: its bytes (null: the dense one is no larger) at
  // sparse_version_, forwarded pushes (sparse_forwarded_) or the merged list.
  std::shared_ptr<std::vector<uint8_t>> sparse_bytes_, sparse_spare_;
  bool sparse_forwarded_ = false;
  uint64_t sparse_version_ = UINT64_MAX;
  bool sparse_zero_base_ = false;
  CompressedUpdate sparse_update_;

  // A fusion bucket: its segments; their updates and encodings of the current version
  // (reused from version to version).
  bool bucket_ = false;
  std::vector<WireSegment> segments_;
  uint32_t down_bin_cap_ = 0;  // set_downlink_bin_cap
  uint32_t down_bin_divisor_ = 1;  // set_downlink_bin_divisor
  bool running_mean_ = false;      // set_running_mean
  // The optimizer a step runs: `optimizer`, except that a running mean's `mean` becomes
  // SGD at learning rate -1 without weight decay (params += the mean).
  static OptimizerConfig StepConfig(const OptimizerConfig& optimizer, bool running_mean);
  std::vector<CompressedUpdate> seg_updates_;
  std::vector<std::vector<uint8_t>> seg_bytes_;
};

}  // namespace adaps

#endif  // ADAPS_SERVER_SHARD_H_
