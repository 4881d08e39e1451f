#include "scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/scheduler_metrics.h"

namespace adaps {

Scheduler::Scheduler(SchedulerConfig config, std::shared_ptr<TransportContext> context,
                     Metrics* metrics)
    : config_(std::move(config)),
      job_id_(config_.job_id.empty() ? RandomHex(16) : config_.job_id),
      log_("scheduler", config_.log_level),
      roster_(config_.num_servers, config_.num_workers, config_.max_workers,
              config_.dead_timeout, config_.reform_timeout),
      layouts_(config_.num_servers, config_.split_threshold),
      restore_step_(config_.num_servers, roster_, log_),
      server_optimizer_(roster_),
      job_end_(config_.admin_token) {
  log_.SetRank(0);
  if (metrics == nullptr) {
    own_metrics_ = Metrics::Disabled();
    metrics = own_metrics_.get();
  }
  metrics_ = std::make_unique<SchedulerMetrics>(*metrics, config_.num_servers,
                                                config_.num_workers);
  TransportOptions topts;
  topts.self = Sender{msg::Role::Scheduler, 0};
  topts.bind_endpoint = config_.bind;
  topts.context = std::move(context);
  topts.log = &log_;
  // Every message a scheduler receives is a small header; nothing legitimate comes near this.
  topts.max_message_bytes = 1 << 20;
  topts.curve = config_.curve;
  transport_ = std::make_unique<Transport>(std::move(topts),
                                           [this](InMessage in) { Handle(std::move(in)); });
  transport_->AddTimer(config_.heartbeat_interval / 2, [this] { CheckHeartbeats(); });
  transport_->AddTimer(absl::Milliseconds(50), [this] { FlushLeaveView(); });
  if (metrics->enabled()) {
    transport_->AddTimer(absl::Milliseconds(500),
                         [this] { metrics_->UpdateTransport(transport_->stats()); });
  }
}

Scheduler::~Scheduler() { Stop(); }

absl::Status Scheduler::Start() {
  ADAPS_RETURN_IF_ERROR(ValidateSchedulerConfig(config_));
  ADAPS_RETURN_IF_ERROR(transport_->Start());
  log_.get()->info("listening on {} for {} servers and {} workers{}, job {}",
                   transport_->bound_endpoint(), config_.num_servers, config_.num_workers,
                   config_.max_workers > config_.num_workers
                       ? absl::StrCat(" (up to ", config_.max_workers, " may join)")
                       : std::string(),
                   job_id_);
  return absl::OkStatus();
}

std::string Scheduler::endpoint() const { return transport_->bound_endpoint(); }

absl::Status Scheduler::exit_status() const { return job_end_.exit_status(); }

bool Scheduler::WaitForShutdown(absl::Duration timeout) { return job_end_.Wait(timeout); }

void Scheduler::Stop() { transport_->Stop(); }

void Scheduler::Reject(const InMessage& in, const absl::Status& status, const char* reason) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  metrics_->Rejected(reason);
  transport_->Reply(in, MakeError(transport_->self(), in.envelope()->request_id(), status));
}

void Scheduler::UpdateNodeMetrics() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  for (msg::Role role : {msg::Role::Server, msg::Role::Worker}) {
    metrics_->SetNodes(role, roster_.Counts(role));
  }
}

Scheduler::Node* Scheduler::Authenticated(const InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  return roster_.Authenticated(in.envelope()->sender_role(), in.envelope()->sender_rank(),
                               in.route());
}

void Scheduler::Handle(InMessage in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Envelope* env = in.envelope();
  switch (env->body_type()) {
    case msg::Body::Register:
      OnRegister(in);
      break;
    case msg::Body::Heartbeat:
      OnHeartbeat(in);
      break;
    case msg::Body::Barrier:
      OnBarrier(in);
      break;
    case msg::Body::DeclareTensor:
      OnDeclare(in);
      break;
    case msg::Body::Leave:
      OnLeave(in);
      break;
    case msg::Body::Shutdown:
      OnShutdownRequest(in);
      break;
    default:
      if (env->request_id() == 0) {
        metrics_->Rejected(metric_labels::kReasonUnsupported);
        break;
      }
      Reject(in,
             absl::InvalidArgumentError(
                 absl::StrCat("scheduler does not handle ", msg::EnumNameBody(env->body_type()))),
             metric_labels::kReasonUnsupported);
  }
}

