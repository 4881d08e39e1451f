// Worker::Impl, membership part: registering with the scheduler, heartbeats, registering
// again after a scheduler restart, cluster views (servers dead or moved), Shutdown, and the
// guard against scheduler-only messages from other peers. Kept apart from the data path:
// common/cluster_client is to replace it.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/worker_impl.h"

namespace adaps {
namespace {
constexpr int kSchedulerPeer = 0;
}  // namespace

Worker::Impl::Impl(const WorkerOptions& options)
    : options_(options), log_("worker", options.log_level) {
  TransportOptions topts;
  topts.self = Sender{msg::Role::Worker, -1};
  topts.context = options_.context;
  topts.log = &log_;
  topts.curve.server_public_key = options_.curve_server_public_key;
  topts.curve.client_public_key = options_.curve_public_key;
  topts.curve.client_secret_key = options_.curve_secret_key;
  transport_ = std::make_unique<Transport>(std::move(topts),
                                           [this](InMessage in) { Handle(std::move(in)); });
  transport_->AddTimer(absl::Milliseconds(100), [this] { Heartbeat(); });
}

Worker::Impl::~Impl() { Stop().IgnoreError(); }

absl::Status Worker::Impl::Init() {
  ADAPS_RET_CHECK(!options_.scheduler.empty(), absl::StatusCode::kInvalidArgument,
                  "no scheduler address");
  ADAPS_RET_CHECK(options_.request_timeout > absl::ZeroDuration() &&
                      options_.register_timeout > absl::ZeroDuration(),
                  absl::StatusCode::kInvalidArgument, "timeouts must be positive");
  ADAPS_RETURN_IF_ERROR(ValidateLogLevel(options_.log_level));
  ADAPS_RETURN_IF_ERROR(transport_->Start());
  ADAPS_ASSIGN_OR_RETURN(int peer, transport_->Connect(options_.scheduler));
  ADAPS_RET_CHECK(peer == kSchedulerPeer, absl::StatusCode::kInternal, "unexpected peer id");
  return Register();
}

absl::Status Worker::Impl::Register() {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto body = msg::CreateRegister(fbb, msg::Role::Worker, fbb.CreateString(""),
                                  fbb.CreateString(options_.identity));
  auto reply = Call(kSchedulerPeer, fbb, body, nullptr, options_.register_timeout);
  if (!reply.ok()) {
    if (reply.status().code() == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(absl::StrCat("scheduler at ", options_.scheduler,
                                                 " unreachable: ", reply.status().message()));
    }
    if (reply.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(
          absl::StrCat("no cluster view from the scheduler at ", options_.scheduler, " within ",
                       absl::FormatDuration(options_.register_timeout)));
    }
    return reply.status();
  }
  const msg::ClusterView* view = reply->envelope()->body_as_ClusterView();
  ADAPS_RET_CHECK(view != nullptr, absl::StatusCode::kDataLoss,
                  "scheduler answered Register with something else");
  rank_ = view->your_rank();
  num_workers_ = view->num_workers();
  num_servers_ = view->num_servers();
  heartbeat_interval_ms_ = std::max<uint32_t>(10, view->heartbeat_interval_ms());
  transport_->SetRank(rank_);
  log_.SetRank(rank_);
  ADAPS_RETURN_IF_ERROR(ConnectServers(*view));
  rejoined_ = view->rejoined();
  barrier_seq_ = view->next_barrier();
  if (rejoined_) {
    log_.get()->info("rejoined a running cluster at barrier {}", view->next_barrier());
  }
  {
    absl::MutexLock lock(&mu_);
    last_heartbeat_ok_ = absl::Now();
    epoch_ = view->epoch();
  }
  log_.get()->info("registered: worker {} of {}, {} servers", rank_, num_workers_, num_servers_);
  return absl::OkStatus();
}

absl::Status Worker::Impl::ConnectServers(const msg::ClusterView& view) {
  std::vector<std::string> addresses(num_servers_);
  if (view.nodes()) {
    for (const auto* n : *view.nodes()) {
      if (n->role() == msg::Role::Server && n->rank() >= 0 && n->rank() < num_servers_ &&
          n->address()) {
        addresses[n->rank()] = n->address()->str();
      }
    }
  }
  for (int s = 0; s < num_servers_; ++s) {
    ADAPS_RET_CHECK(!addresses[s].empty(), absl::StatusCode::kDataLoss,
                    absl::StrCat("cluster view without an address for server ", s));
    ADAPS_ASSIGN_OR_RETURN(int p, transport_->Connect(addresses[s]));
    absl::MutexLock lock(&mu_);
    server_peer_.push_back(p);
  }
  // The addresses belong to the I/O thread (OnView compares against them): hand them over.
  std::promise<void> handed;
  if (!transport_->Post([this, &addresses, &handed] {
        ADAPS_DCHECK_ON_IO_THREAD(transport_);
        server_address_ = addresses;
        handed.set_value();
      })) {
    return absl::FailedPreconditionError("transport stopped while registering");
  }
  handed.get_future().wait();
  return absl::OkStatus();
}

absl::Status Worker::Impl::CheckRunning() {
  absl::MutexLock lock(&mu_);
  if (stopped_) return absl::FailedPreconditionError("worker stopped");
  if (shutdown_) return shutdown_status_;
  return absl::OkStatus();
}

int Worker::Impl::ServerPeer(int server) const {
  absl::MutexLock lock(&mu_);
  return server_peer_[server];
}

absl::Status Worker::Impl::Stop() {
  bool leave = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return absl::OkStatus();
    stopped_ = true;
    leave = rank_ >= 0 && !shutdown_;
  }
  absl::Status status;
  if (leave) {
    flatbuffers::FlatBufferBuilder fbb(64);
    auto body = msg::CreateLeave(fbb);
    status = Call(kSchedulerPeer, fbb, body, nullptr, absl::Seconds(2)).status();
  }
  transport_->Stop();
  return status;
}

