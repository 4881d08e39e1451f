#include "server/server.h"

#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"

namespace adaps {

absl::Status ValidateServerConfig(const ServerConfig& c) {
  ADAPS_RET_CHECK(!c.scheduler.empty(), absl::StatusCode::kInvalidArgument,
                  "no scheduler address");
  ADAPS_RET_CHECK(!c.bind.empty(), absl::StatusCode::kInvalidArgument, "empty bind address");
  ADAPS_RET_CHECK(c.register_timeout > absl::ZeroDuration(), absl::StatusCode::kInvalidArgument,
                  "register timeout must be positive");
  ADAPS_RET_CHECK(c.scheduler_grace > absl::ZeroDuration(), absl::StatusCode::kInvalidArgument,
                  "scheduler grace must be positive");
  ADAPS_RET_CHECK(c.engine_threads >= 0 && c.engine_threads <= 1024,
                  absl::StatusCode::kInvalidArgument, "engine threads must be in [0, 1024]");
  ADAPS_RET_CHECK(c.backup_workers >= 0, absl::StatusCode::kInvalidArgument,
                  "--backup_workers must be >= 0");
  if (c.backup_workers > 0) {
    ADAPS_RET_CHECK(c.sync, absl::StatusCode::kInvalidArgument,
                    "--backup_workers is for sync mode (async servers wait for nobody)");
    ADAPS_RET_CHECK(c.optimizer.kind != OptimizerKind::kMean,
                    absl::StatusCode::kInvalidArgument,
                    "--backup_workers does not work with --optimizer=mean (local mode): every "
                    "worker must apply every step's mean, so no step may complete without one");
  }
  OptimizerConfig probe = c.optimizer;
  ADAPS_RETURN_IF_ERROR(SetHyperParam(probe, "learning_rate", c.optimizer.learning_rate));
  ADAPS_RETURN_IF_ERROR(SetHyperParam(probe, "momentum", c.optimizer.momentum));
  ADAPS_RETURN_IF_ERROR(SetHyperParam(probe, "beta1", c.optimizer.beta1));
  ADAPS_RETURN_IF_ERROR(SetHyperParam(probe, "beta2", c.optimizer.beta2));
  ADAPS_RETURN_IF_ERROR(SetHyperParam(probe, "epsilon", c.optimizer.epsilon));
  ADAPS_RETURN_IF_ERROR(SetHyperParam(probe, "weight_decay", c.optimizer.weight_decay));
  return ValidateLogLevel(c.log_level);
}

void TransportSink::Send(const std::string& route, int peer, OutMessage message) {
  if (peer >= 0) {
    transport_->Send(peer, std::move(message));
  } else {
    transport_->SendRoute(route, std::move(message));
  }
}

Server::Server(ServerConfig config, std::shared_ptr<TransportContext> context, Metrics* metrics)
    : config_(std::move(config)),
      log_("server", config_.log_level),
      optimizer_(config_.optimizer),
      memory_budget_(config_.max_memory > 0
                         ? config_.max_memory
                         : uint64_t{static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES))} *
                               static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) / 2) {
  if (metrics == nullptr) own_metrics_ = Metrics::Disabled();
  metrics_ = std::make_unique<ServerMetrics>(metrics != nullptr ? *metrics : *own_metrics_);
  TransportOptions topts;
  topts.self = Sender{msg::Role::Server, -1};
  topts.bind_endpoint = config_.bind;
  topts.context = std::move(context);
  topts.log = &log_;
  topts.curve = config_.curve;
  transport_ = std::make_unique<Transport>(std::move(topts),
                                           [this](InMessage in) { Handle(std::move(in)); });
  ClusterClientOptions copts;
  copts.scheduler = config_.scheduler;
  copts.identity = config_.identity;
  copts.optimizer = std::string(OptimizerKindName(config_.optimizer.kind));
  copts.register_timeout = config_.register_timeout;
  copts.scheduler_grace = config_.scheduler_grace;
  CheckpointPolicyOptions popts;
  popts.dir = config_.checkpoint_dir;
  popts.interval = config_.checkpoint_interval;
  popts.every_steps = config_.checkpoint_every_steps;
  popts.restore = config_.restore;
  popts.restore_from = config_.restore_from;
  popts.identity = config_.identity;
  checkpoints_ = std::make_unique<CheckpointPolicy>(
      std::move(popts), [this] { return transport_->rank(); }, log_, metrics_.get(),
      [this](std::shared_ptr<CheckpointJob> job) { engine_->Snapshot(std::move(job)); });
  copts.claim_rank = checkpoints_->RememberedRank();
  if (checkpoints_->step_checkpoints()) {
    copts.checkpoint_steps = [this] { return checkpoints_->StepCheckpoints(); };
    copts.on_common_step = [this](uint64_t step) { checkpoints_->SetCommonStep(step); };
  }
  ClusterClient::Callbacks callbacks;
  callbacks.on_view = [this](const msg::ClusterView& view) { OnView(view); };
  callbacks.on_shutdown = [this](const absl::Status& status) { Finish(status); };
  cluster_ = std::make_unique<ClusterClient>(*transport_, log_, copts, std::move(callbacks));
  transport_->AddTimer(absl::Milliseconds(100), [this] {
    if (transport_->rank() < 0) return;  // not registered yet
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;
    }
    checkpoints_->Tick(absl::Now(), job_id_);
  });
  if (metrics_->enabled()) {
    transport_->AddTimer(absl::Milliseconds(500), [this] { metrics_->Tick(transport_->stats()); });
  }
  sink_ = std::make_unique<TransportSink>(transport_.get());
  EngineOptions eopts;
  eopts.threads = DefaultEngineThreads(config_.engine_threads);
  eopts.sync = config_.sync;
  eopts.optimizer = config_.optimizer;
  eopts.max_slice_elements = config_.max_slice_elements;
  eopts.backup_workers = config_.backup_workers;
  eopts.metrics = metrics_.get();
  if (!config_.checkpoint_dir.empty()) eopts.checkpoint_every_steps = config_.checkpoint_every_steps;
  eopts.checkpoints = checkpoints_->reports();
  eopts.log = &log_;
  engine_ = std::make_unique<Engine>(eopts, sink_.get());
  // Running before Start: a restore at registration hands its slices to it.
  checkpoints_->Start();
  engine_->Start();
}