void Scheduler::OnRegister(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Register* reg = in.envelope()->body_as_Register();
  if (reg->role() != msg::Role::Server && reg->role() != msg::Role::Worker) {
    return Reject(in, absl::InvalidArgumentError("only servers and workers register"),
                  metric_labels::kReasonInvalid);
  }
  const std::string identity = reg->identity() ? reg->identity()->str() : "";
  const std::string address = reg->address() ? reg->address()->str() : "";
  if (reg->role() == msg::Role::Server && address.empty()) {
    return Reject(in, absl::InvalidArgumentError("a server must register its address"),
                  metric_labels::kReasonInvalid);
  }
  const std::string optimizer = ServerOptimizerRule::Of(*reg);
  if (absl::Status st = server_optimizer_.Check(optimizer, identity); !st.ok()) {
    return Reject(in, st, metric_labels::kReasonInvalid);
  }
  max_seen_epoch_ = std::max(max_seen_epoch_, reg->epoch());
  // A node that had a view from an earlier scheduler re-forms the job. A first registration
  // that claims a rank (a server restarted from its checkpoint directory) is a fresh process:
  // the job may be new (the file is of an earlier one), so it starts no reform deadline.
  if (reg->epoch() > 0) roster_.NoteReformingNode(absl::Now());
  Node fresh;
  fresh.role = reg->role();
  fresh.address = address;
  fresh.identity = identity;
  fresh.route = in.route();
  fresh.register_request = in.envelope()->request_id();
  fresh.last_seen = absl::Now();
  fresh.checkpoint_steps = RestoreStep::StepList(reg->checkpoint_steps());
  fresh.optimizer = optimizer;
  fresh.instance = reg->instance();
  if (Node* again = roster_.RegisteredBeforeForming(fresh.role, fresh.route)) {
    // Its first Register was answered by nobody (the node's connection closed and it asked
    // again): the same node, not another one. It gets the view at forming on this request.
    again->register_request = fresh.register_request;
    again->last_seen = fresh.last_seen;
    log_.get()->info("{} {} registered again on the same connection", msg::EnumNameRole(again->role),
                     again->rank);
    return;
  }
  if (!identity.empty() && Rejoin(in, fresh)) return;
  const Roster::Admission added =
      roster_.Admit(std::move(fresh), reg->rank(), barriers_.FirstForJoiner());
  using Outcome = Roster::Admission::Outcome;
  if (added.outcome == Outcome::kRefused) {
    return Reject(in, added.refusal, metric_labels::kReasonClusterFull);
  }
  if (added.outcome == Outcome::kHeld) {
    log_.get()->info("a worker beyond --num_workers={} registered before the job formed: it "
                     "joins once it has", config_.num_workers);
    early_joiners_.push_back(std::move(in));
    return;
  }
  Node& node = *added.node;
  metrics_->Registered(node.role);
  UpdateNodeMetrics();
  if (added.outcome == Outcome::kJoined) {
    log_.get()->info("worker {} joined the running job ({} live workers, at most {})",
                     node.rank, roster_.AliveWorkers(),
                     std::max(config_.max_workers, config_.num_workers));
    // The servers learn its rank and secret from this view before it can reach them (and a
    // worker refused for a secret not seen yet asks again: worker/membership.cc).
    BroadcastView();
    return SendView(node, node.register_request, /*rejoined=*/true);
  }
  if (added.moved != nullptr) {
    log_.get()->info("{} {} claimed its rank back; the node registered before it at {} is {} {} "
                     "now", msg::EnumNameRole(node.role), node.rank, added.moved->address,
                     msg::EnumNameRole(added.moved->role), added.moved->rank);
  }
  log_.get()->info("{} {} registered{}{}", msg::EnumNameRole(node.role), node.rank,
                   address.empty() ? "" : " at ", address);
  if (roster_.complete()) Form();
}

