// One slice of the server's parameters and its step: parameters, optimizer state, the
// aggregation buffer of the current step, the version, and the pulls held until a later
// version (docs/architecture.md "The server's shard").
//
// Sync mode: AddPush decodes a worker's wire payload straight into the aggregation buffer;
// CompleteStepIfReady averages it (sum-only: not), runs the optimizer once and advances
// the version when every live worker has pushed. Async mode: ApplyPush applies each push.
//
// Pulls are answered by the shard's answer kinds, parts with their own state, chosen by the
// pull's format in AnswerPull: DenseAnswer (server/pull_answer.h), RecompressedAnswer
// (server/recompressed_answer.h: the published replica and the downlink residue) and
// SparseAnswer (server/sparse_answer.h: made once steps are tracked, TrackSteps). Each
// answer is encoded at most once per version and the same bytes go to every worker, so
// workers applying the same messages hold bitwise-identical replicas. Each change of
// version is told to the answers in one call (StepResult).
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
// a shard owns all its state and its parts (no globals, nothing shared with another shard);
// answer bytes are shared with whoever sends them and never changed while anyone else
// holds them. Thread-safety: none; one thread owns a shard (its engine thread,
// server/engine.h).
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
#include "server/pull_answer.h"
#include "server/recompressed_answer.h"
#include "server/sparse_answer.h"

namespace adaps {

class Shard {
 public:
  // The pull side's types (server/pull_answer.h), by their names in the shard.
  using PayloadBytes = adaps::PayloadBytes;
  using Format = AnswerFormat;
  using Pull = SlicePull;
  using Answer = SliceAnswer;

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
  // The published replica of recompressed pulls (RecompressedAnswer).
  absl::Span<const float> published() const { return recompressed_.published(); }
  size_t held_pulls() const { return held_.size(); }
  // A bucket's segments (empty for a plain slice, and for a bucket restored from a
  // checkpoint until a declaration or a push told it its table again).
  const std::vector<WireSegment>& segments() const { return segments_; }
  // A fusion bucket's recompressed pulls encode each member at min(its bin size, cap) (the
  // server's --pull_bin_size; 0: the member's own). A plain shard's downlink bin is the one
  // it was created with.
  void set_downlink_bin_cap(uint32_t cap) { recompressed_.set_bin_cap(cap); }
  // A bucket's members' downlink bins are their bin sizes divided by this first (at least
  // 1; DeclareSlice.pull_bin_divisor; kept in checkpoints). A plain shard's is folded into
  // its bin size.
  void set_downlink_bin_divisor(uint32_t divisor) { recompressed_.set_bin_divisor(divisor); }

  // Running mean (a slice declared with recompressed pulls on servers running `mean`, local
  // mode's update exchange): each step adds the step's mean to the parameters instead of
  // replacing them with it, so they are the initial values plus every mean so far, the
  // workers' replica, and a recompressed pull sends their change. Kept in checkpoints.
  void set_running_mean() { running_mean_ = true; }
  bool running_mean() const { return running_mean_; }

  // Running sum (a slice declared with dense or sparse pulls on servers running `mean`,
  // DeclareSlice.keep_sum: local mode's update exchange, which pulls each step's exact mean):
  // beside the step's mean the slice keeps the initial values plus every mean so far, each
  // step adding its mean in float32 as every worker adds it to its replica, so the sum is
  // their replica bit for bit; a Replica pull answers it (a worker that joins the running
  // job starts there). The sum begins at the first step, from the values then (the initial
  // ones); a shard that stepped already, or restored from a checkpoint without it, or that
  // a restart made skip steps (AddPush, ResumeAt), has lost it: its Replica pulls are then
  // refused (kFailedPrecondition). Kept in checkpoints. One more float per element.
  void KeepSum();
  bool keeps_sum() const { return keep_sum_; }

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

