#include "scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/scheduler_metrics.h"

namespace adaps {
namespace {

// `bytes` random bytes from the OS (std::random_device), as lower-case hex.
std::string RandomHex(int bytes) {
  std::random_device rd;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < bytes; ++i) {
    const unsigned b = rd() & 0xff;
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

}  // namespace
}  // namespace adaps

namespace adaps {

absl::Status ValidateSchedulerConfig(const SchedulerConfig& c) {
  ADAPS_RET_CHECK(c.num_servers >= 1, absl::StatusCode::kInvalidArgument,
                  "num_servers must be at least 1");
  ADAPS_RET_CHECK(c.num_workers >= 1, absl::StatusCode::kInvalidArgument,
                  "num_workers must be at least 1");
  ADAPS_RET_CHECK(c.max_workers == 0 || c.max_workers >= c.num_workers,
                  absl::StatusCode::kInvalidArgument,
                  absl::StrCat("max_workers (", c.max_workers, ") must be 0 or at least "
                               "num_workers (", c.num_workers, ")"));
  ADAPS_RET_CHECK(c.heartbeat_interval > absl::ZeroDuration(),
                  absl::StatusCode::kInvalidArgument, "heartbeat interval must be positive");
  ADAPS_RET_CHECK(c.dead_timeout > c.heartbeat_interval, absl::StatusCode::kInvalidArgument,
                  "dead timeout must exceed the heartbeat interval");
  ADAPS_RET_CHECK(!c.bind.empty(), absl::StatusCode::kInvalidArgument, "empty bind address");
  return ValidateLogLevel(c.log_level);
}


Scheduler::Scheduler(SchedulerConfig config, std::shared_ptr<TransportContext> context,
                     Metrics* metrics)
    : config_(std::move(config)),
      job_id_(config_.job_id.empty() ? RandomHex(16) : config_.job_id),
      log_("scheduler", config_.log_level) {
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
  if (metrics->enabled()) {
    transport_->AddTimer(absl::Milliseconds(500),
                         [this] { metrics_->UpdateTransport(transport_->stats()); });
  }
  server_load_.assign(config_.num_servers, 0);
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

absl::Status Scheduler::exit_status() const {
  absl::MutexLock lock(&mu_);
  return exit_status_;
}

bool Scheduler::WaitForShutdown(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

void Scheduler::Stop() { transport_->Stop(); }

void Scheduler::Reject(const InMessage& in, const absl::Status& status, const char* reason) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  metrics_->Rejected(reason);
  transport_->Reply(in, MakeError(transport_->self(), in.envelope()->request_id(), status));
}

void Scheduler::UpdateNodeMetrics() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  for (msg::Role role : {msg::Role::Server, msg::Role::Worker}) {
    SchedulerMetrics::NodeCounts counts;
    for (const auto& n : nodes_) {
      if (n.role != role) continue;
      if (n.left) {
        ++counts.left;
      } else if (n.alive) {
        ++counts.live;
      } else {
        ++counts.dead;
      }
    }
    metrics_->SetNodes(role, counts);
  }
}

Scheduler::Node* Scheduler::FindNode(msg::Role role, int rank) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  for (auto& n : nodes_) {
    if (n.role == role && n.rank == rank && rank >= 0) return &n;
  }
  return nullptr;
}

Scheduler::Node* Scheduler::Authenticated(const InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  Node* node = FindNode(in.envelope()->sender_role(), in.envelope()->sender_rank());
  return node != nullptr && node->route == in.route() ? node : nullptr;
}

int Scheduler::AliveWorkers() const {
  int n = 0;
  for (const auto& node : nodes_) {
    n += node.role == msg::Role::Worker && node.alive && !node.left;
  }
  return n;
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
  const std::string optimizer = ServerOptimizerOf(*reg);
  if (absl::Status st = CheckServerOptimizer(optimizer, identity); !st.ok()) {
    return Reject(in, st, metric_labels::kReasonInvalid);
  }
  max_seen_epoch_ = std::max(max_seen_epoch_, reg->epoch());
  if (!identity.empty() && Rejoin(in, identity, address)) return;
  if (formed_) {
    if (reg->role() == msg::Role::Worker && Join(in, identity)) return;
    const bool elastic = config_.max_workers > config_.num_workers;
    return Reject(
        in,
        absl::FailedPreconditionError(
            reg->role() == msg::Role::Server
                ? std::string("cluster already complete (every server rank is taken)")
            : elastic ? absl::StrCat("cluster already complete: ", AliveWorkers(),
                                     " live workers, --max_workers=", config_.max_workers)
                      : absl::StrCat("cluster already complete: the job runs ",
                                     config_.num_workers,
                                     " workers (start the scheduler with --max_workers to let "
                                     "workers join a running job)")),
        metric_labels::kReasonClusterFull);
  }
  const int want =
      reg->role() == msg::Role::Server ? config_.num_servers : config_.num_workers;
  const int have = static_cast<int>(std::count_if(
      nodes_.begin(), nodes_.end(), [&](const Node& n) { return n.role == reg->role(); }));
  if (have >= want && reg->role() == msg::Role::Worker &&
      config_.num_workers + static_cast<int>(early_joiners_.size()) < config_.max_workers) {
    // Elastic: more workers than the job starts with came at once; they join once it forms.
    log_.get()->info("a worker beyond --num_workers={} registered before the job formed: it "
                     "joins once it has", config_.num_workers);
    early_joiners_.push_back(std::move(in));
    return;
  }
  if (have >= want) {
    return Reject(in,
                  absl::FailedPreconditionError(absl::StrCat(
                      "already have ", want, " ", msg::EnumNameRole(reg->role()), "s")),
                  metric_labels::kReasonClusterFull);
  }
  // Before the job forms no node has been told its rank: a node that claims the rank it had
  // before this scheduler started (a survivor of a scheduler restart) takes it from a fresh
  // node given it meanwhile (a server restarted at the same time), which moves to a free one.
  auto provisional = std::find_if(nodes_.begin(), nodes_.end(), [&](const Node& n) {
    return n.role == reg->role() && n.rank == reg->rank() && reg->rank() >= 0 && !n.rank_claimed;
  });
  const bool moves = provisional != nodes_.end();
  const size_t moved = moves ? provisional - nodes_.begin() : 0;
  if (moves) nodes_[moved].rank = -1;
  Node node;
  node.role = reg->role();
  node.rank = PickRank(reg->role(), reg->rank(), want);
  node.rank_claimed = reg->rank() >= 0 && node.rank == reg->rank();
  node.address = address;
  node.identity = identity;
  node.checkpoint_steps = StepList(reg->checkpoint_steps());
  node.optimizer = optimizer;
  if (node.role == msg::Role::Worker) node.secret = RandomHex(16);
  node.route = in.route();
  node.register_request = in.envelope()->request_id();
  node.last_seen = absl::Now();
  nodes_.push_back(node);
  if (moves) {
    Node& m = nodes_[moved];
    m.rank = PickRank(m.role, -1, want);
    log_.get()->info("{} {} claimed its rank back; the node registered before it at {} is {} {} "
                     "now", msg::EnumNameRole(node.role), node.rank, m.address,
                     msg::EnumNameRole(m.role), m.rank);
  }
  metrics_->Registered(node.role);
  UpdateNodeMetrics();
  log_.get()->info("{} {} registered{}{}", msg::EnumNameRole(node.role), node.rank,
                   address.empty() ? "" : " at ", address);
  if (static_cast<int>(nodes_.size()) == config_.num_servers + config_.num_workers) Form();
}

bool Scheduler::Rejoin(const InMessage& in, const std::string& identity,
                       const std::string& address) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Register* reg = in.envelope()->body_as_Register();
  for (auto& n : nodes_) {
    if (n.identity != identity || n.role != reg->role()) continue;
    // A restarted node with a known identity gets its old rank back.
    const bool moved = n.address != address;
    n.route = in.route();
    n.address = address;
    n.checkpoint_steps = StepList(reg->checkpoint_steps());
    if (std::string o = ServerOptimizerOf(*reg); !o.empty()) n.optimizer = std::move(o);
    n.register_request = in.envelope()->request_id();
    n.last_seen = absl::Now();
    // (One that had left, e.g. a script that stopped its worker as it failed, is announced
    // as one that died: the servers count it again only from the view that says it is back.)
    const bool was_dead = !n.alive || n.left;
    n.alive = true;
    n.left = false;
    metrics_->Registered(n.role);
    UpdateNodeMetrics();
    if (formed_) {
      log_.get()->info("{} '{}' re-registered with rank {}", msg::EnumNameRole(n.role),
                       identity, n.rank);
      if (was_dead || moved) {
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
  return false;
}

bool Scheduler::Join(const InMessage& in, const std::string& identity) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const int bound = std::max(config_.max_workers, config_.num_workers);
  if (AliveWorkers() >= bound) return false;
  const msg::Register* reg = in.envelope()->body_as_Register();
  Node node;
  node.role = msg::Role::Worker;
  node.rank = PickRank(msg::Role::Worker, reg->rank(), bound);
  node.identity = identity;
  node.secret = RandomHex(16);
  node.route = in.route();
  node.register_request = in.envelope()->request_id();
  node.last_seen = absl::Now();
  // The barriers the others wait at now complete without it; it meets them at the next.
  node.first_barrier = next_barrier_;
  if (!barriers_.empty()) {
    node.first_barrier = std::max(node.first_barrier, barriers_.rbegin()->first + 1);
  }
  node.barrier_seen = false;
  node.stepping = false;
  nodes_.push_back(node);
  metrics_->Registered(node.role);
  UpdateNodeMetrics();
  log_.get()->info("worker {} joined the running job ({} live workers, at most {})", node.rank,
                   AliveWorkers(), bound);
  // The servers learn its rank and secret from this view before it can reach them (and a
  // worker refused for a secret not seen yet asks again: worker/membership.cc).
  BroadcastView();
  SendView(nodes_.back(), node.register_request, /*rejoined=*/true);
  return true;
}

int Scheduler::WorkerRanks() const {
  int ranks = config_.num_workers;
  for (const auto& n : nodes_) {
    if (n.role == msg::Role::Worker) ranks = std::max(ranks, n.rank + 1);
  }
  return ranks;
}

int Scheduler::PickRank(msg::Role role, int claimed, int want) const {
  // A node re-registering with a restarted scheduler keeps the rank it had.
  if (claimed >= 0 && claimed < want &&
      std::none_of(nodes_.begin(), nodes_.end(), [&](const Node& n) {
        return n.role == role && n.rank == claimed;
      })) {
    return claimed;
  }
  std::set<int> taken;
  for (const auto& n : nodes_) {
    if (n.role == role) taken.insert(n.rank);
  }
  int rank = 0;
  while (taken.count(rank)) ++rank;
  return rank;
}

void Scheduler::Form() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  formed_ = true;
  metrics_->Formed();
  epoch_ = max_seen_epoch_ + 1;
  log_.get()->info("cluster complete: {} servers, {} workers", config_.num_servers,
                   config_.num_workers);
  const absl::Time now = absl::Now();
  for (auto& n : nodes_) {
    n.last_seen = now;
    SendView(n, n.register_request);
  }
  ReleaseBarriers();
  std::vector<InMessage> early = std::move(early_joiners_);
  early_joiners_.clear();
  for (InMessage& in : early) OnRegister(in);  // formed now: each joins (or is refused)
}

void Scheduler::SendView(const Node& node, uint64_t reply_to, bool rejoined) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  flatbuffers::FlatBufferBuilder fbb(1024);
  std::vector<flatbuffers::Offset<msg::NodeInfo>> infos;
  std::vector<flatbuffers::Offset<flatbuffers::String>> secrets;
  for (const auto& n : nodes_) {
    infos.push_back(msg::CreateNodeInfo(fbb, n.role, n.rank, fbb.CreateString(n.address),
                                        fbb.CreateString(n.identity), n.alive && !n.left,
                                        n.stepping, fbb.CreateString(n.optimizer)));
    if (node.role == msg::Role::Server && n.role == msg::Role::Worker) {
      secrets.push_back(fbb.CreateString(n.secret));
    }
  }
  auto secret = fbb.CreateString(node.role == msg::Role::Worker ? node.secret : "");
  auto worker_secrets = fbb.CreateVector(secrets);
  // A server restores the latest step checkpoint every server has: one step across shards.
  const uint64_t restore_step =
      node.role == msg::Role::Server ? RestoreStepFor(node, /*answering=*/reply_to != 0) : 0;
  auto body = msg::CreateClusterView(
      fbb, node.rank, config_.num_servers, WorkerRanks(), epoch_, fbb.CreateVector(infos),
      static_cast<uint32_t>(absl::ToInt64Milliseconds(config_.heartbeat_interval)), rejoined,
      std::max(next_barrier_, node.first_barrier), fbb.CreateString(job_id_), secret,
      worker_secrets, restore_step);
  transport_->SendRoute(node.route,
                        FinishEnvelope(fbb, transport_->self(), body, 0, reply_to));
  metrics_->ViewSent(epoch_);
}

