// The server's side of membership: common/cluster_client registers, heartbeats, re-registers
// with a restarted scheduler and refuses forged views and shutdowns; the server keeps only
// what the views mean for its shards (the live workers) and how it ends.
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "server/server.h"

namespace adaps {

absl::Status Server::Start() {
  ADAPS_RETURN_IF_ERROR(ValidateServerConfig(config_));
  ADAPS_RETURN_IF_ERROR(transport_->Start());
  std::string address = config_.advertise;
  if (address.empty()) {
    address = absl::StrReplaceAll(transport_->bound_endpoint(), {{"0.0.0.0", "127.0.0.1"}});
  }
  log_.get()->info("listening on {} (advertised as {})", transport_->bound_endpoint(), address);
  cluster_->SetAddress(address);
  // Restore on the I/O thread, right after the view and before any worker message is
  // handled: a worker that learns our address from the same view must find the slices.
  auto view = cluster_->Register([this]() -> absl::Status {
    if (!config_.restore_from.empty()) {
      ADAPS_RETURN_IF_ERROR(RestoreFrom(config_.restore_from));
    } else if (config_.restore && !config_.checkpoint_dir.empty()) {
      absl::Status step = absl::NotFoundError("no step checkpoint every server has");
      if (config_.checkpoint_every_steps > 0) {
        log_.get()->info("latest step checkpoint every server has: {} (this one has {})",
                         restore_step_, StepCheckpoints().size());
      }
      if (restore_step_ > 0) step = RestoreStep(restore_step_);
      if (!step.ok()) {
        if (restore_step_ > 0) log_.get()->warn("{}; trying the latest checkpoint", step.ToString());
        ADAPS_RETURN_IF_ERROR(ReadCheckpoint(config_.checkpoint_dir));
      }
      if (config_.checkpoint_every_steps > 0) {
        RemoveStepCheckpointsAfter(config_.checkpoint_dir, StepName(),
                                   step.ok() ? restore_step_ : 0);
        absl::MutexLock lock(&steps_mu_);
        step_checkpoints_ = ListStepCheckpoints(config_.checkpoint_dir, StepName());
      }
    }
    if (config_.checkpoint_every_steps > 0 && !config_.checkpoint_dir.empty()) {
      engine_->checkpoints().SetStepCheckpoints(
          [this, dir = config_.checkpoint_dir, name = StepName()](uint64_t step) {
            return StepCheckpointPath(dir, name, step);
          },
          job_id_,
          [this](uint64_t step, absl::Status st, size_t n) { OnStepCheckpoint(step, st, n); });
    }
    serving_ = true;
    return absl::OkStatus();
  });
  if (!view.ok()) {
    transport_->Stop();
    return view.status();
  }
  log_.get()->info("registered as server {} of a cluster with {} workers", transport_->rank(),
                   members_.num_workers());
  return absl::OkStatus();
}

bool Server::WaitForShutdown(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

absl::Status Server::exit_status() const {
  absl::MutexLock lock(&mu_);
  return exit_status_;
}

void Server::Stop() {
  transport_->Stop();  // nothing is routed to the engine any more
  engine_->Stop();     // drains what is queued and joins (idempotent)
}

void Server::Finish(absl::Status status) {
  if (finishing_) return;  // I/O thread: the cluster client ends us once, but be sure
  finishing_ = true;
  auto done = [this](absl::Status s) {
    absl::MutexLock lock(&mu_);
    done_ = true;
    exit_status_ = std::move(s);
  };
  if (!status.ok()) {
    log_.get()->error("stopping: {}", status.ToString());
    return done(std::move(status));
  }
  log_.get()->info("the cluster shut down");
  if (config_.checkpoint_dir.empty() || !serving_) return done(std::move(status));
  // A final checkpoint, durable before the server says it is done: a later run of this job
  // (--job_id) resumes from the end.
  StartCheckpoint(config_.checkpoint_dir, [this, done](absl::Status st) {
    if (!st.ok()) log_.get()->error("final checkpoint failed: {}", st.ToString());
    done(absl::OkStatus());
  });
}

void Server::OnView(const msg::ClusterView& view) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (view.job_id() != nullptr) job_id_ = view.job_id()->str();
  restore_step_ = view.restore_step();
  if (view.worker_secrets() != nullptr) {
    // Accumulated: a worker may use a secret of a newer view (a restarted scheduler) first.
    for (const auto* s : *view.worker_secrets()) {
      if (s->size() > 0) worker_secrets_.insert(s->str());
    }
  }
  std::vector<StepMembers::ViewWorker> workers;
  if (view.nodes()) {
    for (const auto* n : *view.nodes()) {
      if (n->role() != msg::Role::Worker || n->rank() < 0) continue;
      workers.push_back({n->rank(), n->alive(), n->stepping()});
    }
  }
  const bool lost = members_.OnView(view.num_workers(), workers);
  metrics_->OnView(transport_->rank(), members_.view_live());
  if (lost) {
    // Info, not warn: workers also leave on a normal finish; the scheduler warns of deaths.
    log_.get()->info("{} live workers now", members_.live().size());
    CompleteStepsWithoutLostWorkers();
  }
}

void Server::CountWorker(int rank) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (!members_.Count(rank)) return;
  log_.get()->info("worker {} joined: {} live workers take part in the steps", rank,
                   members_.live().size());
  // (The engine learns the new set with the next push: Server::SyncLiveWorkers.)
}

}  // namespace adaps
