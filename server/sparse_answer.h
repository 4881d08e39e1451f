// The sparse answer of a shard (server/shard.h, schemas/README.md "Sparse pulls"): the
// elements each tracked step touches, and the step's smallest exact answer, encoded once
// per version: the new values at those elements as one merged list, or a mean or SGD
// step's pushes forwarded as they came; or the dense answer when that is no larger or the
// only exact one.
//
// A shard makes one when a worker declares the slice with sparse pulls, or at its first
// sparse pull (Shard::TrackSteps); from then on every step is tracked from its first push.
// Owns the step in progress's record (its elements: the first push's list, then a bitmap
// of them; its pushes' bytes and senders; its pushes decoded, when stepped push by push)
// and the last step's (its elements and pushes, what forwarding it needs). The shard's step
// reads the step in progress's elements (CollectTouched, parts) to step only there, and
// tells each change of version once (OnStep), which makes the step in progress the last.
// Thread-safety: none; the shard's thread owns it.
#ifndef ADAPS_SERVER_SPARSE_ANSWER_H_
#define ADAPS_SERVER_SPARSE_ANSWER_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/wire_codec.h"
#include "server/pull_answer.h"

namespace adaps {

class SparseAnswer {
 public:
  // The step in progress. BeginStep at its first push (of `length` elements; stepped push
  // by push when `step_each_push`, Shard::AddPush), then AddPush for each push.
  void BeginStep(uint32_t length, bool step_each_push);
  // Whether the step in progress is tracked (BeginStep came since the last change).
  bool step_tracked() const { return step_tracked_; }
  // Whether its pushes are kept decoded instead of added into the sum.
  bool by_push() const { return by_push_; }
  // A push of the tracked step (parsed: ParseUpdate): decode-added into `agg` collecting its
  // elements, or (by push) decoded and kept; its bytes and sender kept. The codec's error
  // for bad bytes, `agg` and the elements then unchanged.
  absl::Status AddPush(int worker, const ParsedUpdate& push, uint32_t length,
                       absl::Span<float> agg);
  // The tracked step's elements, ascending and distinct (the bitmap is left all zero).
  absl::Span<const uint32_t> CollectTouched();
  // The step's pushes decoded, when by_push().
  absl::Span<const DecodedPart> parts() const {
    return absl::MakeConstSpan(parts_.data(), parts_used_);
  }
  // A step kept push by push whose completion needs the sum after all (an optimizer that
  // the sparse step does not allow, or not SGD): the kept pushes added into `agg`.
  void AddKeptPushes(absl::Span<float> agg) const;

  // The version changed: a sparse step's record becomes the last step's; otherwise the
  // change is not known element by element. The step in progress starts again.
  void OnStep(const StepResult& result);
  // Whether the last change is known element by element (Shard::sparse_step), and its
  // elements (ascending).
  bool last_sparse() const { return last_ != LastStep::kUnknown; }
  absl::Span<const uint32_t> last_touched() const { return last_touched_; }

  // The answer to a kSparse `pull` at `now` (the version of the last OnStep): nothing new,
  // the merged list, the forwarded pushes (without the puller's own when it holds it), or
  // `dense`'s answer. Encoding errors fall back to the dense answer.
  SliceAnswer Answer(const SlicePull& pull, const SliceNow& now, DenseAnswer& dense);

 private:
  // What is known of the last change: nothing (dense answers only); its elements; or also
  // its pushes, which a worker can replay (a mean step's, or an SGD step's at last_lr_).
  enum class LastStep { kUnknown, kElements, kMeanPushes, kSgdPushes };
  // What the current version's answer is: the dense one, the merged list, the forwarded
  // pushes.
  enum class Encoded { kDense, kMerged, kForwarded };

  // Encodes the current version's sparse answer (or decides it is dense), once per version.
  void Publish(const SliceNow& now);
  // The forwarded answer for `pull`: without its own push when it holds that, else the
  // one for everybody.
  PayloadBytes ForwardedFor(const SlicePull& pull, uint64_t version);
  // The last step's pushes forwarded (a mean's, or an SGD step's with its rate).
  absl::Status EncodeLastPushes(std::vector<uint8_t>* out, int own) const;

  // The step in progress: touched_: the first push's elements (then each later push's, as
  // decoded, until they go into the bitmap), then the step's (ascending, distinct);
  // touched_bits_: its elements so far, one bit each (a bitmap of length / 64 words, a 32nd
  // of the parameters' bytes: setting a bit per element pushed and one scan at the step's
  // end cost less than merging the pushes' index lists, 14% of a server's step at 4
  // workers); bits_pending_: some bit may be set. pushes_[0, push_count_): its pushes as
  // they came (buffers kept from step to step), workers_: who sent each; parts_[0,
  // parts_used_): its pushes decoded, when by_push_ (decided at its first push).
  bool step_tracked_ = false, by_push_ = false, bits_pending_ = false;
  std::vector<uint32_t> touched_;
  std::vector<uint64_t> touched_bits_;
  std::vector<std::vector<uint8_t>> pushes_;
  std::vector<int> workers_;
  size_t push_count_ = 0;
  std::vector<DecodedPart> parts_;
  size_t parts_used_ = 0;

  // The last step (swapped with the step in progress's buffers at OnStep).
  LastStep last_ = LastStep::kUnknown;
  bool last_zero_outside_ = false;  // StepResult::zero_outside
  std::vector<uint32_t> last_touched_;
  std::vector<std::vector<uint8_t>> last_pushes_;
  std::vector<int> last_workers_;
  size_t last_push_count_ = 0;
  float last_scale_ = 1.0f, last_lr_ = 0.0f;

  // The current version's answer at version_ (bytes_ null: the dense one), the last
  // version's buffer, and the forwarded answers without one worker's own push (made on
  // first ask).
  uint64_t version_ = UINT64_MAX;
  Encoded encoded_ = Encoded::kDense;
  std::shared_ptr<std::vector<uint8_t>> bytes_, spare_;
  std::vector<std::pair<int, std::shared_ptr<std::vector<uint8_t>>>> forwarded_without_;
  CompressedUpdate update_;
};

}  // namespace adaps

#endif  // ADAPS_SERVER_SPARSE_ANSWER_H_
