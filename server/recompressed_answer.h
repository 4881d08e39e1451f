// The recompressed answer of a shard (server/shard.h): AdaComp over the change since the
// last published state, with the shard's downlink residue, published once per version and
// the same bytes for every puller, so workers applying the same answers hold
// bitwise-identical replicas. A fusion bucket is recompressed segment by segment with each
// member's bin size, into one container (common/wire_codec.h, EncodeSegmented).
//
// Owns the published replica (what the answers so far add up to), the downlink residue,
// the change's bytes from base() to version() and the buffers reused from version to
// version; a checkpoint keeps the replica, the residue, both versions and the bin divisor
// (SliceRecord). Every shard has one from its creation: the replica starts at the initial
// values. It publishes at the first recompressed pull of a version, so it needs no word of
// the steps in between. Thread-safety: none; the shard's thread owns it.
#ifndef ADAPS_SERVER_RECOMPRESSED_ANSWER_H_
#define ADAPS_SERVER_RECOMPRESSED_ANSWER_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/compressor.h"
#include "common/wire_codec.h"
#include "server/checkpoint.h"
#include "server/pull_answer.h"

namespace adaps {

// The bin size of recompressed pulls of a slice (or a bucket's member) declared with bin size
// `declared`: min(pull_bin_size, declared / divisor) (at least 1; pull_bin_size 0: no cap,
// the server's --pull_bin_size; divisor: DeclareSlice.pull_bin_divisor, 0 or 1: none).
uint32_t PullBinSize(uint32_t declared, uint32_t pull_bin_size, uint32_t divisor = 1);

class RecompressedAnswer {
 public:
  // Nothing published yet: a replica and a residue of `length` zeros.
  explicit RecompressedAnswer(uint32_t length);
  // As checkpoint record `r` holds it (its published replica and residue are moved out).
  // The caller checked the arrays' lengths.
  static RecompressedAnswer FromRecord(SliceRecord& r);
  // Writes the replica, the residue, both versions and the bin divisor into `r`.
  void SaveTo(SliceRecord& r) const;

  RecompressedAnswer(RecompressedAnswer&&) = default;
  RecompressedAnswer& operator=(RecompressedAnswer&&) = default;

  absl::Span<const float> published() const { return published_; }
  // A fusion bucket's members are encoded at min(their bin size, cap) (the server's
  // --pull_bin_size; 0: the member's own). A plain slice's bin is its own.
  void set_bin_cap(uint32_t cap) { bin_cap_ = cap; }
  // A bucket's members' bins are their bin sizes divided by this first (at least 1;
  // DeclareSlice.pull_bin_divisor). A plain slice's is folded into its bin size.
  void set_bin_divisor(uint32_t divisor) { bin_divisor_ = std::max(1u, divisor); }

  // The replica takes `values` at element `at` (initial values, before anything was
  // published).
  void SetPublished(uint64_t at, absl::Span<const float> values);
  // A bucket that grew to `length` (before anything was published): the replica keeps its
  // values and gets zeros after them; the residue starts again.
  void Resize(uint32_t length);

  // The answer to a kRecompressed `pull`: the change from the version before (publishing
  // the current version's first), or nothing new. kAborted when the puller's replica is
  // neither (the worker takes the replica again, kReplica); kOutOfRange when residue +
  // change overflows the float range, or the codec's error (the replica is then unchanged).
  absl::StatusOr<SliceAnswer> Answer(const SlicePull& pull, const SliceNow& now);
  // The answer to a kReplica pull: the published replica as dense floats (not cached; not
  // published first: a restored shard that took the workers' step would otherwise publish
  // that step, and a worker that took its replica just before would be two versions behind
  // the next one).
  SliceAnswer Replica(const SliceNow& now) const;

 private:
  RecompressedAnswer() = default;
  absl::Status Publish(const SliceNow& now);
  absl::Status PublishSegments(const SliceNow& now);
  uint32_t Bin(uint32_t member_bin) const;

  std::vector<float> published_;
  std::unique_ptr<SliceState> residue_;
  // The change from base_ to version_, and the last version's buffer, reused once released.
  std::shared_ptr<std::vector<uint8_t>> bytes_, spare_;
  uint64_t base_ = 0, version_ = 0;
  uint32_t bin_cap_ = 0;      // set_bin_cap
  uint32_t bin_divisor_ = 1;  // set_bin_divisor
  // Scratch of the fused pass (common/compressor.h, internal::AdaCompChangeStep), kept
  // from version to version: no allocation per version once sized.
  std::vector<float> gmax_, scratch_;
  CompressedUpdate update_;
  // A bucket's segments' updates and encodings of the current version.
  std::vector<CompressedUpdate> seg_updates_;
  std::vector<std::vector<uint8_t>> seg_bytes_;
};

}  // namespace adaps

#endif  // ADAPS_SERVER_RECOMPRESSED_ANSWER_H_
