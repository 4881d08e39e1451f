#include "server/shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"

namespace adaps {
absl::StatusOr<Shard> Shard::Create(uint64_t key, std::string name, uint32_t length,
                                    uint32_t bin_size) {
  ADAPS_RET_CHECK(length > 0 && bin_size > 0, absl::StatusCode::kInvalidArgument,
                  "slice length and bin size must be > 0");
  Shard s;
  s.key_ = key;
  s.name_ = std::move(name);
  s.length_ = length;
  s.bin_size_ = bin_size;
  s.params_.assign(length, 0.0f);
  s.agg_.assign(length, 0.0f);
  s.published_.assign(length, 0.0f);
  s.down_residue_ = std::make_unique<SliceState>(length);
  return s;
}

absl::StatusOr<Shard> Shard::CreateBucket(uint64_t key, std::string name,
                                          absl::Span<const WireSegment> table) {
  uint64_t total = 0;
  for (const WireSegment& seg : table) {
    ADAPS_RET_CHECK(seg.length > 0 && seg.bin_size > 0, absl::StatusCode::kInvalidArgument,
                    "bucket segment length and bin size must be > 0");
    total += seg.length;
  }
  ADAPS_RET_CHECK(!table.empty() && total <= UINT32_MAX, absl::StatusCode::kInvalidArgument,
                  "a bucket needs 1 to 2^32-1 elements in segments");
  ADAPS_ASSIGN_OR_RETURN(Shard s, Create(key, std::move(name), static_cast<uint32_t>(total), 1));
  s.bucket_ = true;
  s.segments_.assign(table.begin(), table.end());
  return s;
}

namespace {

// Whether `a` is the beginning of `b`.
bool IsPrefix(absl::Span<const WireSegment> a, absl::Span<const WireSegment> b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

uint64_t TotalLength(absl::Span<const WireSegment> table) {
  uint64_t total = 0;
  for (const WireSegment& seg : table) total += seg.length;
  return total;
}

}  // namespace

void Shard::Grow(absl::Span<const WireSegment> table) {
  const uint32_t length = static_cast<uint32_t>(TotalLength(table));
  segments_.assign(table.begin(), table.end());
  length_ = length;
  params_.resize(length, 0.0f);
  agg_.resize(length, 0.0f);
  published_.resize(length, 0.0f);
  down_residue_ = std::make_unique<SliceState>(length);  // nothing was recompressed yet
  dense_version_ = UINT64_MAX;
}

absl::Status Shard::DeclareSegments(absl::Span<const WireSegment> table,
                                    absl::Span<const uint8_t> init_of_last) {
  for (const WireSegment& seg : table) {
    ADAPS_RET_CHECK(seg.length > 0 && seg.bin_size > 0, absl::StatusCode::kInvalidArgument,
                    "bucket segment length and bin size must be > 0");
  }
  ADAPS_RET_CHECK(!table.empty(), absl::StatusCode::kInvalidArgument, "empty segment table");
  const uint64_t total = TotalLength(table);
  if (!bucket_) {
    // A restored bucket lost its table (checkpoints do not hold it): it takes the one of
    // its length; a shorter one is an earlier member's declaration (a rejoining worker).
    if (restored_ && segments_.empty() && total <= length_) {
      if (total == length_) segments_.assign(table.begin(), table.end());
      return absl::OkStatus();
    }
    if (!restored_ || total > length_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slice '", name_, "' is not a fusion bucket of ", total, " elements"));
    }
  }
  if (!IsPrefix(segments_, table) && !IsPrefix(table, segments_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment table of bucket '", name_, "' contradicts the declared one"));
  }
  const bool fresh = version_ == 0 && pushed_.empty() && !restored_;
  if (table.size() > segments_.size()) {
    if (!fresh) {
      return absl::FailedPreconditionError(absl::StrCat(
          "bucket '", name_, "' has stepped: no member can join it any more"));
    }
    ADAPS_RET_CHECK(total <= UINT32_MAX, absl::StatusCode::kInvalidArgument,
                    "bucket longer than 2^32-1 elements");
    Grow(table);
  }
  if (!init_of_last.empty() && fresh && table.size() == segments_.size()) {
    const WireSegment& last = table.back();
    if (init_of_last.size() == uint64_t{last.length} * sizeof(float)) {
      const uint64_t at = total - last.length;
      std::memcpy(params_.data() + at, init_of_last.data(), init_of_last.size());
      std::memcpy(published_.data() + at, init_of_last.data(), init_of_last.size());
      dense_version_ = UINT64_MAX;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Shard> Shard::FromRecord(SliceRecord r) {
  // (m and v may be shorter: the optimizer sizes them again on its next step.)
  if (r.length == 0 || r.bin_size == 0 || r.params.size() != r.length ||
      r.published.size() != r.length || r.residue.size() != r.length) {
    return absl::DataLossError(absl::StrCat("inconsistent record of slice ", r.key));
  }
  Shard s;
  s.key_ = r.key;
  s.name_ = std::move(r.name);
  s.length_ = r.length;
  s.bin_size_ = r.bin_size;
  s.version_ = r.version;
  s.restored_ = true;
  s.resuming_ = true;
  s.params_ = std::move(r.params);
  s.optimizer_.m = std::move(r.m);
  s.optimizer_.v = std::move(r.v);
  s.optimizer_.adam_t = r.adam_t;
  s.agg_.assign(r.length, 0.0f);
  s.published_ = std::move(r.published);
  s.down_residue_ = std::make_unique<SliceState>(r.length);
  std::copy(r.residue.begin(), r.residue.end(), s.down_residue_->residue().begin());
  s.down_base_ = r.down_base;
  s.down_version_ = r.down_version;
  s.running_mean_ = r.running_mean;
  s.down_bin_divisor_ = std::max(1u, r.down_bin_divisor);
  return s;
}

SliceRecord Shard::ToRecord() const {
  SliceRecord r;
  r.key = key_;
  r.length = length_;
  r.bin_size = bin_size_;
  r.version = version_;
  r.adam_t = optimizer_.adam_t;
  r.down_base = down_base_;
  r.down_version = down_version_;
  r.running_mean = running_mean_;
  r.down_bin_divisor = down_bin_divisor_;
  r.name = name_;
  r.params = params_;
  r.m = optimizer_.m;
  r.v = optimizer_.v;
  r.published = published_;
  const absl::Span<const float> residue = down_residue_->residue();
  r.residue.assign(residue.begin(), residue.end());
  return r;
}

absl::Status Shard::CheckInitialValues(uint32_t length, absl::Span<const uint8_t> bytes) {
  if (bytes.size() != uint64_t{length} * sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial values: ", bytes.size(), " bytes for ", length, " floats"));
  }
  for (size_t i = 0; i < length; ++i) {
    float x;
    std::memcpy(&x, bytes.data() + i * sizeof(float), sizeof(x));
    if (!std::isfinite(x)) {
      return absl::InvalidArgumentError(absl::StrCat("initial value ", i, " is NaN or Inf"));
    }
  }
  return absl::OkStatus();
}

void Shard::Initialize(absl::Span<const uint8_t> bytes) {
  if (version_ != 0 || !pushed_.empty() || restored_) return;
  if (bytes.size() != params_.size() * sizeof(float)) return;  // unchecked: ignored
  std::memcpy(params_.data(), bytes.data(), bytes.size());
  published_ = params_;
  dense_version_ = UINT64_MAX;
}

absl::Status Shard::CheckLength(absl::Span<const uint8_t> payload,
                                std::vector<WireSegment>* learned) const {
  learned->clear();
  ADAPS_ASSIGN_OR_RETURN(WireHeader header, PeekHeader(payload));
  if (header.length != length_) {
    return absl::InvalidArgumentError(absl::StrCat("push of ", header.length,
                                                   " elements to slice '", name_, "' of ",
                                                   length_));
  }
  if (header.segments == 0) {
    if (bucket_ || !segments_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("push to bucket '", name_, "' is not a segmented container"));
    }
    return absl::OkStatus();
  }
  if (!bucket_ && !restored_) {
    return absl::InvalidArgumentError(
        absl::StrCat("segmented push to slice '", name_, "', which is not a fusion bucket"));
  }
  ADAPS_ASSIGN_OR_RETURN(std::vector<SegmentView> views, SplitSegmented(payload));
  const bool learn = segments_.empty();
  for (size_t i = 0; i < views.size(); ++i) {
    if (learn) {
      learned->push_back(views[i].segment);
    } else if (i >= segments_.size() || views[i].segment.length != segments_[i].length) {
      // (Lengths only: a member may bin its pushes at another size than it declared,
      // Worker::SetBinSize; the declared one is the downlink's.)
      return absl::InvalidArgumentError(absl::StrCat(
          "push's segment ", i, " does not match the table of bucket '", name_, "'"));
    }
  }
  if (!learn && views.size() != segments_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push of ", views.size(), " segments to bucket '", name_, "' of ", segments_.size()));
  }
  return absl::OkStatus();
}

absl::Status Shard::AddPush(int worker, uint64_t step, absl::Span<const uint8_t> payload,
                            int backup_workers, bool step_each_push) {
  std::vector<WireSegment> learned;
  ADAPS_RETURN_IF_ERROR(CheckLength(payload, &learned));
  if (step != version_ && resuming_) {
    // The workers' steps went on after the checkpoint. A worker pushes step s only once it
    // saw step s - 1 complete, so every step before the highest pushed one completed before
    // the restart (and is lost with it): go on at that step. A push for an earlier step
    // was applied before the restart already; acknowledged, not applied twice (its pull
    // waits for a version this shard has reached).
    if (step < version_) return absl::OkStatus();
    JumpTo(step);
  }
  // A straggler's push of a step that completed without it (--backup_workers): added to
  // the step in progress, once per step and worker.
  const bool late = backup_workers > 0 && step < version_ && !resuming_;
  if (step != version_ && !late) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push for step ", step, " but slice '", name_, "' is at step ", version_));
  }
  if (late) {
    auto it = last_late_.find(worker);
    if (it != last_late_.end() && it->second >= step) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", worker, " already pushed step ", step, " (late)"));
    }
  } else if (pushed_.count(worker)) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker, " already pushed step ", step));
  }
  if (pushed_.empty() && late_in_step_ == 0) {  // the step's first push (or a refused one's)
    step_tracked_ = track_touched_;
    touched_.clear();
    const size_t words = (size_t{length_} + 63) / 64;
    if (step_tracked_ && (touched_pending_ || touched_bits_.size() != words)) {
      touched_bits_.assign(words, 0);  // (a step dropped half-way, or a bucket that grew)
    }
    touched_pending_ = false;
    step_push_count_ = 0;
    step_push_workers_.clear();
    step_by_push_ = step_tracked_ && step_each_push;
    step_parts_used_ = 0;
  }
  // A tracked step takes the elements each push touched from the decode that adds it (one
  // parse), or, stepped push by push, from the push decoded and kept; on an error neither
  // agg_ nor touched_ changed.
  if (step_by_push_) {
    const size_t first = step_parts_used_;
    bool sparse = true;
    ADAPS_RETURN_IF_ERROR(DecodePushParts(payload, length_, step_parts_, &step_parts_used_,
                                          &sparse));
    for (size_t k = first; k < step_parts_used_; ++k) {
      const DecodedPart& part = step_parts_[k];
      const CompressedUpdate& u = part.update;
      if (u.kind == CompressorKind::kAdaComp || u.kind == CompressorKind::kTopK) {
        for (uint32_t i : u.indices) touched_.push_back(part.offset + i);
      } else {
        for (uint32_t i = 0; i < u.length; ++i) touched_.push_back(part.offset + i);
      }
    }
  } else {
    ADAPS_RETURN_IF_ERROR(step_tracked_
                              ? DecodeAddTouched(payload, 1.0f, absl::MakeSpan(agg_), &touched_)
                              : DecodeAdd(payload, 1.0f, absl::MakeSpan(agg_)));
  }
  if (step_tracked_) {
    // One push's elements are ascending and distinct already (the codec refuses others):
    // they stay the list; from the second push on, every list goes into the bitmap.
    if (step_push_count_ > 0) {
      for (uint32_t i : touched_) touched_bits_[i >> 6] |= uint64_t{1} << (i & 63);
      touched_pending_ = true;
      touched_.clear();
    }
    if (step_push_count_ == step_pushes_.size()) step_pushes_.emplace_back();
    step_pushes_[step_push_count_++].assign(payload.begin(), payload.end());
    step_push_workers_.push_back(worker);
  }
  if (late) {
    last_late_[worker] = step;
    ++late_in_step_;
  } else {
    pushed_.insert(worker);
  }
  if (!learned.empty()) segments_ = std::move(learned);
  return absl::OkStatus();
}