bool Scheduler::Rejoin(const InMessage& in, const Node& fresh) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const Roster::Rejoined r = roster_.Rejoin(fresh);
  if (r.node == nullptr) return false;
  Node& n = *r.node;
  metrics_->Registered(n.role);
  UpdateNodeMetrics();
  if (roster_.formed()) {
    log_.get()->info("{} '{}' re-registered with rank {}", msg::EnumNameRole(n.role),
                     n.identity, n.rank);
    if (r.was_dead || r.moved) {
      BroadcastView();  // includes n, but as an unsolicited view: answer it too
    } else if (n.role == msg::Role::Server) {
      // Restarted at the same address: workers cannot tell by the address. Show it
      // dead, then alive, so they fail what the old process held and resynchronize.
      n.alive = false;
      BroadcastView();
      n.alive = true;
      BroadcastView();
    }
    SendView(n, in.envelope()->request_id(), /*rejoined=*/true);
  }
  return true;
}

void Scheduler::Form() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  roster_.Form(absl::Now());
  metrics_->Formed();
  epoch_ = max_seen_epoch_ + 1;
  log_.get()->info("cluster complete: {} servers, {} workers", config_.num_servers,
                   config_.num_workers);
  for (auto& n : roster_.nodes()) SendView(n, n.register_request);
  ReleaseBarriers();
  std::vector<InMessage> early = std::move(early_joiners_);
  early_joiners_.clear();
  for (InMessage& in : early) OnRegister(in);  // formed now: each joins (or is refused)
}

void Scheduler::SendView(Node& node, uint64_t reply_to, bool rejoined) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  flatbuffers::FlatBufferBuilder fbb(1024);
  std::vector<flatbuffers::Offset<msg::NodeInfo>> infos;
  std::vector<flatbuffers::Offset<flatbuffers::String>> secrets;
  for (const auto& n : roster_.nodes()) {
    infos.push_back(msg::CreateNodeInfo(fbb, n.role, n.rank, fbb.CreateString(n.address),
                                        fbb.CreateString(n.identity), n.alive && !n.left,
                                        n.stepping, fbb.CreateString(n.optimizer),
                                        n.instance));
    if (node.role == msg::Role::Server && n.role == msg::Role::Worker) {
      secrets.push_back(fbb.CreateString(n.secret));
    }
  }
  auto secret = fbb.CreateString(node.role == msg::Role::Worker ? node.secret : "");
  auto worker_secrets = fbb.CreateVector(secrets);
  // A server restores the latest step checkpoint every server has: one step across shards.
  const uint64_t restore_step =
      node.role == msg::Role::Server ? restore_step_.For(node, /*answering=*/reply_to != 0) : 0;
  auto body = msg::CreateClusterView(
      fbb, node.rank, config_.num_servers, roster_.WorkerRanks(), epoch_, fbb.CreateVector(infos),
      static_cast<uint32_t>(absl::ToInt64Milliseconds(config_.heartbeat_interval)), rejoined,
      std::max(barriers_.next(), node.first_barrier), fbb.CreateString(job_id_), secret,
      worker_secrets, restore_step);
  transport_->SendRoute(node.route,
                        FinishEnvelope(fbb, transport_->self(), body, 0, reply_to));
  metrics_->ViewSent(epoch_);
}

void Scheduler::BroadcastViewSoon() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (leave_view_due_ != absl::InfiniteFuture()) return;  // goes with the one pending
  leave_view_due_ = std::max(absl::Now(), last_view_ + config_.leave_view_window);
  if (leave_view_due_ <= absl::Now()) {
    // (At once, but after the message being handled, as the view it answers.)
    if (!transport_->Post([this] { FlushLeaveView(); })) leave_view_due_ = absl::InfiniteFuture();
  }
}

void Scheduler::FlushLeaveView() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (leave_view_due_ == absl::InfiniteFuture() || absl::Now() < leave_view_due_) return;
  leave_view_due_ = absl::InfiniteFuture();
  if (job_end_.ended()) return;  // the cluster was shut down meanwhile
  if (roster_.AliveWorkers() > 0) BroadcastView();
}

void Scheduler::BroadcastView() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  ++epoch_;
  last_view_ = absl::Now();
  leave_view_due_ = absl::InfiniteFuture();  // (this view tells every goodbye so far)
  for (auto& n : roster_.nodes()) {
    if (n.alive && !n.left) SendView(n, 0);
  }
}

