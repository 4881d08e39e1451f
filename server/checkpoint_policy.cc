#include "server/checkpoint_policy.h"

#include <unistd.h>

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/checkpoint.h"

namespace adaps {

CheckpointPolicy::CheckpointPolicy(CheckpointPolicyOptions options, std::function<int()> rank,
                                   RoleLog& log, ServerMetrics* metrics, Snapshot snapshot)
    : options_(std::move(options)),
      rank_(std::move(rank)),
      log_(log),
      metrics_(metrics),
      snapshot_(std::move(snapshot)) {
  if (step_checkpoints()) {
    absl::MutexLock lock(&steps_mu_);
    step_checkpoints_ = ListStepCheckpoints(options_.dir, StepName());
  }
}

CheckpointPolicy::~CheckpointPolicy() { Stop(); }

std::string CheckpointPolicy::StepName() const {
  return options_.identity.empty() ? absl::StrCat(rank_()) : options_.identity;
}

int CheckpointPolicy::RememberedRank() const {
  if (!enabled() || options_.identity.empty()) return -1;
  absl::StatusOr<int> rank = ReadRankFile(options_.dir, options_.identity);
  if (!rank.ok()) {
    log_.get()->warn("{}; registering without claiming a rank", rank.status().ToString());
    return -1;
  }
  if (*rank >= 0) log_.get()->info("claiming rank {}, which this server had before", *rank);
  return *rank;
}

void CheckpointPolicy::RememberRank(int rank) {
  if (!enabled() || options_.identity.empty() || rank < 0) return;
  absl::StatusOr<int> had = ReadRankFile(options_.dir, options_.identity);
  if (had.ok() && *had == rank) return;
  if (absl::Status st = WriteRankFile(options_.dir, options_.identity, rank); !st.ok()) {
    log_.get()->error("cannot remember rank {} for a restart: {}", rank, st.ToString());
  }
}

std::vector<uint64_t> CheckpointPolicy::StepCheckpoints() const {
  absl::MutexLock lock(&steps_mu_);
  return step_checkpoints_;
}

void CheckpointPolicy::SetCommonStep(uint64_t step) {
  absl::MutexLock lock(&steps_mu_);
  common_step_ = step;
}

absl::Status CheckpointPolicy::RestoreAtStart(const std::string& job_id, uint64_t restore_step,
                                              const Install& install) {
  if (!options_.restore_from.empty()) {
    ADAPS_RETURN_IF_ERROR(RestoreFrom(job_id, install));
  } else if (options_.restore && enabled()) {
    absl::Status step = absl::NotFoundError("no step checkpoint every server has");
    if (options_.every_steps > 0) {
      log_.get()->info("latest step checkpoint every server has: {} (this one has {})",
                       restore_step, StepCheckpoints().size());
    }
    if (restore_step > 0) step = RestoreStep(restore_step, job_id, install);
    if (!step.ok()) {
      if (restore_step > 0) log_.get()->warn("{}; trying the latest checkpoint", step.ToString());
      ADAPS_RETURN_IF_ERROR(RestoreLatest(job_id, install));
    }
    if (options_.every_steps > 0) {
      RemoveStepCheckpointsAfter(options_.dir, StepName(), step.ok() ? restore_step : 0);
      absl::MutexLock lock(&steps_mu_);
      step_checkpoints_ = ListStepCheckpoints(options_.dir, StepName());
    }
  }
  if (step_checkpoints()) {
    writer_.SetStepCheckpoints(
        [dir = options_.dir, name = StepName()](uint64_t step) {
          return StepCheckpointPath(dir, name, step);
        },
        job_id,
        [this](uint64_t step, absl::Status st, size_t n) { OnStepCheckpoint(step, st, n); });
  }
  return absl::OkStatus();
}

// The step checkpoint every server has (the scheduler's restore_step): one step across
// all shards. Another job's is not restored (the per-server checkpoint rules then apply).
absl::Status CheckpointPolicy::RestoreStep(uint64_t step, const std::string& job_id,
                                           const Install& install) {
  const std::string path = StepCheckpointPath(options_.dir, StepName(), step);
  std::string job;
  HyperValues hyper;
  ADAPS_ASSIGN_OR_RETURN(std::vector<SliceRecord> records, ReadCheckpointFile(path, &job, &hyper));
  if (job != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("step checkpoint ", path, " is of job '", job, "', not '", job_id, "'"));
  }
  const size_t count = records.size();
  ADAPS_RETURN_IF_ERROR(install(std::move(records), hyper));
  log_.get()->info("restored {} slices from step checkpoint {} (the latest step every server has)",
                   count, path);
  return absl::OkStatus();
}

