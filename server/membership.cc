// The server's membership: registering with the scheduler, following its cluster views,
// heartbeats, registering again with a restarted scheduler, and its Shutdown. Kept apart
// from the routing of worker messages (server.cc) so that common/cluster_client can
// replace it.
#include <algorithm>

#include "absl/strings/str_cat.h"
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
  address_ = address;
  ADAPS_ASSIGN_OR_RETURN(int scheduler, transport_->Connect(config_.scheduler));
  (void)scheduler;  // peer 0
  absl::Status status = Register(address);
  if (!status.ok()) {
    transport_->Stop();
    return status;
  }
  log_.get()->info("registered as server {} of a cluster with {} workers", transport_->rank(),
                   num_workers_);
  return absl::OkStatus();
}

absl::Status Server::Register(const std::string& address) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto body = msg::CreateRegister(fbb, msg::Role::Server, fbb.CreateString(address),
                                  fbb.CreateString(config_.identity));
  const uint64_t id = transport_->NewRequestId();
  transport_->Request(
      0, id, FinishEnvelope(fbb, transport_->self(), body, id, 0),
      absl::Now() + config_.register_timeout, [this](absl::StatusOr<InMessage> reply) {
        absl::Status status = reply.status();
        if (status.ok() && reply->envelope()->body_type() != msg::Body::ClusterView) {
          status = absl::DataLossError("scheduler answered Register with something else");
        }
        if (status.ok()) OnView(reply->envelope()->body_as_ClusterView());
        // Restore here, on the I/O thread, before any worker message is handled: a worker
        // that learns our address from the same view must find the restored slices.
        if (status.ok() && config_.restore && !config_.checkpoint_dir.empty()) {
          status = ReadCheckpoint(config_.checkpoint_dir);
        }
        if (status.code() == absl::StatusCode::kUnavailable) {
          status = absl::UnavailableError(absl::StrCat(
              "scheduler at ", config_.scheduler, " unreachable: ", status.message()));
        } else if (status.code() == absl::StatusCode::kDeadlineExceeded) {
          status = absl::DeadlineExceededError(absl::StrCat(
              "no cluster view from the scheduler at ", config_.scheduler, " within ",
              absl::FormatDuration(config_.register_timeout)));
        }
        absl::MutexLock lock(&mu_);
        registered_ = true;
        register_status_ = status;
      });
  absl::MutexLock lock(&mu_);
  auto registered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return registered_; };
  mu_.Await(absl::Condition(&registered));
  return register_status_;
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

void Server::Stop() { transport_->Stop(); }

void Server::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  done_ = true;
  exit_status_ = std::move(status);
}

bool Server::AcceptFromScheduler(const InMessage& in) {
  const msg::Envelope* env = in.envelope();
  // Cluster views and shutdowns come from the scheduler, over our DEALER to it (peer 0).
  // The same bodies arriving on the ROUTER are forgeries: any client could otherwise mark
  // workers dead or stop the server.
  if (in.peer() == 0) return true;
  ++refused_;
  ReplyError(in, absl::PermissionDeniedError(absl::StrCat(
                     msg::EnumNameBody(env->body_type()), " is accepted only from the scheduler")));
  return false;
}

void Server::OnShutdown(const msg::Shutdown* sd) {
  const std::string reason = sd->reason() ? sd->reason()->str() : "";
  log_.get()->info("shutdown: {}", reason);
  const int code = sd->code();
  Finish(code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)
             ? absl::OkStatus()
             : absl::Status(static_cast<absl::StatusCode>(code),
                            absl::StrCat("cluster stopped: ", reason)));
}

void Server::OnView(const msg::ClusterView* view) {
  if (view->epoch() < epoch_) return;
  epoch_ = view->epoch();
  if (view->your_rank() >= 0 && transport_->rank() != view->your_rank()) {
    transport_->SetRank(view->your_rank());
    log_.SetRank(view->your_rank());
  }
  num_workers_ = view->num_workers();
  heartbeat_interval_ = absl::Milliseconds(std::max<uint32_t>(10, view->heartbeat_interval_ms()));
  last_heartbeat_ok_ = absl::Now();
  std::set<int> live;
  if (view->nodes()) {
    for (const auto* n : *view->nodes()) {
      if (n->role() == msg::Role::Worker && n->alive()) live.insert(n->rank());
    }
  }
  const bool lost = live.size() < live_workers_.size();
  live_workers_ = std::move(live);
  if (lost) {
    // Info, not warn: workers also leave on a normal finish; the scheduler warns of deaths.
    log_.get()->info("{} live workers now", live_workers_.size());
    CompleteStepsWithoutLostWorkers();
  }
}

void Server::Heartbeat() {
  if (transport_->rank() < 0) return;
  {
    absl::MutexLock lock(&mu_);
    if (done_) return;
  }
  const absl::Time now = absl::Now();
  MaybeTimedCheckpoint(now);
  if (now - last_heartbeat_sent_ < heartbeat_interval_) return;
  last_heartbeat_sent_ = now;
  // Without a scheduler the server keeps serving on the view it has (workers keep training)
  // and keeps knocking; only after scheduler_grace does it give up.
  if (now - last_heartbeat_ok_ > config_.scheduler_grace) {
    log_.get()->error("scheduler silent for {}: stopping",
                      absl::FormatDuration(now - last_heartbeat_ok_));
    Finish(absl::UnavailableError("lost the scheduler"));
    return;
  }
  flatbuffers::FlatBufferBuilder fbb(64);
  auto body = msg::CreateHeartbeat(fbb, epoch_);
  const uint64_t id = transport_->NewRequestId();
  transport_->Request(0, id, FinishEnvelope(fbb, transport_->self(), body, id, 0),
                      now + heartbeat_interval_ * 2, [this](absl::StatusOr<InMessage> reply) {
                        if (reply.ok()) {
                          last_heartbeat_ok_ = absl::Now();
                        } else if (reply.status().code() ==
                                   absl::StatusCode::kFailedPrecondition) {
                          Reregister();  // a restarted scheduler that does not know us
                        }
                      });
}

void Server::Reregister() {
  if (reregistering_) return;
  reregistering_ = true;
  log_.get()->warn("the scheduler does not know this server: registering again as rank {}",
                   transport_->rank());
  flatbuffers::FlatBufferBuilder fbb(256);
  auto body = msg::CreateRegister(fbb, msg::Role::Server, fbb.CreateString(address_),
                                  fbb.CreateString(config_.identity), transport_->rank(), epoch_);
  const uint64_t id = transport_->NewRequestId();
  transport_->Request(0, id, FinishEnvelope(fbb, transport_->self(), body, id, 0),
                      absl::Now() + config_.scheduler_grace,
                      [this](absl::StatusOr<InMessage> reply) {
                        reregistering_ = false;
                        if (!reply.ok() ||
                            reply->envelope()->body_type() != msg::Body::ClusterView) {
                          return;
                        }
                        OnView(reply->envelope()->body_as_ClusterView());
                        log_.get()->info("registered again with the scheduler");
                      });
}

}  // namespace adaps