void Scheduler::OnHeartbeat(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Envelope* env = in.envelope();
  const absl::StatusOr<Node*> from =
      roster_.FromHeartbeat(env->sender_role(), env->sender_rank(), in.route());
  if (from.status().code() == absl::StatusCode::kAborted) {
    // Declared dead for good: told so, not counted as a rejected message.
    transport_->Reply(in, MakeError(transport_->self(), env->request_id(), from.status()));
    return;
  }
  if (!from.ok()) {
    return Reject(in, from.status(),
                  from.status().code() == absl::StatusCode::kPermissionDenied
                      ? metric_labels::kReasonForbidden
                      : metric_labels::kReasonUnknownNode);
  }
  Node* node = *from;
  node->last_seen = absl::Now();
  if (node->role == msg::Role::Server) {
    node->checkpoint_steps = RestoreStep::StepList(env->body_as_Heartbeat()->checkpoint_steps());
  } else {
    const float norm = env->body_as_Heartbeat()->residue_norm();
    node->residue_norm = std::isfinite(norm) && norm >= 0 ? norm : -1.0f;
  }
  flatbuffers::FlatBufferBuilder fbb(64);
  auto body = msg::CreateHeartbeatAck(fbb, epoch_,
                                      node->role == msg::Role::Server ? restore_step_.Common() : 0);
  transport_->Reply(in, FinishEnvelope(fbb, transport_->self(), body, 0, env->request_id()));
}

void Scheduler::CheckHeartbeats() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const absl::Time now = absl::Now();
  if (!roster_.formed()) {
    // A restarted scheduler waits for every node it had, but not for ever.
    const absl::Status late = roster_.Reforming(now);
    if (!late.ok()) ShutdownCluster({std::string(late.message()), late.code()});
    return;
  }
  const std::vector<Node*> dead = roster_.DeclareSilentDead(now);
  for (Node* n : dead) {
    log_.get()->warn("{} {} silent for {}: declared dead", msg::EnumNameRole(n->role), n->rank,
                     absl::FormatDuration(now - n->last_seen));
    if (n->role == msg::Role::Worker && n->residue_norm >= 0) {
      // What its error feedback held back is gone with it (Worker::Leave would have sent it).
      log_.get()->warn("worker {} took residues of L2 norm {:.6g} with it (its last heartbeat)",
                       n->rank, n->residue_norm);
      metrics_->LostResidue(n->residue_norm);
      n->residue_norm = -1.0f;  // counted once, even if it comes back and dies again silent
    }
  }
  if (dead.empty()) return;
  UpdateNodeMetrics();
  // Fail policy: stop before telling anyone the worker is gone, so that no server completes
  // a step without it.
  if (config_.on_worker_death == SchedulerConfig::OnWorkerDeath::kFail) {
    if (const Node* w = roster_.DeadWorker(); w != nullptr) {
      ShutdownCluster({absl::StrCat("worker ", w->rank, " died (--on_worker_death=fail)"),
                       absl::StatusCode::kAborted});
      return;
    }
  }
  BroadcastView();
  ReleaseBarriers();
  MaybeShutdown();
}

void Scheduler::OnBarrier(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Envelope* env = in.envelope();
  Node* node = env->sender_role() == msg::Role::Worker ? Authenticated(in) : nullptr;
  if (node == nullptr) {
    Reject(in, absl::FailedPreconditionError("barrier: not a known worker"),
           metric_labels::kReasonUnknownNode);
    return;
  }
  node->barrier_seen = true;
  barriers_.Arrive(env->body_as_Barrier()->seq(),
                   Barriers::Waiter{in.route(), env->request_id(), env->sender_rank()});
  ReleaseBarriers();
}

void Scheduler::ReleaseBarriers() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (!roster_.formed()) return;  // a restarted scheduler waits until every node is back
  for (const Barriers::Waiter& w : barriers_.Release(roster_.nodes())) {
    transport_->SendRoute(w.route, MakeAck(transport_->self(), w.request_id));
  }
}

