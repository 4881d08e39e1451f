#include "server/sparse_answer.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <vector>

#include "common/status_macros.h"

namespace adaps {

void SparseAnswer::BeginStep(uint32_t length, bool step_each_push) {
  step_tracked_ = true;
  touched_.clear();
  const size_t words = (size_t{length} + 63) / 64;
  if (bits_pending_ || touched_bits_.size() != words) {
    touched_bits_.assign(words, 0);  // (a step dropped half-way, or a bucket that grew)
  }
  bits_pending_ = false;
  push_count_ = 0;
  workers_.clear();
  by_push_ = step_each_push;
  parts_used_ = 0;
}

absl::Status SparseAnswer::AddPush(int worker, const ParsedUpdate& push, uint32_t length,
                                   absl::Span<float> agg) {
  // The elements each push touched come from the decode that adds it (one parse), or,
  // stepped push by push, from the push decoded and kept; on an error neither `agg` nor
  // touched_ changed.
  if (by_push_) {
    const size_t first = parts_used_;
    bool sparse = true;
    ADAPS_RETURN_IF_ERROR(DecodePushParts(push, length, parts_, &parts_used_, &sparse));
    for (size_t k = first; k < parts_used_; ++k) {
      const DecodedPart& part = parts_[k];
      const CompressedUpdate& u = part.update;
      if (u.kind == CompressorKind::kAdaComp || u.kind == CompressorKind::kTopK) {
        for (uint32_t i : u.indices) touched_.push_back(part.offset + i);
      } else {
        for (uint32_t i = 0; i < u.length; ++i) touched_.push_back(part.offset + i);
      }
    }
  } else {
    ADAPS_RETURN_IF_ERROR(DecodeAddTouched(push, 1.0f, agg, &touched_));
  }
  // One push's elements are ascending and distinct already (the codec refuses others):
  // they stay the list; from the second push on, every list goes into the bitmap.
  if (push_count_ > 0) {
    for (uint32_t i : touched_) touched_bits_[i >> 6] |= uint64_t{1} << (i & 63);
    bits_pending_ = true;
    touched_.clear();
  }
  if (push_count_ == pushes_.size()) pushes_.emplace_back();
  pushes_[push_count_++].assign(push.bytes.begin(), push.bytes.end());
  workers_.push_back(worker);
  return absl::OkStatus();
}

absl::Span<const uint32_t> SparseAnswer::CollectTouched() {
  if (bits_pending_) {
    touched_.clear();
    for (size_t w = 0; w < touched_bits_.size(); ++w) {
      uint64_t bits = touched_bits_[w];
      if (bits == 0) continue;
      touched_bits_[w] = 0;
      const uint32_t base = static_cast<uint32_t>(w * 64);
      do {
        touched_.push_back(base + static_cast<uint32_t>(__builtin_ctzll(bits)));
        bits &= bits - 1;
      } while (bits != 0);
    }
  }
  bits_pending_ = false;
  return touched_;
}

void SparseAnswer::AddKeptPushes(absl::Span<float> agg) const {
  // Each was decoded once already (AddPush): adding it cannot fail now.
  for (size_t k = 0; k < push_count_; ++k) (void)DecodeAdd(pushes_[k], 1.0f, agg);
}

void SparseAnswer::OnStep(const StepResult& result) {
  if (result.sparse) {
    last_touched_.swap(touched_);
    if (result.mean) {
      last_ = LastStep::kMeanPushes;
    } else if (result.sgd_by_push && std::isfinite(result.learning_rate) &&
               result.learning_rate >= 0.0f) {
      last_ = LastStep::kSgdPushes;
    } else {
      last_ = LastStep::kElements;
    }
    last_lr_ = result.learning_rate;
    last_pushes_.swap(pushes_);
    last_workers_.swap(workers_);
    last_push_count_ = push_count_;
    last_scale_ = result.scale;
  } else {
    last_ = LastStep::kUnknown;
  }
  last_zero_outside_ = result.zero_outside;
  push_count_ = 0;
  parts_used_ = 0;
  by_push_ = false;
  touched_.clear();
  step_tracked_ = false;
}

// The smallest exact sparse answer, kept only when smaller than the dense one: the new
// values at the elements the step touched, as one Top-k encoding (one merged ascending index
// list, Rice-coded gaps, float32 values; exact whatever the optimizer's rounding, since the
// worker assigns the server's own floats), or, for a mean or SGD step, the step's pushes
// forwarded as they came (their sign bits against 32-bit values: about W times smaller at
// AdaComp's densities; exact because the worker replays the same float operations in the
// same order, an SGD step's with the rate the server used).
void SparseAnswer::Publish(const SliceNow& now) {
  version_ = now.version;
  encoded_ = Encoded::kDense;
  forwarded_without_.clear();
  // The last version's buffer, written again once whoever sends it released it.
  if (bytes_) spare_ = std::move(bytes_);
  if (last_ == LastStep::kUnknown) return;
  const uint64_t dense = uint64_t{now.params.size()} * sizeof(float);
  uint64_t forwarded = UINT64_MAX;
  const bool replayable = last_ == LastStep::kSgdPushes ||
                          (last_ == LastStep::kMeanPushes && last_zero_outside_);
  if (replayable && last_push_count_ > 0) {
    forwarded = 12;
    for (size_t i = 0; i < last_push_count_; ++i) forwarded += 4 + last_pushes_[i].size();
  }
  std::shared_ptr<std::vector<uint8_t>> bytes = ReusableBytes(spare_);
  spare_.reset();
  // The merged list holds at least 4 bytes a value: encoded only when it may be the smallest.
  if (uint64_t{last_touched_.size()} * sizeof(float) < std::min(dense, forwarded)) {
    CompressedUpdate& u = update_;
    u.kind = CompressorKind::kTopK;
    u.length = static_cast<uint32_t>(now.params.size());
    u.bin_size = 0;
    u.indices.assign(last_touched_.begin(), last_touched_.end());
    u.values.resize(last_touched_.size());
    for (size_t j = 0; j < last_touched_.size(); ++j) u.values[j] = now.params[last_touched_[j]];
    // (A value the codec refuses, NaN or Inf, goes out in the dense answer as it is.)
    if (EncodeUpdate(u, IndexCoding::kRice, bytes.get()).ok() &&
        bytes->size() < std::min(dense, forwarded)) {
      bytes_ = std::move(bytes);
      encoded_ = Encoded::kMerged;
      return;
    }
  }
  if (forwarded < dense && EncodeLastPushes(bytes.get(), -1).ok()) {
    bytes_ = std::move(bytes);
    encoded_ = Encoded::kForwarded;
    return;
  }
  spare_ = std::move(bytes);
}

absl::Status SparseAnswer::EncodeLastPushes(std::vector<uint8_t>* out, int own) const {
  std::vector<absl::Span<const uint8_t>> pushes(last_pushes_.begin(),
                                                last_pushes_.begin() + last_push_count_);
  return last_ == LastStep::kSgdPushes
             ? EncodeForwardedSgd(last_scale_, last_lr_, pushes, out, own)
             : EncodeForwarded(last_scale_, pushes, out, own);
}

PayloadBytes SparseAnswer::ForwardedFor(const SlicePull& pull, uint64_t version) {
  if (pull.worker < 0 || pull.held_push != version) return bytes_;
  const auto own = std::find(last_workers_.begin(), last_workers_.end(), pull.worker);
  if (own == last_workers_.end()) return bytes_;
  for (const auto& [worker, bytes] : forwarded_without_) {
    if (worker == pull.worker) return bytes;
  }
  auto bytes = std::make_shared<std::vector<uint8_t>>();
  if (!EncodeLastPushes(bytes.get(), static_cast<int>(own - last_workers_.begin())).ok()) {
    return bytes_;  // (encoded once already: cannot fail)
  }
  forwarded_without_.emplace_back(pull.worker, bytes);
  return bytes;
}

SliceAnswer SparseAnswer::Answer(const SlicePull& pull, const SliceNow& now,
                                 DenseAnswer& dense) {
  if (version_ != now.version) Publish(now);
  SliceAnswer answer;
  answer.version = now.version;
  if (pull.have_version == now.version) {
    answer.format = AnswerFormat::kSparse;  // nothing new (payload null)
    answer.base = now.version;
    return answer;
  }
  const bool mean = last_sparse() && last_zero_outside_;
  if (bytes_ && (mean || pull.have_version + 1 == now.version)) {
    const bool forwarded = encoded_ == Encoded::kForwarded;
    answer.format = forwarded ? AnswerFormat::kForwarded : AnswerFormat::kSparse;
    answer.zero_base = mean;
    answer.base = now.version - 1;
    answer.payload = forwarded ? ForwardedFor(pull, now.version) : bytes_;
    return answer;
  }
  // The only exact answer, or no larger: the parameters.
  return dense.Answer(now);
}

}  // namespace adaps