void Scheduler::BroadcastViewSoon() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (view_broadcast_posted_) return;
  view_broadcast_posted_ = true;
  const bool posted = transport_->Post([this] {
    view_broadcast_posted_ = false;
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;  // the cluster was shut down meanwhile
    }
    if (AliveWorkers() > 0) BroadcastView();
  });
  if (!posted) view_broadcast_posted_ = false;  // stopping: nobody to tell
}

void Scheduler::BroadcastView() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  ++epoch_;
  for (const auto& n : nodes_) {
    if (n.alive && !n.left) SendView(n, 0);
  }
}

void Scheduler::OnHeartbeat(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Envelope* env = in.envelope();
  Node* claimed = FindNode(env->sender_role(), env->sender_rank());
  Node* node = Authenticated(in);
  if (claimed != nullptr && node == nullptr && !formed_ && !claimed->rank_claimed) {
    // A node that had this rank before this scheduler started, while a fresh node holds it
    // provisionally (nobody has been told a rank yet): its claim will win; register.
    Reject(in, absl::FailedPreconditionError("register again: ranks are settled when the job forms"),
           metric_labels::kReasonUnknownNode);
    return;
  }
  if (claimed != nullptr && node == nullptr) {
    // Someone else claims a registered node's rank: refuse, and keep the node's route.
    Reject(in,
           absl::PermissionDeniedError(absl::StrCat("heartbeat for ",
                                                    msg::EnumNameRole(claimed->role), " ",
                                                    claimed->rank, " from another connection")),
           metric_labels::kReasonForbidden);
    return;
  }
  if (node != nullptr && !node->alive && node->identity.empty()) {
    // It was declared dead and cannot take its rank back (no identity): tell it so.
    transport_->Reply(in, MakeError(transport_->self(), env->request_id(),
                                    absl::AbortedError(absl::StrCat(
                                        "this node was declared dead after ",
                                        absl::FormatDuration(config_.dead_timeout),
                                        " of silence; the cluster went on without it"))));
    return;
  }
  if (node == nullptr || !node->alive) {
    Reject(in, absl::FailedPreconditionError("unknown or dead node; register again"),
           metric_labels::kReasonUnknownNode);
    return;
  }
  node->last_seen = absl::Now();
  if (node->role == msg::Role::Server) {
    node->checkpoint_steps = StepList(env->body_as_Heartbeat()->checkpoint_steps());
  } else {
    const float norm = env->body_as_Heartbeat()->residue_norm();
    node->residue_norm = std::isfinite(norm) && norm >= 0 ? norm : -1.0f;
  }
  flatbuffers::FlatBufferBuilder fbb(64);
  auto body = msg::CreateHeartbeatAck(fbb, epoch_,
                                      node->role == msg::Role::Server ? CommonStep() : 0);
  transport_->Reply(in, FinishEnvelope(fbb, transport_->self(), body, 0, env->request_id()));
}