  // Sync: adds worker `worker`'s push for `step` (a wire-encoded update, parsed at the edge:
  // ParseUpdate) to the step's sum. kInvalidArgument for a payload of another length,
  // kFailedPrecondition for another step, kAlreadyExists for a step the worker's push of
  // was applied already (sent again after its answer was lost with a connection: the
  // engine acknowledges it again), the codec's error (kDataLoss...) for bad bytes; the
  // state is then unchanged. A restored shard, until its
  // first step completes, takes the workers' steps (their steps went on after the
  // checkpoint): a later step moves the version there (dropping the sum of the earlier one:
  // that step completed before the restart), an earlier one is acknowledged and not applied
  // (it was applied already).
  // With `backup_workers` > 0 (--backup_workers), a push for a step that completed without
  // it (a straggler's) is not refused: it is added to the step in progress, so nothing it
  // carried is lost (kAlreadyExists for a second push of a step the worker had pushed).
  // `step_each_push` (the engine: servers running SGD that a sparse step allows): a tracked
  // step keeps its pushes decoded instead of adding them into the sum, and its completion
  // steps the parameters with each in turn (ApplySgdParts, common/wire_codec.h): no pass over
  // a sum of the slice's size, and the step a forwarded SGD answer replays.
  absl::Status AddPush(int worker, uint64_t step, const ParsedUpdate& push,
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
  absl::Status ApplyPush(const ParsedUpdate& push, const OptimizerConfig& optimizer);

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
  bool sparse_step() const { return sparse_ != nullptr && sparse_->last_sparse(); }
  // The elements the last step changed (ascending), when sparse_step().
  absl::Span<const uint32_t> last_touched() const {
    return sparse_ != nullptr ? sparse_->last_touched() : absl::Span<const uint32_t>();
  }

  // Tracks the elements of every step from the next one on, so a sparse pull's answer is
  // exact without the dense one: called when a worker declares the slice with sparse pulls
  // (and by the first sparse pull held or answered, for a shard restored without that).
  void TrackSteps() {
    if (sparse_ == nullptr) sparse_ = std::make_unique<SparseAnswer>();
  }
  // Keeps a pull until the version reaches its min_version.
  void Hold(Pull pull);
  // Removes and returns the held pulls the current version satisfies, in arrival order.
  std::vector<Pull> TakeReadyPulls();
  // The answer to `pull` at the current version, by the answer kind of its format, which
  // encodes it if this version has not been yet. Recompressed: kAborted when the puller's
  // replica (have_version) is neither the published version nor the one before; kOutOfRange
  // or the codec's error if encoding fails (the published replica is then unchanged).
  // Dense and Replica from `pull.offset` on (kOutOfRange past the slice's end).
  absl::StatusOr<Answer> AnswerPull(const Pull& pull);

 private:
  Shard() = default;
  // Length and segment table of a push; `learned` receives the table of a segmented push
  // to a bucket that has none yet (restored), to be adopted once the push is applied.
  absl::Status CheckLength(const ParsedUpdate& push, std::vector<WireSegment>* learned) const;
  void Grow(absl::Span<const WireSegment> table);
  // Resuming: goes on at `step`, dropping the step in progress (AddPush, ResumeAt).
  void JumpTo(uint64_t step);
  // The version changed (`result`): tells the answers that follow steps.
  void Stepped(const StepResult& result);
  // What the answers read of the slice now.
  SliceNow Now() const;
  // KeepSum: the answer to a Replica pull (the sum as dense floats).
  absl::StatusOr<Answer> SumAnswer() const;
  // The optimizer a step runs: `optimizer`, except that a running mean's `mean` becomes
  // SGD at learning rate -1 without weight decay (params += the mean).
  static OptimizerConfig StepConfig(const OptimizerConfig& optimizer, bool running_mean);

  // The slice.
  uint64_t key_ = 0;
  std::string name_;
  uint32_t length_ = 0;
  uint32_t bin_size_ = 0;
  // A fusion bucket: its segments (docs/architecture.md "Fusion").
  bool bucket_ = false;
  std::vector<WireSegment> segments_;

  // The step: the version, the parameters and the optimizer's state, and the step in
  // progress: sync: the sum of its pushes and who sent them; async: the push being applied.
  uint64_t version_ = 0;
  bool restored_ = false;
  bool resuming_ = false;      // restored, and no step completed since (see AddPush)
  bool running_mean_ = false;  // set_running_mean
  // KeepSum: the sum (empty until the first step), or lost.
  bool keep_sum_ = false;
  bool sum_lost_ = false;
  std::vector<float> sum_;
  // (Mean) every parameter outside the last step's elements (SparseAnswer::last_touched)
  // is 0, so a tracked step need only clear those.
  bool mean_zero_outside_ = false;
  std::vector<float> params_;
  OptimizerState optimizer_;
  std::vector<float> agg_;
  std::set<int> pushed_;               // worker ranks that pushed the current step (sync)
  size_t late_in_step_ = 0;            // stragglers' pushes of earlier steps added to this one
  // Each worker's last step whose push was applied (in its step or, a straggler's, late): a
  // push of a step at or before it is one sent again after its answer was lost
  // (kAlreadyExists; the server acknowledges it again).
  std::map<int, uint64_t> last_pushed_;
  absl::Duration step_work_, version_work_;  // CountStepWork
  std::vector<Pull> held_;

  // The answer kinds (server/pull_answer.h). The sparse one exists once steps are tracked
  // (TrackSteps); it also tracks the elements and pushes of each step.
  DenseAnswer dense_;
  RecompressedAnswer recompressed_{0};
  std::unique_ptr<SparseAnswer> sparse_;
};

}  // namespace adaps

#endif  // ADAPS_SERVER_SHARD_H_