Server::~Server() { Stop(); }

// Membership: common/cluster_client registers, heartbeats, re-registers with a restarted
// scheduler and refuses forged views and shutdowns; the server keeps only what the views
// mean for its shards (the live workers) and how it ends.
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
    auto install = [this](std::vector<SliceRecord> records, const HyperValues& hyper) {
      return InstallSlices(std::move(records), hyper);
    };
    checkpoints_->RememberRank(transport_->rank());
    ADAPS_RETURN_IF_ERROR(checkpoints_->RestoreAtStart(job_id_, restore_step_, install));
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
  transport_->Stop();     // nothing is routed to the engine any more
  engine_->Stop();        // drains what is queued and joins (idempotent)
  checkpoints_->Stop();   // writes what the engine handed on, joins
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
  if (!checkpoints_->enabled() || !serving_) return done(std::move(status));
  // A final checkpoint, durable before the server says it is done: a later run of this job
  // (--job_id) resumes from the end.
  checkpoints_->Write(job_id_, [this, done](absl::Status st) {
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


std::string Server::endpoint() const { return transport_->bound_endpoint(); }

void Server::ReplyError(const InMessage& in, const absl::Status& status) {
  metrics_->Rejected(status);
  if (in.envelope()->request_id() == 0) return;
  transport_->Reply(in, MakeError(transport_->self(), in.envelope()->request_id(), status));
}

absl::Status Server::CheckWorkerSecret(const flatbuffers::String* secret,
                                       const char* what) const {
  if (secret != nullptr && secret->size() > 0 && worker_secrets_.count(secret->str())) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat(what, " refused: not from a worker of this job (no valid secret)"));
}

void Server::Handle(InMessage in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  if (cluster_->Handle(in)) return;  // views and shutdowns (forged ones refused there)
  const msg::Envelope* env = in.envelope();
  // Until registered (and restored), a pull or push would find no slice or an older one,
  // and no secret can be checked (the views carry them): the worker retries kUnavailable
  // (a restarted server's first moments), where kPermissionDenied would end it.
  if (!serving_ && (env->body_type() == msg::Body::Push ||
                    env->body_type() == msg::Body::PullRequest ||
                    env->body_type() == msg::Body::Resume ||
                    env->body_type() == msg::Body::DeclareSlice ||
                    env->body_type() == msg::Body::SetHyper ||
                    env->body_type() == msg::Body::Checkpoint)) {
    return ReplyError(in, absl::UnavailableError("server starting: not registered yet"));
  }
  switch (env->body_type()) {
    case msg::Body::DeclareSlice:
      OnDeclare(in);
      break;
    case msg::Body::Push:
      OnPush(in);
      break;
    case msg::Body::PullRequest:
      OnPull(in);
      break;
    case msg::Body::Resume:
      OnResume(in);
      break;
    case msg::Body::SetHyper:
      OnSetHyper(in);
      break;
    case msg::Body::Checkpoint:
      OnCheckpoint(in);
      break;
    default:
      ReplyError(in, absl::InvalidArgumentError(absl::StrCat(
                         "server does not handle ", msg::EnumNameBody(env->body_type()))));
  }
}

void Server::OnDeclare(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::DeclareSlice* d = in.envelope()->body_as_DeclareSlice();
  if (d->length() == 0 || d->bin_size() == 0) {
    return ReplyError(in, absl::InvalidArgumentError("slice length and bin size must be > 0"));
  }
  const msg::Envelope* env = in.envelope();
  // (Not checked against the view's workers: a worker may declare before our own view arrived.)
  if (env->sender_role() != msg::Role::Worker || env->sender_rank() < 0) {
    return ReplyError(in, absl::InvalidArgumentError("slice declared by a non-worker"));
  }
  if (auto st = CheckWorkerSecret(d->secret(), "DeclareSlice"); !st.ok()) {
    return ReplyError(in, st);
  }
  if (env->sender_rank() < members_.num_workers()) CountWorker(env->sender_rank());
  absl::StatusOr<DeclareWork> work = DeclarationWork(
      *d, DeclarationRules{optimizer_, config_.sync, config_.backup_workers, config_.pull_bin_size});
  if (!work.ok()) return ReplyError(in, work.status());
  // A new key's size is checked here (the memory budget is this thread's); its initial values
  // only by the engine thread that will own the slice (a 25M-float slice is a 100 MB scan,
  // which must not hold up every socket): a refused declaration there leaves no shard, and
  // the engine is told so (EngineThread::Handle, CheckpointWriter::SetShardHeld).
  if (engine_->OwnerOf(d->key()) < 0) {
    // Before the budget is charged (the engine thread checks it again for a key whose first
    // declaration it refused, which has an owner and so skips this).
    if (d->length() > config_.max_slice_elements) {
      return ReplyError(in, absl::ResourceExhaustedError(absl::StrCat(
                                "slice of ", d->length(), " elements exceeds --max_slice_elements ",
                                config_.max_slice_elements)));
    }
    const uint64_t cost = SliceBudgetBytes(d->length(), work->keep_sum);
    if (memory_used_ + cost > memory_budget_) {
      return ReplyError(in, absl::ResourceExhaustedError(absl::StrCat(
                                "slice of ", d->length(), " elements (", cost,
                                " bytes budgeted) exceeds --max_memory ", memory_budget_, " (",
                                memory_used_, " bytes in use)")));
    }
    memory_used_ += cost;
    checkpoints_->SliceDeclared(absl::Now());
  }
  const int owner = engine_->AssignOwner(work->key);
  Route(std::move(in), owner, *std::move(work));
}

void Server::Route(InMessage in, int owner, EngineWork work) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  EngineRequest* request = AsRequest(work);
  request->route = in.route();
  request->peer = in.peer();
  request->request_id = in.envelope()->request_id();
  request->frame = std::move(in);  // the frames travel with the work: no copy of the payload
  if (!engine_->Submit(owner, std::move(work))) {
    log_.get()->warn("engine stopped: message dropped");
  }
}

