#include "server/recompressed_answer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace adaps {

uint32_t PullBinSize(uint32_t declared, uint32_t pull_bin_size, uint32_t divisor) {
  if (divisor > 1) declared = std::max<uint32_t>(1, declared / divisor);
  return pull_bin_size == 0 ? declared : std::min(declared, pull_bin_size);
}

RecompressedAnswer::RecompressedAnswer(uint32_t length)
    : published_(length, 0.0f), residue_(std::make_unique<SliceState>(length)) {}

RecompressedAnswer RecompressedAnswer::FromRecord(SliceRecord& r) {
  RecompressedAnswer a;
  a.published_ = std::move(r.published);
  a.residue_ = std::make_unique<SliceState>(r.length);
  std::copy(r.residue.begin(), r.residue.end(), a.residue_->residue().begin());
  a.base_ = r.down_base;
  a.version_ = r.down_version;
  a.bin_divisor_ = std::max(1u, r.down_bin_divisor);
  return a;
}

void RecompressedAnswer::SaveTo(SliceRecord& r) const {
  r.down_base = base_;
  r.down_version = version_;
  r.down_bin_divisor = bin_divisor_;
  r.published = published_;
  const absl::Span<const float> residue = residue_->residue();
  r.residue.assign(residue.begin(), residue.end());
}

void RecompressedAnswer::SetPublished(uint64_t at, absl::Span<const float> values) {
  std::memcpy(published_.data() + at, values.data(), values.size() * sizeof(float));
}

void RecompressedAnswer::Resize(uint32_t length) {
  published_.resize(length, 0.0f);
  residue_ = std::make_unique<SliceState>(length);  // nothing was recompressed yet
}

absl::Status RecompressedAnswer::Publish(const SliceNow& now) {
  if (!now.segments.empty()) return PublishSegments(now);
  // AdaComp over the change the compressor has not seen yet, params - published - residue,
  // computed inside the pass (one pass over the three arrays, no stored change), into the
  // residue's spare buffer: the residue changes only when the step succeeds.
  SliceState& state = *residue_;
  state.Discard();
  const absl::Span<float> next = state.spare_residue();
  if (internal::AdaCompChangeStep(now.params, published_, state.residue(), next, now.bin_size,
                                  gmax_, scratch_, update_)) {
    state.swap_residue();
  } else {
    // Rare: as the downlink compressor's kSendNothing policy, a NaN/Inf change sends an empty
    // update; a float overflow of residue + change is an error (nothing changes).
    const size_t length = now.params.size();
    std::vector<float> change(length);
    const float* r = state.residue().data();
    for (size_t i = 0; i < length; ++i) change[i] = now.params[i] - published_[i] - r[i];
    if (AllFinite(change)) {
      return absl::OutOfRangeError(
          "AdaComp residue + gradient overflows the float range; residue left unchanged");
    }
  }
  std::shared_ptr<std::vector<uint8_t>> bytes = ReusableBytes(spare_);
  ADAPS_RETURN_IF_ERROR(EncodeUpdate(update_, IndexCoding::kRice, bytes.get()));
  // The same additions a worker's decode makes (published[i] += +-scale), from the update
  // in memory instead of the encoded bytes.
  ADAPS_RETURN_IF_ERROR(DecompressAdd(update_, 1.0f, absl::MakeSpan(published_)));
  base_ = version_;
  version_ = now.version;
  spare_ = std::move(bytes_);
  bytes_ = std::move(bytes);
  return absl::OkStatus();
}

uint32_t RecompressedAnswer::Bin(uint32_t member_bin) const {
  return PullBinSize(member_bin, bin_cap_, bin_divisor_);
}

// Publish segment by segment, each with its member's bin size (Bin): bit for bit what a
// shard of each member would publish, in one container.
absl::Status RecompressedAnswer::PublishSegments(const SliceNow& now) {
  const absl::Span<const WireSegment> segments = now.segments;
  const absl::Span<const float> params = now.params;
  SliceState& state = *residue_;
  state.Discard();
  const absl::Span<float> next = state.spare_residue();
  const absl::Span<const float> residue = state.residue();
  seg_updates_.resize(segments.size());
  seg_bytes_.resize(segments.size());
  uint64_t at = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const uint32_t n = segments[i].length;
    auto part = [&](auto span) { return span.subspan(at, n); };
    if (!internal::AdaCompChangeStep(part(params), part(absl::MakeConstSpan(published_)),
                                     part(residue), part(next), Bin(segments[i].bin_size), gmax_,
                                     scratch_, seg_updates_[i])) {
      // As Publish: a NaN/Inf change sends nothing for this member (its residue stays, its
      // update is empty); an overflow fails the whole version (nothing changed).
      bool change_finite = true;
      for (uint32_t j = 0; j < n && change_finite; ++j) {
        change_finite = std::isfinite(params[at + j] - published_[at + j] - residue[at + j]);
      }
      if (change_finite) {
        return absl::OutOfRangeError(
            "AdaComp residue + gradient overflows the float range; residue left unchanged");
      }
      std::copy(residue.begin() + at, residue.begin() + at + n, next.begin() + at);
    }
    ADAPS_RETURN_IF_ERROR(EncodeUpdate(seg_updates_[i], IndexCoding::kRice, &seg_bytes_[i]));
    at += n;
  }
  std::vector<absl::Span<const uint8_t>> parts(seg_bytes_.begin(), seg_bytes_.end());
  std::shared_ptr<std::vector<uint8_t>> bytes = ReusableBytes(spare_);
  // The container's table says the bins the members were encoded at.
  std::vector<WireSegment> table(segments.begin(), segments.end());
  for (WireSegment& seg : table) seg.bin_size = Bin(seg.bin_size);
  ADAPS_RETURN_IF_ERROR(EncodeSegmented(table, parts, bytes.get()));
  state.swap_residue();
  at = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    ADAPS_RETURN_IF_ERROR(DecompressAdd(
        seg_updates_[i], 1.0f, absl::MakeSpan(published_).subspan(at, segments[i].length)));
    at += segments[i].length;
  }
  base_ = version_;
  version_ = now.version;
  spare_ = std::move(bytes_);
  bytes_ = std::move(bytes);
  return absl::OkStatus();
}

absl::StatusOr<SliceAnswer> RecompressedAnswer::Answer(const SlicePull& pull,
                                                       const SliceNow& now) {
  if (version_ != now.version) ADAPS_RETURN_IF_ERROR(Publish(now));
  SliceAnswer answer;
  answer.format = AnswerFormat::kRecompressed;
  answer.version = version_;
  if (pull.have_version == base_ && base_ != version_) {
    answer.payload = bytes_;
    answer.base = base_;
  } else if (pull.have_version == version_) {
    answer.base = version_;  // nothing new
  } else {
    // kAborted: the worker takes the published replica again (a kReplica pull) and asks again.
    return absl::AbortedError(absl::StrCat(
        "replica of '", now.name, "' at version ", pull.have_version,
        "; the server can only send the change from version ", base_));
  }
  return answer;
}

SliceAnswer RecompressedAnswer::Replica(const SliceNow& now) const {
  // The step, as a dense answer says it; the version of the published state it holds.
  return ReplicaAnswer(published_, now.version, version_);
}

}  // namespace adaps
