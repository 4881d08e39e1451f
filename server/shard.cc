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
  s.recompressed_ = RecompressedAnswer(length);
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
  recompressed_.Resize(length);
  dense_.Invalidate();
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
      recompressed_.SetPublished(at, absl::MakeConstSpan(params_).subspan(at, last.length));
      dense_.Invalidate();
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
  if (r.keep_sum && !r.sum.empty() && r.sum.size() != r.length) {
    return absl::DataLossError(absl::StrCat("inconsistent running sum of slice ", r.key));
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
  s.recompressed_ = RecompressedAnswer::FromRecord(r);
  s.running_mean_ = r.running_mean;
  s.keep_sum_ = r.keep_sum;
  // (A sum not begun is known only at version 0: its values are the initial ones.)
  s.sum_lost_ = r.keep_sum && (r.sum_lost || (r.sum.empty() && r.version > 0));
  if (!s.sum_lost_) s.sum_ = std::move(r.sum);
  return s;
}

SliceRecord Shard::ToRecord() const {
  SliceRecord r;
  r.key = key_;
  r.length = length_;
  r.bin_size = bin_size_;
  r.version = version_;
  r.adam_t = optimizer_.adam_t;
  r.running_mean = running_mean_;
  r.keep_sum = keep_sum_;
  r.sum_lost = sum_lost_;
  r.sum = sum_;
  r.name = name_;
  r.params = params_;
  r.m = optimizer_.m;
  r.v = optimizer_.v;
  recompressed_.SaveTo(r);
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
  recompressed_.SetPublished(0, params_);
  dense_.Invalidate();
}

