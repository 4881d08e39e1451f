// The worker's membership in the cluster (worker/membership.h): registration, views,
// shutdowns, the requests every part of the worker makes, and stopping the transport.
#include "worker/membership.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace adaps {
namespace {

int LiveWorkersOf(const msg::ClusterView& view) {
  int live = 0;
  if (view.nodes() != nullptr) {
    for (const auto* n : *view.nodes()) live += n->role() == msg::Role::Worker && n->alive();
  }
  return live;
}

// The servers' common --optimizer ("" when one did not say); an error when two differ (the
// scheduler refuses such a server, so only a view from elsewhere can hold that).
absl::StatusOr<std::string> ServerOptimizerOf(const msg::ClusterView& view) {
  std::string kind;
  if (view.nodes() == nullptr) return kind;
  for (const auto* n : *view.nodes()) {
    if (n->role() != msg::Role::Server) continue;
    const std::string k = n->optimizer() ? n->optimizer()->str() : "";
    if (k.empty()) return std::string();
    if (!kind.empty() && k != kind) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job's servers run different optimizers (", kind, " and ", k,
          "): start every adaps-server with the same --optimizer"));
    }
    kind = k;
  }
  return kind;
}

}  // namespace

Membership::Membership(const WorkerOptions& options, RoleLog& log,
                       std::function<float()> residue_norm)
    : options_(options), log_(log) {
  TransportOptions topts;
  topts.self = Sender{msg::Role::Worker, -1};
  topts.context = options_.context;
  topts.log = &log_;
  topts.curve.server_public_key = options_.curve_server_public_key;
  topts.curve.client_public_key = options_.curve_public_key;
  topts.curve.client_secret_key = options_.curve_secret_key;
  transport_ = std::make_unique<Transport>(std::move(topts),
                                           [this](InMessage in) { Handle(std::move(in)); });
  ClusterClientOptions copts;
  copts.scheduler = options_.scheduler;
  copts.identity = options_.identity;
  copts.register_timeout = options_.register_timeout;
  copts.scheduler_grace = options_.scheduler_grace;
  copts.residue_norm = std::move(residue_norm);
  ClusterClient::Callbacks callbacks;
  callbacks.on_view = [this](const msg::ClusterView& view) { OnView(view); };
  callbacks.on_shutdown = [this](const absl::Status& status) { OnShutdown(status); };
  cluster_ = std::make_unique<ClusterClient>(*transport_, log_, copts, std::move(callbacks));
  links_ = std::make_unique<ServerLinks>(transport_.get(), &log_);
}

absl::Status Membership::Start() {
  ADAPS_RETURN_IF_ERROR(transport_->Start());
  ADAPS_ASSIGN_OR_RETURN(InMessage reply, cluster_->Register());
  return ApplyRegistration(*reply.envelope()->body_as_ClusterView());
}

absl::Status Membership::ApplyRegistration(const msg::ClusterView& view) {
  rank_ = view.your_rank();
  num_workers_ = view.num_workers();
  num_servers_ = view.num_servers();
  ADAPS_ASSIGN_OR_RETURN(server_optimizer_, ServerOptimizerOf(view));
  ADAPS_RETURN_IF_ERROR(links_->Connect(view, num_servers_));
  rejoined_ = view.rejoined();
  registered_at_ = absl::Now();
  live_workers_ = LiveWorkersOf(view);
  barrier_seq_ = view.next_barrier();
  if (rejoined_) {
    log_.get()->info("rejoined a running cluster at barrier {}", view.next_barrier());
  }
  log_.get()->info("registered: worker {} of {} live, {} servers", rank_, live_workers_.load(),
                   num_servers_);
  return absl::OkStatus();
}

absl::Status Membership::CheckRunning() const {
  absl::MutexLock lock(&mu_);
  if (stopped_) return absl::FailedPreconditionError("worker stopped");
  if (shutdown_) return shutdown_status_;
  return absl::OkStatus();
}

std::string Membership::Secret() const {
  absl::MutexLock lock(&mu_);
  return secret_;
}

bool Membership::BeginStop(bool* leave) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return false;
    stopped_ = true;
    *leave = rank_ >= 0 && !shutdown_;
  }
  links_->Close();  // a retry waiting for a server gives up
  return true;
}

absl::Status Membership::Leave() {
  // As long as any request may take: a scheduler busy with many workers leaving at once on
  // a loaded machine answered 64 of them past a fixed 2 s, failing the job after
  // its training had finished.
  absl::Status status = cluster_->Leave(options_.request_timeout);
  if (!status.ok()) {
    status = absl::Status(status.code(),
                          absl::StrCat("leaving the cluster (the scheduler finds a worker that "
                                       "did not say goodbye by its silence): ",
                                       status.message()));
  }
  return status;
}

void Membership::StopTransport() { transport_->Stop(); }

absl::Status Membership::Barrier() {
  ADAPS_RETURN_IF_ERROR(CheckRunning());
  flatbuffers::FlatBufferBuilder fbb(64);
  auto body = msg::CreateBarrier(fbb, barrier_seq_.fetch_add(1));
  // A barrier waits for the slowest worker, not for one answer: as long as joining may take
  // (64 processes starting on 2 cores kept some workers' barrier past 30 s).
  const absl::Duration deadline = std::max(options_.request_timeout, options_.register_timeout);
  absl::Status st = Call(cluster_->scheduler_peer(), fbb, body, nullptr, deadline).status();
  if (!st.ok()) {
    st = absl::Status(st.code(), absl::StrCat("barrier (every worker must reach it within ",
                                              absl::FormatDuration(deadline), "): ", st.message()));
  }
  return st;
}

void Membership::Handle(InMessage in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (cluster_->Handle(in)) return;  // views and shutdowns (forged ones refused there)
  const msg::Envelope* env = in.envelope();
  if (env->request_id()) {
    transport_->Reply(in, MakeError(transport_->self(), env->request_id(),
                                    absl::InvalidArgumentError("workers take no requests")));
  }
}

// The scheduler ended the job (OK: a clean end), or was silent past the grace period.
void Membership::OnShutdown(const absl::Status& status) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const std::string why = status.ok() ? "the cluster has shut down" : std::string(status.message());
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    shutdown_status_ = status.ok() ? absl::FailedPreconditionError(why) : status;
  }
  links_->Close();
  const std::vector<int> peers = links_->Peers();
  // Nothing in flight will be answered now: fail it at once with the reason.
  const absl::StatusCode code = status.code() == absl::StatusCode::kUnavailable
                                    ? absl::StatusCode::kUnavailable
                                    : absl::StatusCode::kAborted;
  for (int peer : peers) {
    transport_->FailPeer(peer, absl::Status(code, absl::StrCat("the cluster was shut down: ", why)));
  }
}

// A newer cluster view. Fails requests to servers declared dead, and reconnects to a server
// that came back (restarted: at another address, or after being declared dead): requests
// still queued for the old incarnation fail with kUnavailable, the server's incarnation is
// bumped, and run.cc resends what was in flight and resynchronizes stale slices.
void Membership::OnView(const msg::ClusterView& view) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (view.secret() != nullptr && view.secret()->size() > 0) {
    absl::MutexLock lock(&mu_);
    secret_ = view.secret()->str();  // a restarted scheduler hands out new ones
  }
  if (view.nodes() == nullptr) return;
  live_workers_ = LiveWorkersOf(view);
  links_->ApplyView(view);
}

}  // namespace adaps