int Server::KnownWorker(const msg::Envelope& env) const {
  const int rank = env.sender_rank();
  const bool known = env.sender_role() == msg::Role::Worker && rank >= 0 &&
                     rank < members_.num_workers();
  return known ? rank : -1;
}

void Server::OnPush(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Envelope* env = in.envelope();
  const msg::Push* p = env->body_as_Push();
  const int owner = engine_->OwnerOf(p->key());
  if (owner < 0) {
    return ReplyError(in, absl::InvalidArgumentError(
                              absl::StrCat("push to undeclared slice ", p->key())));
  }
  const int worker = KnownWorker(*env);
  if (worker < 0) {
    return ReplyError(in, absl::InvalidArgumentError("push from an unknown worker"));
  }
  // The one parse of the push's header (and a container's table): the engine thread and
  // its shard take the parse, and only the bodies are read there.
  auto parsed = ParseUpdate(in.payload());
  if (!parsed.ok()) return ReplyError(in, parsed.status());
  const WireHeader& header = parsed->header;
  const uint8_t carried = header.segments ? kSegmentedKind : static_cast<uint8_t>(header.kind);
  if (carried != static_cast<uint8_t>(p->kind())) {
    return ReplyError(in, absl::InvalidArgumentError(absl::StrCat(
                              "push says payload kind ", msg::EnumNamePayloadKind(p->kind()),
                              " but carries ",
                              header.segments ? "a segmented container"
                                              : CompressorKindName(header.kind))));
  }
  CountWorker(worker);
  SyncLiveWorkers();  // the step completes against the live workers as of this push
  PushWork work;
  work.key = p->key();
  work.worker = worker;
  work.step = p->step();
  work.push = *std::move(parsed);
  Route(std::move(in), owner, std::move(work));
}

