// The pull side of a shard (server/shard.h): pulls held until their version is published,
// and the answers: the dense parameters, or recompressed (AdaComp on the downlink residue),
// published once per version. Sparse pulls are in shard_sparse.cc.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "server/shard.h"

namespace adaps {

void Shard::Hold(Pull pull) {
  if (pull.format == Format::kSparse) TrackSteps();
  held_.push_back(std::move(pull));
}

std::vector<Shard::Pull> Shard::TakeReadyPulls() {
  std::vector<Pull> ready, still;
  for (Pull& pull : held_) {
    (pull.min_version > version_ ? still : ready).push_back(std::move(pull));
  }
  held_ = std::move(still);
  return ready;
}

std::shared_ptr<std::vector<uint8_t>> Shard::Reusable(
    std::shared_ptr<std::vector<uint8_t>>& bytes) {
  if (bytes && bytes.use_count() == 1) {
    // Whoever held it last released it (e.g. the transport after sending): see its reads
    // as done before we overwrite.
    std::atomic_thread_fence(std::memory_order_acquire);
    return bytes;
  }
  return std::make_shared<std::vector<uint8_t>>();
}

absl::Status Shard::PublishRecompressed() {
  if (!segments_.empty()) return PublishRecompressedSegments();
  // AdaComp over the change the compressor has not seen yet, params - published - residue,
  // computed inside the pass (one pass over the three arrays, no stored change), into the
  // residue's spare buffer: the residue changes only when the step succeeds.
  SliceState& state = *down_residue_;
  state.Discard();
  const absl::Span<float> next = state.spare_residue();
  if (internal::AdaCompChangeStep(params_, published_, state.residue(), next, bin_size_,
                                  down_gmax_, down_scratch_, down_update_)) {
    state.swap_residue();
  } else {
    // Rare: as the downlink compressor's kSendNothing policy, a NaN/Inf change sends an empty
    // update; a float overflow of residue + change is an error (nothing changes).
    std::vector<float> change(length_);
    const float* r = state.residue().data();
    for (uint32_t i = 0; i < length_; ++i) change[i] = params_[i] - published_[i] - r[i];
    if (AllFinite(change)) {
      return absl::OutOfRangeError(
          "AdaComp residue + gradient overflows the float range; residue left unchanged");
    }
  }
  std::shared_ptr<std::vector<uint8_t>> bytes = Reusable(down_spare_);
  ADAPS_RETURN_IF_ERROR(EncodeUpdate(down_update_, IndexCoding::kRice, bytes.get()));
  // The same additions a worker's decode makes (published[i] += +-scale), from the update
  // in memory instead of the encoded bytes.
  ADAPS_RETURN_IF_ERROR(DecompressAdd(down_update_, 1.0f, absl::MakeSpan(published_)));
  down_base_ = down_version_;
  down_version_ = version_;
  down_spare_ = std::move(down_bytes_);
  down_bytes_ = std::move(bytes);
  return absl::OkStatus();
}

uint32_t PullBinSize(uint32_t declared, uint32_t pull_bin_size, uint32_t divisor) {
  if (divisor > 1) declared = std::max<uint32_t>(1, declared / divisor);
  return pull_bin_size == 0 ? declared : std::min(declared, pull_bin_size);
}

uint32_t Shard::DownlinkBin(uint32_t member_bin) const {
  return PullBinSize(member_bin, down_bin_cap_, down_bin_divisor_);
}

// PublishRecompressed segment by segment, each with its member's bin size (DownlinkBin):
// bit for bit what a shard of each member would publish, in one container.
absl::Status Shard::PublishRecompressedSegments() {
  SliceState& state = *down_residue_;
  state.Discard();
  const absl::Span<float> next = state.spare_residue();
  const absl::Span<const float> residue = state.residue();
  seg_updates_.resize(segments_.size());
  seg_bytes_.resize(segments_.size());
  uint64_t at = 0;
  for (size_t i = 0; i < segments_.size(); ++i) {
    const uint32_t n = segments_[i].length;
    auto part = [&](auto span) { return span.subspan(at, n); };
    if (!internal::AdaCompChangeStep(part(absl::MakeConstSpan(params_)),
                                     part(absl::MakeConstSpan(published_)), part(residue),
                                     part(next), DownlinkBin(segments_[i].bin_size), down_gmax_,
                                     down_scratch_, seg_updates_[i])) {
      // As PublishRecompressed: a NaN/Inf change sends nothing for this member (its residue
      // stays, its update is empty); an overflow fails the whole version (nothing changed).
      bool change_finite = true;
      for (uint32_t j = 0; j < n && change_finite; ++j) {
        change_finite = std::isfinite(params_[at + j] - published_[at + j] - residue[at + j]);
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
  std::shared_ptr<std::vector<uint8_t>> bytes = Reusable(down_spare_);
  // The container's table says the bins the members were encoded at.
  std::vector<WireSegment> table = segments_;
  for (WireSegment& seg : table) seg.bin_size = DownlinkBin(seg.bin_size);
  ADAPS_RETURN_IF_ERROR(EncodeSegmented(table, parts, bytes.get()));
  state.swap_residue();
  at = 0;
  for (size_t i = 0; i < segments_.size(); ++i) {
    ADAPS_RETURN_IF_ERROR(DecompressAdd(
        seg_updates_[i], 1.0f, absl::MakeSpan(published_).subspan(at, segments_[i].length)));
    at += segments_[i].length;
  }
  down_base_ = down_version_;
  down_version_ = version_;
  down_spare_ = std::move(down_bytes_);
  down_bytes_ = std::move(bytes);
  return absl::OkStatus();
}

void Shard::PublishDense() {
  if (dense_version_ == version_ && dense_bytes_) return;
  std::shared_ptr<std::vector<uint8_t>> bytes = Reusable(dense_bytes_);
  bytes->resize(params_.size() * sizeof(float));
  std::memcpy(bytes->data(), params_.data(), bytes->size());
  dense_bytes_ = std::move(bytes);
  dense_version_ = version_;
}

absl::StatusOr<Shard::Answer> Shard::AnswerPull(const Pull& pull) {
  Answer answer;
  if (pull.format == Format::kSparse) {
    // Steps are tracked from the declaration with sparse pulls or the first sparse pull on
    // (untracked ones are answered dense).
    TrackSteps();
    if (sparse_version_ != version_) ADAPS_RETURN_IF_ERROR(PublishSparse());
    answer.version = version_;
    if (pull.have_version == version_) {
      answer.format = Format::kSparse;  // nothing new (payload null)
      answer.base = version_;
      return answer;
    }
    const bool mean = last_sparse_ && mean_zero_outside_;
    if (sparse_bytes_ && (mean || pull.have_version + 1 == version_)) {
      answer.format = sparse_forwarded_ ? Format::kForwarded : Format::kSparse;
      answer.zero_base = mean;
      answer.base = version_ - 1;
      answer.payload = sparse_forwarded_ ? ForwardedFor(pull) : sparse_bytes_;
      return answer;
    }
    // The only exact answer, or no larger: the parameters.
  }
  if (pull.format == Format::kDense || pull.format == Format::kSparse) {
    PublishDense();
    answer.version = version_;
    answer.payload = dense_bytes_;
    return answer;
  }
  if (pull.format == Format::kReplica) {
    // (Rare: a worker declaring or resynchronizing. Not cached.) Not published first: a
    // restored shard that took the workers' step would otherwise publish that step, and a
    // worker that took its replica just before would be two versions behind the next one.
    auto bytes = std::make_shared<std::vector<uint8_t>>(published_.size() * sizeof(float));
    std::memcpy(bytes->data(), published_.data(), bytes->size());
    answer.payload = std::move(bytes);
    answer.format = Format::kReplica;
    answer.version = version_;     // the step, as a dense answer says it
    answer.base = down_version_;  // the version of the published state it holds
    return answer;
  }
  if (down_version_ != version_) ADAPS_RETURN_IF_ERROR(PublishRecompressed());
  answer.format = Format::kRecompressed;
  answer.version = down_version_;
  if (pull.have_version == down_base_ && down_base_ != down_version_) {
    answer.payload = down_bytes_;
    answer.base = down_base_;
  } else if (pull.have_version == down_version_) {
    answer.base = down_version_;  // nothing new
  } else {
    // kAborted: the worker takes the published replica again (a kReplica pull) and asks again.
    return absl::AbortedError(absl::StrCat(
        "replica of '", name_, "' at version ", pull.have_version,
        "; the server can only send the change from version ", down_base_));
  }
  return answer;
}

}  // namespace adaps