void Scheduler::CheckHeartbeats() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (!formed_) return;
  const absl::Time now = absl::Now();
  bool changed = false;
  for (auto& n : nodes_) {
    if (n.alive && !n.left && now - n.last_seen > config_.dead_timeout) {
      n.alive = false;
      changed = true;
      log_.get()->warn("{} {} silent for {}: declared dead", msg::EnumNameRole(n.role), n.rank,
                       absl::FormatDuration(now - n.last_seen));
      if (n.role == msg::Role::Worker && n.residue_norm >= 0) {
        // What its error feedback held back is gone with it (Worker::Leave would have sent it).
        log_.get()->warn("worker {} took residues of L2 norm {:.6g} with it (its last heartbeat)",
                         n.rank, n.residue_norm);
        metrics_->LostResidue(n.residue_norm);
        n.residue_norm = -1.0f;  // counted once, even if it comes back and dies again silent
      }
    }
  }
  if (changed) {
    UpdateNodeMetrics();
    // Fail policy: stop before telling anyone the worker is gone, so that no server
    // completes a step without it.
    if (config_.on_worker_death == SchedulerConfig::OnWorkerDeath::kFail) {
      for (const auto& n : nodes_) {
        if (n.role == msg::Role::Worker && !n.alive && !n.left) {
          ShutdownCluster(absl::StrCat("worker ", n.rank, " died (--on_worker_death=fail)"),
                          absl::StatusCode::kAborted);
          return;
        }
      }
    }
    BroadcastView();
    ReleaseBarriers();
    MaybeShutdown();
  }
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
  const std::string token = sd->token() ? sd->token()->str() : "";
  if (config_.admin_token.empty() || token != config_.admin_token) {
    const absl::Status refused = absl::PermissionDeniedError(
        config_.admin_token.empty()
            ? "this scheduler accepts no Shutdown requests (start it with --admin_token)"
            : "Shutdown refused: wrong or missing token");
    if (in.envelope()->request_id()) {
      Reject(in, refused, metric_labels::kReasonForbidden);
    } else {
      metrics_->Rejected(metric_labels::kReasonForbidden);
    }
    return;
  }
  if (in.envelope()->request_id()) {
    transport_->Reply(in, MakeAck(transport_->self(), in.envelope()->request_id()));
  }
  const std::string reason = sd->reason() ? sd->reason()->str() : "";
  const int code = sd->code();
  ShutdownCluster(
      absl::StrCat("an operator requested shutdown", reason.empty() ? "" : ": ", reason),
      code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
          ? static_cast<absl::StatusCode>(code)
          : absl::StatusCode::kOk);
}