void Server::OnResume(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Envelope* env = in.envelope();
  const msg::Resume* r = env->body_as_Resume();
  const int owner = engine_->OwnerOf(r->key());
  if (owner < 0) {
    return ReplyError(in, absl::InvalidArgumentError(
                              absl::StrCat("resume of undeclared slice ", r->key())));
  }
  const int worker = KnownWorker(*env);
  if (worker < 0) {
    return ReplyError(in, absl::InvalidArgumentError("resume from an unknown worker"));
  }
  ResumeWork work;
  work.key = r->key();
  work.worker = worker;
  work.seen_version = r->seen_version();
  Route(std::move(in), owner, std::move(work));
}

void Server::SyncLiveWorkers() { engine_->SetLiveWorkers(members_.live()); }

void Server::CompleteStepsWithoutLostWorkers() {
  if (!config_.sync) return;
  SyncLiveWorkers();  // each engine thread completes the steps it can on the new set
}

void Server::OnPull(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Envelope* env = in.envelope();
  const msg::PullRequest* p = env->body_as_PullRequest();
  const int owner = engine_->OwnerOf(p->key());
  if (owner < 0) {
    return ReplyError(in, absl::InvalidArgumentError(absl::StrCat(
                              "pull of undeclared slice ", p->key(),
                              ": this server does not hold it (had the server restarted, its "
                              "checkpoint was written before the slice was declared: the "
                              "slice's parameters are lost)")));
  }
  Shard::Format format;
  switch (p->format()) {
    case msg::PullFormat::Dense:
      format = Shard::Format::kDense;
      break;
    case msg::PullFormat::Recompressed:
      format = Shard::Format::kRecompressed;
      break;
    case msg::PullFormat::Replica:
      format = Shard::Format::kReplica;
      break;
    case msg::PullFormat::Sparse:
      format = Shard::Format::kSparse;
      break;
    default:
      return ReplyError(in, absl::InvalidArgumentError(absl::StrCat(
                                "unknown pull format ", static_cast<int>(p->format()))));
  }
  if (p->offset() != 0 && format != Shard::Format::kDense && format != Shard::Format::kReplica) {
    return ReplyError(in, absl::InvalidArgumentError(
                              "a pull from an offset is answered Dense or Replica only"));
  }
  if (format != Shard::Format::kDense && !config_.sync) {
    return ReplyError(in, absl::FailedPreconditionError(
                              "recompressed and sparse pulls need a server in sync mode"));
  }
  PullWork work;
  work.key = p->key();
  work.min_version = p->min_version();
  work.have_version = p->have_version();
  work.offset = p->offset();
  work.format = format;
  // (A forwarded answer leaves out the puller's own push only for a worker's pull.)
  if (env->sender_role() == msg::Role::Worker && env->sender_rank() >= 0 &&
      env->sender_rank() < members_.num_workers()) {
    work.worker = env->sender_rank();
    work.held_push = p->held_push();
  }
  Route(std::move(in), owner, std::move(work));
}