absl::Status Shard::CheckLength(const ParsedUpdate& push,
                                std::vector<WireSegment>* learned) const {
  learned->clear();
  const WireHeader& header = push.header;
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
  const std::vector<SegmentView>& views = push.segments;
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

absl::Status Shard::AddPush(int worker, uint64_t step, const ParsedUpdate& push,
                            int backup_workers, bool step_each_push) {
  std::vector<WireSegment> learned;
  ADAPS_RETURN_IF_ERROR(CheckLength(push, &learned));
  if (step != version_ && resuming_) {
    // The workers' steps went on after the checkpoint. A worker pushes step s only once it
    // saw step s - 1 complete, so every step before the highest pushed one completed before
    // the restart (and is lost with it): go on at that step. A push for an earlier step
    // was applied before the restart already; acknowledged, not applied twice (its pull
    // waits for a version this shard has reached).
    if (step < version_) return absl::OkStatus();
    JumpTo(step);
  }
  // The same push again (its answer was lost with a connection, and the worker cannot tell
  // whether it arrived): applied once; the server acknowledges it again.
  // (A resuming shard acknowledged an earlier step above.)
  auto it = last_pushed_.find(worker);
  const bool again = (step == version_ && pushed_.count(worker)) ||
                     (step < version_ && it != last_pushed_.end() && it->second >= step);
  if (again) {
    return absl::AlreadyExistsError(
        absl::StrCat("worker ", worker, " already pushed step ", step, " to '", name_, "'"));
  }
  // A straggler's push of a step that completed without it (--backup_workers): added to
  // the step in progress, once per step and worker.
  const bool late = backup_workers > 0 && step < version_ && !resuming_;
  if (step != version_ && !late) {
    return absl::FailedPreconditionError(absl::StrCat(
        "push for step ", step, " but slice '", name_, "' is at step ", version_));
  }
  if (pushed_.empty() && late_in_step_ == 0 && sparse_ != nullptr) {
    sparse_->BeginStep(length_, step_each_push);  // the step's first push (or a refused one's)
  }
  // A tracked step's elements and pushes are kept by the sparse answer, which decodes the
  // push (one parse); on an error agg_ did not change.
  if (sparse_ != nullptr && sparse_->step_tracked()) {
    ADAPS_RETURN_IF_ERROR(sparse_->AddPush(worker, push, length_, absl::MakeSpan(agg_)));
  } else {
    ADAPS_RETURN_IF_ERROR(DecodeAdd(push, 1.0f, absl::MakeSpan(agg_)));
  }
  if (late) {
    ++late_in_step_;
  } else {
    pushed_.insert(worker);
  }
  uint64_t& last = last_pushed_[worker];
  last = std::max(last, step);
  if (!learned.empty()) segments_ = std::move(learned);
  return absl::OkStatus();
}

void Shard::KeepSum() {
  if (keep_sum_) return;
  keep_sum_ = true;
  // (Declared so after it stepped, or restored without it: the means before are gone.)
  sum_lost_ = version_ > 0 || restored_;
}

void Shard::JumpTo(uint64_t step) {
  // The steps skipped completed before a restart: their means are not in the sum.
  if (keep_sum_ && step > version_) {
    sum_lost_ = true;
    sum_.clear();
  }
  std::fill(agg_.begin(), agg_.end(), 0.0f);
  pushed_.clear();
  late_in_step_ = 0;
  version_ = step;
  StepResult result;
  result.version = version_;
  result.zero_outside = mean_zero_outside_;
  Stepped(result);
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
  // The running sum begins with the values before the first step (the initial ones).
  const bool summing = keep_sum_ && !sum_lost_;
  if (summing && sum_.empty()) sum_ = params_;
  StepResult result;
  const bool tracked = sparse_ != nullptr && sparse_->step_tracked();
  const bool by_push_kept = tracked && sparse_->by_push();
  if (tracked && SparseStepAllowed(optimizer).ok()) {
    const absl::Span<const uint32_t> touched = sparse_->CollectTouched();
    if (optimizer.kind == OptimizerKind::kMean) {
      // The full pass would set every element untouched now to 0: those set before are
      // the only nonzero ones.
      if (mean_zero_outside_) {
        for (uint32_t i : sparse_->last_touched()) params_[i] = 0.0f;
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
    const bool by_push = by_push_kept && optimizer.kind == OptimizerKind::kSgd;
    if (by_push) {
      ApplySgdParts(sparse_->parts(), scale, optimizer.learning_rate, absl::MakeSpan(params_));
    } else {
      if (by_push_kept) sparse_->AddKeptPushes(absl::MakeSpan(agg_));
      ApplyOptimizerAndClearAt(optimizer, scale, touched, absl::MakeSpan(agg_),
                               absl::MakeSpan(params_), optimizer_);
    }
    // (A mean: every element outside `touched` is 0.)
    if (summing) {
      for (uint32_t i : touched) sum_[i] += params_[i];
    }
    result.sparse = true;
    result.mean = optimizer.kind == OptimizerKind::kMean;
    result.sgd_by_push = by_push;
    result.learning_rate = optimizer.learning_rate;
    result.scale = scale;
  } else {
    // (A step kept push by push whose optimizer, set mid-step, needs the sum.)
    if (by_push_kept) sparse_->AddKeptPushes(absl::MakeSpan(agg_));
    ApplyOptimizerAndClear(optimizer, scale, absl::MakeSpan(agg_), absl::MakeSpan(params_),
                           optimizer_);
    mean_zero_outside_ = false;
    if (summing) {
      for (size_t i = 0; i < params_.size(); ++i) sum_[i] += params_[i];
    }
  }
  pushed_.clear();
  late_in_step_ = 0;
  ++version_;
  resuming_ = false;
  result.version = version_;
  result.zero_outside = mean_zero_outside_;
  Stepped(result);
  return true;
}

absl::Status Shard::ApplyPush(const ParsedUpdate& push, const OptimizerConfig& optimizer) {
  std::vector<WireSegment> learned;
  ADAPS_RETURN_IF_ERROR(CheckLength(push, &learned));
  std::fill(agg_.begin(), agg_.end(), 0.0f);
  ADAPS_RETURN_IF_ERROR(DecodeAdd(push, 1.0f, absl::MakeSpan(agg_)));
  if (!learned.empty()) segments_ = std::move(learned);
  const bool summing = keep_sum_ && !sum_lost_;
  if (summing && sum_.empty()) sum_ = params_;
  ApplyOptimizer(StepConfig(optimizer, running_mean_), agg_, absl::MakeSpan(params_), optimizer_);
  if (summing) {
    for (size_t i = 0; i < params_.size(); ++i) sum_[i] += params_[i];
  }
  ++version_;
  mean_zero_outside_ = false;
  StepResult result;
  result.version = version_;
  Stepped(result);
  return absl::OkStatus();
}

void Shard::Stepped(const StepResult& result) {
  // The dense and recompressed answers publish at the first pull of a version: they need
  // no word of the steps in between.
  if (sparse_ != nullptr) sparse_->OnStep(result);
}

SliceNow Shard::Now() const {
  SliceNow now;
  now.name = name_;
  now.version = version_;
  now.params = params_;
  now.bin_size = bin_size_;
  now.segments = segments_;
  return now;
}

absl::StatusOr<Shard::Answer> Shard::SumAnswer() const {
  if (sum_lost_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slice '", name_, "' lost the running sum of its steps' means (its server restarted "
        "from a checkpoint the workers had stepped past, or it was declared to keep the sum "
        "only after it stepped): a worker cannot join this job where the others are; restart "
        "the whole job from a checkpoint with the new worker count"));
  }
  return ReplicaAnswer(sum_.empty() ? params_ : sum_, version_, version_);  // (empty: no step yet)
}

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

absl::StatusOr<Shard::Answer> Shard::AnswerPull(const Pull& pull) {
  const SliceNow now = Now();
  Answer answer;
  switch (pull.format) {
    case Format::kSparse:
      // Steps are tracked from the declaration with sparse pulls or the first sparse pull
      // on (untracked ones are answered dense).
      TrackSteps();
      return sparse_->Answer(pull, now, dense_);
    case Format::kRecompressed:
      return recompressed_.Answer(pull, now);
    case Format::kReplica:
      if (keep_sum_) {
        ADAPS_ASSIGN_OR_RETURN(answer, SumAnswer());
      } else {
        answer = recompressed_.Replica(now);
      }
      break;
    case Format::kDense:
    case Format::kForwarded:  // (an answer's format only; the server never asks it)
      answer = dense_.Answer(now);
      break;
  }
  if (pull.offset == 0) return answer;
  if (pull.offset > length_) {
    return absl::OutOfRangeError(absl::StrCat("pull of '", name_, "' from element ", pull.offset,
                                              " of ", length_));
  }
  // (Rare: a fusion bucket's member declared after others. The whole answer is cached.)
  const size_t skip = pull.offset * sizeof(float);
  answer.payload = std::make_shared<const std::vector<uint8_t>>(answer.payload->begin() + skip,
                                                                answer.payload->end());
  answer.offset = pull.offset;
  return answer;
}

void Shard::CountStepWork(absl::Duration elapsed, bool completed) {
  step_work_ += elapsed;
  if (!completed) return;
  version_work_ = step_work_;
  step_work_ = absl::ZeroDuration();
}

}  // namespace adaps