absl::Status CheckpointPolicy::RestoreLatest(const std::string& job_id, const Install& install) {
  const std::string path = CheckpointPath(options_.dir, rank_());
  ADAPS_ASSIGN_OR_RETURN(RestoredCheckpoint restored, ReadCheckpointWithFallback(path));
  if (!restored.found) {
    log_.get()->info("no checkpoint at {}; starting fresh", path);
    return absl::OkStatus();
  }
  if (restored.job_id != job_id) {
    // Another run's model must not be resumed into this job silently.
    SetAside(path, restored.job_id);
    log_.get()->warn(
        "checkpoint {} is of job '{}', not this job '{}': not restored, moved aside to "
        "{}.job-{} (--restore_from=PATH resumes it); starting fresh",
        path, restored.job_id.empty() ? "none (format 2)" : restored.job_id, job_id, path,
        restored.job_id.empty() ? "none" : restored.job_id);
    return absl::OkStatus();
  }
  const size_t count = restored.slices.size();
  ADAPS_RETURN_IF_ERROR(install(std::move(restored.slices), restored.hyper));
  if (restored.from_previous) {
    log_.get()->error("{}; refused, restored {} slices from the previous checkpoint {}.prev",
                      restored.refused.ToString(), count, path);
  } else {
    log_.get()->info("restored {} slices from {}", count, path);
  }
  return absl::OkStatus();
}

absl::Status CheckpointPolicy::RestoreFrom(const std::string& job_id, const Install& install) {
  const std::string& path = options_.restore_from;
  std::string job;
  HyperValues hyper;
  ADAPS_ASSIGN_OR_RETURN(std::vector<SliceRecord> records, ReadCheckpointFile(path, &job, &hyper));
  const size_t count = records.size();
  ADAPS_RETURN_IF_ERROR(install(std::move(records), hyper));
  log_.get()->info("restored {} slices from {} (--restore_from; job '{}', this job '{}')",
                   count, path, job.empty() ? "none" : job, job_id);
  return absl::OkStatus();
}

// Moves a checkpoint of another job (and its .prev) aside to <path>.job-<id>.
void CheckpointPolicy::SetAside(const std::string& path, const std::string& job_id) {
  const std::string aside = absl::StrCat(path, ".job-", job_id.empty() ? "none" : job_id);
  for (const char* suffix : {"", ".prev"}) {
    const std::string from = path + suffix, to = aside + suffix;
    if (::access(from.c_str(), F_OK) == 0 && std::rename(from.c_str(), to.c_str()) != 0) {
      log_.get()->error("cannot move {} aside to {}", from, to);
    }
  }
}

void CheckpointPolicy::Write(const std::string& job_id, std::function<void(absl::Status)> done) {
  const std::string path = CheckpointPath(options_.dir, rank_());
  auto job = std::make_shared<CheckpointJob>();
  job->path = path;
  job->job_id = job_id;
  job->hyper = writer_.hyper();
  // `this` outlives the callback: the writer thread is joined in Stop.
  job->done = [this, path, done = std::move(done)](absl::Status st, size_t n) {
    if (st.ok()) {
      metrics_->Checkpointed();
      log_.get()->info("checkpoint of {} slices written to {}", n, path);
    }
    done(std::move(st));
  };
  snapshot_(std::move(job));
}

void CheckpointPolicy::SliceDeclared(absl::Time now) {
  new_slices_ = true;
  new_slice_at_ = now;
}

void CheckpointPolicy::Tick(absl::Time now, const std::string& job_id) {
  if (options_.interval <= absl::ZeroDuration() || !enabled()) return;
  if (last_timed_ == absl::Time()) last_timed_ = now;
  const bool due = now - last_timed_ >= options_.interval;
  // New slices are written once their declarations paused (a model's are declared together).
  const bool new_slices = new_slices_ && now - new_slice_at_ >= absl::Milliseconds(200);
  if (!due && !new_slices) return;
  if (due) last_timed_ = now;
  if (timed_busy_->exchange(true)) return;
  new_slices_ = false;  // (the snapshot is queued after every declaration routed so far)
  Write(job_id, [this, busy = timed_busy_](absl::Status st) {
    if (!st.ok()) log_.get()->error("timed checkpoint failed: {}", st.ToString());
    busy->store(false);
  });
}

void CheckpointPolicy::OnStepCheckpoint(uint64_t step, const absl::Status& status,
                                        size_t slices) {
  if (!status.ok()) {
    log_.get()->error("step checkpoint {} failed: {}", step, status.ToString());
    return;
  }
  metrics_->Checkpointed();
  log_.get()->info("step checkpoint {} of {} slices written", step, slices);
  absl::MutexLock lock(&steps_mu_);
  // Never the step a restart may be told to restore (the latest every server has).
  PruneStepCheckpoints(options_.dir, StepName(), kKeptStepCheckpoints, common_step_);
  step_checkpoints_ = ListStepCheckpoints(options_.dir, StepName());
}

}  // namespace adaps