void Server::OnSetHyper(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::SetHyper* h = in.envelope()->body_as_SetHyper();
  if (auto st = CheckWorkerSecret(h->secret(), "SetHyper"); !st.ok()) return ReplyError(in, st);
  OptimizerConfig next = optimizer_;
  if (h->params()) {
    for (const auto* p : *h->params()) {
      if (auto st = SetHyperParam(next, p->name() ? p->name()->str() : "", p->value());
          !st.ok()) {
        return ReplyError(in, st);
      }
    }
  }
  optimizer_ = next;
  // Queued to every engine thread before the ack: a push sent after the ack is behind it.
  engine_->SetOptimizer(optimizer_);
  if (h->params()) {
    for (const auto* p : *h->params()) RememberHyper(p->name()->str(), p->value());
  }
  checkpoints_->SetHyper(hyper_set_);  // into every later checkpoint
  transport_->Reply(in, MakeAck(transport_->self(), in.envelope()->request_id()));
}

void Server::RememberHyper(const std::string& name, double value) {
  for (auto& [n, v] : hyper_set_) {
    if (n == name) {
      v = value;
      return;
    }
  }
  hyper_set_.emplace_back(name, value);
}

// What SetHyper had set before the checkpoint comes back over the flags (a value this
// build does not know is logged and skipped).
void Server::RestoreHyper(const HyperValues& hyper) {
  for (const auto& [name, value] : hyper) {
    if (auto st = SetHyperParam(optimizer_, name, value); !st.ok()) {
      log_.get()->warn("checkpoint hyperparameter {}={} not restored: {}", name, value,
                       st.ToString());
      continue;
    }
    RememberHyper(name, value);
    log_.get()->info("restored hyperparameter {}={}", name, value);
  }
  engine_->SetOptimizer(optimizer_);
  checkpoints_->SetHyper(hyper_set_);
}

absl::Status Server::InstallSlices(std::vector<SliceRecord> records, const HyperValues& hyper) {
  std::vector<Shard> loaded;
  for (SliceRecord& record : records) {
    ADAPS_ASSIGN_OR_RETURN(Shard shard, Shard::FromRecord(std::move(record)));
    loaded.push_back(std::move(shard));
  }
  std::sort(loaded.begin(), loaded.end(),
            [](const Shard& a, const Shard& b) { return a.key() < b.key(); });
  memory_used_ = 0;
  for (Shard& shard : loaded) {
    memory_used_ += SliceBudgetBytes(shard.length(), shard.keeps_sum());
    log_.get()->info("slice '{}' restored at step {}", shard.name(), shard.version());
    engine_->Adopt(std::move(shard));  // before any worker message: the queues keep order
  }
  RestoreHyper(hyper);
  return absl::OkStatus();
}

void Server::OnCheckpoint(InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(transport_);
  const msg::Checkpoint* c = in.envelope()->body_as_Checkpoint();
  if (auto st = CheckWorkerSecret(c->secret(), "Checkpoint"); !st.ok()) return ReplyError(in, st);
  std::string dir = c->directory() ? c->directory()->str() : "";
  // A request may not pick where the server writes: that would let any client that reaches
  // the port create files anywhere the server may write. Only --checkpoint_dir is used.
  if (!checkpoints_->enabled()) {
    return ReplyError(in, absl::FailedPreconditionError(
                              "checkpoint requested but the server has no --checkpoint_dir"));
  }
  if (!dir.empty() && dir != config_.checkpoint_dir) {
    return ReplyError(in, absl::PermissionDeniedError(absl::StrCat(
                              "checkpoint directory '", dir, "' refused: this server writes only to ",
                              config_.checkpoint_dir)));
  }
  // Acked once the file is durable, from the checkpoint writer (the sink is thread-safe).
  const uint64_t id = in.envelope()->request_id();
  checkpoints_->Write(job_id_, [this, route = in.route(), peer = in.peer(), id](absl::Status st) {
    if (st.ok()) {
      sink_->Send(route, peer, MakeAck(sink_->self(), id));
    } else if (id != 0) {
      sink_->Send(route, peer, MakeError(sink_->self(), id, st));
    }
  });
}

}  // namespace adaps