void Scheduler::OnDeclare(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Envelope* env = in.envelope();
  const msg::DeclareTensor* d = env->body_as_DeclareTensor();
  auto fail = [&](absl::Status s) {
    Reject(in, s, s.code() == absl::StatusCode::kFailedPrecondition
                      ? metric_labels::kReasonNotFormed
                      : metric_labels::kReasonInvalid);
  };
  if (!roster_.formed()) return fail(absl::FailedPreconditionError("cluster not complete yet"));
  if (d->name() == nullptr || d->name()->size() == 0) {
    return fail(absl::InvalidArgumentError("tensor name is empty"));
  }
  // A stranger declaring a tensor first (with another length) would break the real one.
  Node* sender = env->sender_role() == msg::Role::Worker ? Authenticated(in) : nullptr;
  if (sender == nullptr) {
    return Reject(in, absl::PermissionDeniedError("tensors are declared only by the job's workers"),
                  metric_labels::kReasonForbidden);
  }
  // A joiner takes part in the steps from its first declaration (the servers count it from
  // its declaration to them; a server restarted later, from its first view).
  sender->stepping = true;
  const std::string name = d->name()->str();
  bool created = false;
  auto layout = layouts_.Declare(name, d->length(), d->bin_size(), &created);
  if (!layout.ok()) return fail(layout.status());
  if (created) {
    log_.get()->info("tensor '{}' ({} elements, bin {}) -> {} slice(s)", name, d->length(),
                     d->bin_size(), (*layout)->slices.size());
  }
  flatbuffers::FlatBufferBuilder fbb(256);
  std::vector<msg::Slice> slices;
  for (const auto& s : (*layout)->slices) slices.emplace_back(s.offset, s.length, s.server);
  auto body = msg::CreateTensorLayout(fbb, (*layout)->tensor_id, fbb.CreateString(name),
                                      (*layout)->length, (*layout)->bin_size,
                                      fbb.CreateVectorOfStructs(slices));
  transport_->Reply(in, FinishEnvelope(fbb, transport_->self(), body, 0, env->request_id()));
}

void Scheduler::OnLeave(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Envelope* env = in.envelope();
  Node* node = Authenticated(in);
  if (node == nullptr) {
    // Only a node itself may leave: a forged Leave could otherwise end the job.
    if (env->request_id()) {
      Reject(in, absl::PermissionDeniedError("Leave is accepted only from the node itself"),
             metric_labels::kReasonForbidden);
    } else {
      metrics_->Rejected(metric_labels::kReasonForbidden);
    }
    return;
  }
  node->left = true;
  UpdateNodeMetrics();
  log_.get()->info("{} {} left", msg::EnumNameRole(node->role), node->rank);
  if (env->request_id()) transport_->Reply(in, MakeAck(transport_->self(), env->request_id()));
  // Servers stop waiting for a worker that left (sync mode).
  BroadcastViewSoon();
  ReleaseBarriers();
  MaybeShutdown();
}

void Scheduler::OnShutdownRequest(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Shutdown* sd = in.envelope()->body_as_Shutdown();
  const uint64_t request = in.envelope()->request_id();
  if (absl::Status st = job_end_.CheckOperator(sd->token() ? sd->token()->str() : "");
      !st.ok()) {
    if (request) return Reject(in, st, metric_labels::kReasonForbidden);
    return metrics_->Rejected(metric_labels::kReasonForbidden);
  }
  if (request) transport_->Reply(in, MakeAck(transport_->self(), request));
  ShutdownCluster(
      JobEnd::OperatorRequested(sd->reason() ? sd->reason()->str() : "", sd->code()));
}

void Scheduler::MaybeShutdown() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (auto end = JobEnd::WhenNoWorkerIsLive(roster_)) ShutdownCluster(*end);
}

void Scheduler::ShutdownCluster(const JobEnd::Reason& end) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (job_end_.ended()) return;
  if (end.code == absl::StatusCode::kOk) {
    log_.get()->info("shutting down the cluster: {}", end.text);
  } else {
    log_.get()->error("shutting down the cluster: {}", end.text);
  }
  for (const auto& n : roster_.nodes()) {
    if (!n.alive) continue;
    flatbuffers::FlatBufferBuilder fbb(128);
    auto body = msg::CreateShutdown(fbb, fbb.CreateString(end.text), static_cast<int>(end.code));
    transport_->SendRoute(n.route, FinishEnvelope(fbb, transport_->self(), body, 0, 0));
  }
  job_end_.End(end);
}

}  // namespace adaps