void Shard::AddKeptPushes() {
  // Each was decoded once already (AddPush): adding it cannot fail now.
  for (size_t k = 0; k < step_push_count_; ++k) {
    (void)DecodeAdd(step_pushes_[k], 1.0f, absl::MakeSpan(agg_));
  }
}

void Shard::JumpTo(uint64_t step) {
  std::fill(agg_.begin(), agg_.end(), 0.0f);
  pushed_.clear();
  late_in_step_ = 0;
  version_ = step;
  last_sparse_ = false;
  last_forwardable_ = false;
}

bool Shard::ResumeAt(uint64_t seen) {
  if (!resuming_ || seen <= version_) return false;
  JumpTo(seen);
  return true;
}

OptimizerConfig Shard::StepConfig(const OptimizerConfig& optimizer, bool running_mean) {
  if (!running_mean || optimizer.kind != OptimizerKind::kMean) return optimizer;
  OptimizerConfig sum = optimizer;
  sum.kind = OptimizerKind::kSgd;
  sum.learning_rate = -1.0f;
  sum.weight_decay = 0.0f;
  return sum;
}

bool Shard::CompleteStepIfReady(const std::set<int>& live, const OptimizerConfig& configured,
                                int backup_workers) {
  if (pushed_.empty()) return false;
  const OptimizerConfig optimizer = StepConfig(configured, running_mean_);
  int missing = 0;
  for (int w : live) {
    if (!pushed_.count(w) && ++missing > backup_workers) return false;
  }
  // The mean of the pushes (sum-only: their sum), applied, and agg_ cleared, in one pass;
  // a tracked step with an elementwise optimizer touches only the elements pushed to.
  const float scale = 1.0f / static_cast<float>(pushed_.size() + late_in_step_);
  if (step_tracked_ && SparseStepAllowed(optimizer).ok()) {
    CollectTouched();
    if (optimizer.kind == OptimizerKind::kMean) {
      // The full pass would set every element untouched now to 0: those set before are
      // the only nonzero ones.
      if (mean_zero_outside_) {
        for (uint32_t i : last_touched_) params_[i] = 0.0f;
      } else {
        std::fill(params_.begin(), params_.end(), 0.0f);
      }
      mean_zero_outside_ = true;
    }
    // SGD stepped push by push (no weight decay here: SparseStepAllowed): each push in
    // arrival order at its elements, ApplySgdParts, which a worker's replay of the forwarded
    // pushes repeats (DecodeForwardedSgdCopy). Otherwise agg_ started at 0 and took the
    // pushes in this order, and the step is the optimizer's at the touched elements; the
    // mean is agg_ * scale, which DecodeForwardedCopy repeats.
    const bool by_push = step_by_push_ && optimizer.kind == OptimizerKind::kSgd;
    if (by_push) {
      ApplySgdParts(absl::MakeConstSpan(step_parts_.data(), step_parts_used_), scale,
                    optimizer.learning_rate, absl::MakeSpan(params_));
    } else {
      if (step_by_push_) AddKeptPushes();
      ApplyOptimizerAndClearAt(optimizer, scale, touched_, absl::MakeSpan(agg_),
                               absl::MakeSpan(params_), optimizer_);
    }
    last_touched_.swap(touched_);
    last_sparse_ = true;
    last_sgd_ = by_push;
    last_lr_ = optimizer.learning_rate;
    last_forwardable_ = optimizer.kind == OptimizerKind::kMean ||
                        (last_sgd_ && std::isfinite(last_lr_) && last_lr_ >= 0.0f);
    last_pushes_.swap(step_pushes_);
    last_push_workers_.swap(step_push_workers_);
    last_push_count_ = step_push_count_;
    last_scale_ = scale;
  } else {
    if (step_by_push_) AddKeptPushes();  // (an optimizer set mid-step that needs the sum)
    ApplyOptimizerAndClear(optimizer, scale, absl::MakeSpan(agg_), absl::MakeSpan(params_),
                           optimizer_);
    last_sparse_ = false;
    last_forwardable_ = false;
    mean_zero_outside_ = false;
  }
  step_push_count_ = 0;
  step_parts_used_ = 0;
  step_by_push_ = false;
  touched_.clear();
  step_tracked_ = false;
  pushed_.clear();
  late_in_step_ = 0;
  ++version_;
  resuming_ = false;
  return true;
}

absl::Status Shard::ApplyPush(absl::Span<const uint8_t> payload,
                              const OptimizerConfig& optimizer) {
  std::vector<WireSegment> learned;
  ADAPS_RETURN_IF_ERROR(CheckLength(payload, &learned));
  std::fill(agg_.begin(), agg_.end(), 0.0f);
  ADAPS_RETURN_IF_ERROR(DecodeAdd(payload, 1.0f, absl::MakeSpan(agg_)));
  if (!learned.empty()) segments_ = std::move(learned);
  ApplyOptimizer(StepConfig(optimizer, running_mean_), agg_, absl::MakeSpan(params_), optimizer_);
  ++version_;
  last_sparse_ = false;
  last_forwardable_ = false;
  mean_zero_outside_ = false;
  return absl::OkStatus();
}

void Shard::CountStepWork(absl::Duration elapsed, bool completed) {
  step_work_ += elapsed;
  if (!completed) return;
  version_work_ = step_work_;
  step_work_ = absl::ZeroDuration();
}

}  // namespace adaps