void Scheduler::MaybeShutdown() {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (!formed_ || AliveWorkers() > 0) return;
  // Completed only if no node is still dead (one that came back with its identity is not).
  std::string dead;
  for (const auto& n : nodes_) {
    if (n.alive || n.left) continue;
    absl::StrAppend(&dead, dead.empty() ? "" : ", ", msg::EnumNameRole(n.role), " ", n.rank);
  }
  if (!dead.empty()) {
    return ShutdownCluster(
        absl::StrCat("every worker has left, but the job did not complete: ", dead,
                     " declared dead"),
        absl::StatusCode::kAborted);
  }
  ShutdownCluster("every worker has left");
}

void Scheduler::ShutdownCluster(const std::string& reason, absl::StatusCode code) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  {
    absl::MutexLock lock(&mu_);
    if (done_) return;
  }
  if (code == absl::StatusCode::kOk) {
    log_.get()->info("shutting down the cluster: {}", reason);
  } else {
    log_.get()->error("shutting down the cluster: {}", reason);
  }
  for (const auto& n : nodes_) {
    if (!n.alive) continue;
    flatbuffers::FlatBufferBuilder fbb(128);
    auto body = msg::CreateShutdown(fbb, fbb.CreateString(reason), static_cast<int>(code));
    transport_->SendRoute(n.route, FinishEnvelope(fbb, transport_->self(), body, 0, 0));
  }
  absl::MutexLock lock(&mu_);
  done_ = true;
  if (code != absl::StatusCode::kOk) exit_status_ = absl::Status(code, reason);
}

}  // namespace adaps