void Worker::Impl::Handle(InMessage in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Envelope* env = in.envelope();
  const bool scheduler_only =
      env->body_type() == msg::Body::Shutdown || env->body_type() == msg::Body::ClusterView;
  if (scheduler_only && in.peer() != kSchedulerPeer) {
    log_.get()->warn("ignored a {} that did not come from the scheduler",
                     msg::EnumNameBody(env->body_type()));
    return;
  }
  if (env->body_type() == msg::Body::Shutdown) {
    OnShutdown(*env->body_as_Shutdown());
    return;
  }
  if (env->body_type() == msg::Body::ClusterView) {
    OnView(env->body_as_ClusterView());
    return;
  }
  if (env->request_id()) {
    transport_->Reply(in, MakeError(transport_->self(), env->request_id(),
                                    absl::InvalidArgumentError("workers take no requests")));
  }
}

void Worker::Impl::OnShutdown(const msg::Shutdown& sd) {
  const std::string reason = sd.reason() ? sd.reason()->str() : "";
  log_.get()->info("the scheduler shut the cluster down: {}", reason);
  std::vector<int> peers;
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    const int code = sd.code();
    shutdown_status_ = code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                           ? absl::Status(static_cast<absl::StatusCode>(code),
                                          absl::StrCat("the cluster was stopped: ", reason))
                           : absl::FailedPreconditionError("the cluster has shut down");
    peers = server_peer_;
  }
  // Nothing in flight will be answered now: fail it at once with the reason.
  for (int peer : peers) {
    transport_->FailPeer(peer,
                         absl::AbortedError(absl::StrCat("the cluster was shut down: ", reason)));
  }
}

// A newer cluster view. Fails requests to servers declared dead, and reconnects to a server
// that came back at another address (restarted): requests still queued for the old address
// fail with kUnavailable, and every tensor resynchronizes its steps with the servers before
// its next operation.
void Worker::Impl::OnView(const msg::ClusterView* view) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  {
    absl::MutexLock lock(&mu_);
    if (view->epoch() < epoch_) return;
    epoch_ = view->epoch();
  }
  if (view->nodes() == nullptr) return;
  for (const auto* n : *view->nodes()) {
    if (n->role() != msg::Role::Server || n->rank() < 0 || n->rank() >= num_servers_) continue;
    const int r = n->rank();
    if (!n->alive()) {
      log_.get()->warn("server {} declared dead", r);
      transport_->FailPeer(ServerPeer(r),
                           absl::UnavailableError(absl::StrCat("server ", r, " declared dead")));
      continue;
    }
    const std::string address = n->address() ? n->address()->str() : "";
    if (address.empty() || static_cast<size_t>(r) >= server_address_.size() ||
        address == server_address_[r]) {
      continue;
    }
    auto peer = transport_->Connect(address);
    if (!peer.ok()) {
      log_.get()->error("server {} moved to {}: {}", r, address, peer.status().ToString());
      continue;
    }
    log_.get()->warn("server {} restarted at {}: reconnected", r, address);
    int old;
    {
      absl::MutexLock lock(&mu_);
      old = server_peer_[r];
      server_peer_[r] = *peer;
    }
    server_address_[r] = address;
    ++server_generation_;
    transport_->FailPeer(old, absl::UnavailableError(absl::StrCat("server ", r, " restarted")));
  }
}

// The scheduler does not know us (it restarted). Register again with our identity, rank
// and epoch; training goes on meanwhile on the view we have.
void Worker::Impl::Reregister() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (reregistering_) return;
  reregistering_ = true;
  log_.get()->warn("the scheduler does not know this worker: registering again as rank {}",
                   rank_);
  uint32_t epoch;
  {
    absl::MutexLock lock(&mu_);
    epoch = epoch_;
  }
  flatbuffers::FlatBufferBuilder fbb(256);
  auto body = msg::CreateRegister(fbb, msg::Role::Worker, fbb.CreateString(""),
                                  fbb.CreateString(options_.identity), rank_, epoch);
  const uint64_t id = transport_->NewRequestId();
  transport_->Request(kSchedulerPeer, id, FinishEnvelope(fbb, transport_->self(), body, id, 0),
                      absl::Now() + options_.register_timeout,
                      [this](absl::StatusOr<InMessage> reply) {
                        ADAPS_DCHECK_ON_IO_THREAD(transport_);
                        reregistering_ = false;
                        if (!reply.ok() ||
                            reply->envelope()->body_type() != msg::Body::ClusterView) {
                          return;
                        }
                        OnView(reply->envelope()->body_as_ClusterView());
                        log_.get()->info("registered again with the scheduler");
                      });
}

void Worker::Impl::Heartbeat() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (rank_ < 0) return;
  const absl::Time now = absl::Now();
  if (now - last_heartbeat_sent_ < absl::Milliseconds(heartbeat_interval_ms_)) return;
  last_heartbeat_sent_ = now;
  flatbuffers::FlatBufferBuilder fbb(64);
  auto body = msg::CreateHeartbeat(fbb, 0);
  const uint64_t id = transport_->NewRequestId();
  transport_->Request(kSchedulerPeer, id, FinishEnvelope(fbb, transport_->self(), body, id, 0),
                      now + absl::Milliseconds(2 * heartbeat_interval_ms_),
                      [this](absl::StatusOr<InMessage> reply) {
                        if (!reply.ok()) {
                          if (reply.status().code() == absl::StatusCode::kFailedPrecondition) {
                            Reregister();
                          }
                          return;
                        }
                        absl::MutexLock lock(&mu_);
                        last_heartbeat_ok_ = absl::Now();
                      });
}

}  // namespace adaps
