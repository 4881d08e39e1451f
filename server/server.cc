#include "server/server.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"

namespace adaps {

absl::StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  if (name == "sum") return OptimizerKind::kSumOnly;
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "nesterov") return OptimizerKind::kNesterov;
  if (name == "adam") return OptimizerKind::kAdam;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown optimizer '", name, "' (expected sum, sgd, momentum, nesterov or adam)"));
}

absl::Status SetHyperParam(OptimizerConfig& c, const std::string& name, double value) {
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("hyper-parameter ", name, " is not finite"));
  }
  const float f = static_cast<float>(value);
  auto in_unit = [&](float* field) -> absl::Status {
    ADAPS_RET_CHECK(f >= 0.0f && f < 1.0f, absl::StatusCode::kInvalidArgument,
                    absl::StrCat(name, " must be in [0, 1)"));
    *field = f;
    return absl::OkStatus();
  };
  if (name == "learning_rate") {
    ADAPS_RET_CHECK(f >= 0.0f, absl::StatusCode::kInvalidArgument,
                    "learning_rate must be non-negative");
    c.learning_rate = f;
    return absl::OkStatus();
  }
  if (name == "weight_decay") {
    ADAPS_RET_CHECK(f >= 0.0f, absl::StatusCode::kInvalidArgument,
                    "weight_decay must be non-negative");
    c.weight_decay = f;
    return absl::OkStatus();
  }
  if (name == "epsilon") {
    ADAPS_RET_CHECK(f > 0.0f, absl::StatusCode::kInvalidArgument, "epsilon must be positive");
    c.epsilon = f;
    return absl::OkStatus();
  }
  if (name == "momentum") return in_unit(&c.momentum);
  if (name == "beta1") return in_unit(&c.beta1);
  if (name == "beta2") return in_unit(&c.beta2);
  return absl::InvalidArgumentError(absl::StrCat("unknown hyper-parameter '", name, "'"));
}

void ApplyOptimizer(const OptimizerConfig& c, absl::Span<const float> grad,
                    absl::Span<float> p, std::vector<float>& m, std::vector<float>& v,
                    uint64_t& t) {
  const size_t n = p.size();
  const float lr = c.learning_rate, wd = c.weight_decay;
  switch (c.kind) {
    case OptimizerKind::kSumOnly:
      for (size_t i = 0; i < n; ++i) p[i] += grad[i];
      return;
    case OptimizerKind::kSgd:
      for (size_t i = 0; i < n; ++i) p[i] -= lr * (grad[i] + wd * p[i]);
      return;
    case OptimizerKind::kMomentum:
    case OptimizerKind::kNesterov: {
      if (m.size() != n) m.assign(n, 0.0f);
      const float mu = c.momentum;
      const bool nesterov = c.kind == OptimizerKind::kNesterov;
      for (size_t i = 0; i < n; ++i) {
        const float g = grad[i] + wd * p[i];
        m[i] = mu * m[i] + g;
        p[i] -= lr * (nesterov ? g + mu * m[i] : m[i]);
      }
      return;
    }
    case OptimizerKind::kAdam: {
      if (m.size() != n) m.assign(n, 0.0f);
      if (v.size() != n) v.assign(n, 0.0f);
      ++t;
      const float b1 = c.beta1, b2 = c.beta2;
      const float c1 = 1.0f - std::pow(b1, static_cast<float>(t));
      const float c2 = 1.0f - std::pow(b2, static_cast<float>(t));
      for (size_t i = 0; i < n; ++i) {
        const float g = grad[i] + wd * p[i];
        m[i] = b1 * m[i] + (1.0f - b1) * g;
        v[i] = b2 * v[i] + (1.0f - b2) * g * g;
        p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + c.epsilon);
      }
      return;
    }
  }
}

absl::Status ValidateServerConfig(const ServerConfig& c) {
  ADAPS_RET_CHECK(!c.scheduler.empty(), absl::StatusCode::kInvalidArgument,
                  "no scheduler address");
  ADAPS_RET_CHECK(!c.bind.empty(), absl::StatusCode::kInvalidArgument, "empty bind address");
  ADAPS_RET_CHECK(c.register_timeout > absl::ZeroDuration(), absl::StatusCode::kInvalidArgument,
                  "register timeout must be positive");
  OptimizerConfig probe = c.optimizer;
  ADAPS_RETURN_IF_ERROR(SetHyperParam(probe, "learning_rate", c.optimizer.learning_rate));
  ADAPS_RETURN_IF_ERROR(SetHyperParam(probe, "momentum", c.optimizer.momentum));
  ADAPS_RETURN_IF_ERROR(SetHyperParam(probe, "beta1", c.optimizer.beta1));
  ADAPS_RETURN_IF_ERROR(SetHyperParam(probe, "beta2", c.optimizer.beta2));
  ADAPS_RETURN_IF_ERROR(SetHyperParam(probe, "epsilon", c.optimizer.epsilon));
  ADAPS_RETURN_IF_ERROR(SetHyperParam(probe, "weight_decay", c.optimizer.weight_decay));
  return ValidateLogLevel(c.log_level);
}

Server::Server(ServerConfig config, std::shared_ptr<TransportContext> context)
    : config_(std::move(config)), log_("server", config_.log_level), optimizer_(config_.optimizer) {
  TransportOptions topts;
  topts.self = Sender{msg::Role::Server, -1};
  topts.bind_endpoint = config_.bind;
  topts.context = std::move(context);
  topts.log = &log_;
  transport_ = std::make_unique<Transport>(std::move(topts),
                                           [this](InMessage in) { Handle(std::move(in)); });
  transport_->AddTimer(absl::Milliseconds(100), [this] { Heartbeat(); });
  CompressorOptions copts;
  copts.kind = CompressorKind::kAdaComp;
  down_compressor_ = *MakeCompressor(copts);
}

Server::~Server() { Stop(); }

absl::Status Server::Start() {
  ADAPS_RETURN_IF_ERROR(ValidateServerConfig(config_));
  ADAPS_RETURN_IF_ERROR(transport_->Start());
  std::string address = config_.advertise;
  if (address.empty()) {
    address = absl::StrReplaceAll(transport_->bound_endpoint(), {{"0.0.0.0", "127.0.0.1"}});
  }
  log_.get()->info("listening on {} (advertised as {})", transport_->bound_endpoint(), address);
  ADAPS_ASSIGN_OR_RETURN(int scheduler, transport_->Connect(config_.scheduler));
  (void)scheduler;  // peer 0

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
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    auto registered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return registered_; };
    mu_.Await(absl::Condition(&registered));
    status = register_status_;
  }
  if (!status.ok()) {
    transport_->Stop();
    return status;
  }
  log_.get()->info("registered as server {} of a cluster with {} workers", transport_->rank(),
                   num_workers_);
  if (config_.restore && !config_.checkpoint_dir.empty()) {
    absl::Status restored;
    absl::Notification done;
    transport_->Post([&] {
      restored = ReadCheckpoint(config_.checkpoint_dir);
      done.Notify();
    });
    done.WaitForNotification();
    if (!restored.ok()) {
      transport_->Stop();
      return restored;
    }
  }
  return absl::OkStatus();
}

std::string Server::endpoint() const { return transport_->bound_endpoint(); }

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

void Server::ReplyError(const InMessage& in, const absl::Status& status) {
  if (in.envelope()->request_id() == 0) return;
  transport_->Reply(in, MakeError(transport_->self(), in.envelope()->request_id(), status));
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
    log_.get()->warn("{} live workers now", live_workers_.size());
    for (auto& [key, slice] : slices_) MaybeCompleteStep(slice);
  }
}

void Server::Heartbeat() {
  if (transport_->rank() < 0) return;
  {
    absl::MutexLock lock(&mu_);
    if (done_) return;
  }
  const absl::Time now = absl::Now();
  if (config_.checkpoint_interval > absl::ZeroDuration() && !config_.checkpoint_dir.empty()) {
    if (last_checkpoint_ == absl::Time()) last_checkpoint_ = now;
    if (now - last_checkpoint_ >= config_.checkpoint_interval) {
      last_checkpoint_ = now;
      if (auto st = WriteCheckpoint(config_.checkpoint_dir); !st.ok()) {
        log_.get()->error("timed checkpoint failed: {}", st.ToString());
      }
    }
  }
  if (now - last_heartbeat_sent_ < heartbeat_interval_) return;
  last_heartbeat_sent_ = now;
  if (now - last_heartbeat_ok_ > std::max(5 * heartbeat_interval_, absl::Seconds(2))) {
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
                        if (reply.ok()) last_heartbeat_ok_ = absl::Now();
                      });
}

void Server::Handle(InMessage in) {
  const msg::Envelope* env = in.envelope();
  // Cluster views and shutdowns come from the scheduler, over our DEALER to it (peer 0).
  // The same bodies arriving on the ROUTER are forgeries: any client could otherwise mark
  // workers dead or stop the server.
  const bool from_scheduler = in.peer() == 0;
  if ((env->body_type() == msg::Body::ClusterView || env->body_type() == msg::Body::Shutdown) &&
      !from_scheduler) {
    ++refused_;
    return ReplyError(in, absl::PermissionDeniedError(absl::StrCat(
                              msg::EnumNameBody(env->body_type()),
                              " is accepted only from the scheduler")));
  }
  switch (env->body_type()) {
    case msg::Body::ClusterView:
      OnView(env->body_as_ClusterView());
      break;
    case msg::Body::Shutdown:
      log_.get()->info("shutdown: {}", env->body_as_Shutdown()->reason()
                                           ? env->body_as_Shutdown()->reason()->str()
                                           : "");
      Finish(absl::OkStatus());
      break;
    case msg::Body::DeclareSlice:
      OnDeclare(in);
      break;
    case msg::Body::Push:
      OnPush(in);
      break;
    case msg::Body::PullRequest:
      OnPull(in);
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
  const msg::DeclareSlice* d = in.envelope()->body_as_DeclareSlice();
  if (d->length() == 0 || d->bin_size() == 0) {
    return ReplyError(in, absl::InvalidArgumentError("slice length and bin size must be > 0"));
  }
  if (d->has_init() && in.payload().size() != uint64_t{d->length()} * sizeof(float)) {
    return ReplyError(in, absl::InvalidArgumentError(absl::StrCat(
                              "initial values: ", in.payload().size(), " bytes for ",
                              d->length(), " floats")));
  }
  if (d->has_init()) {
    for (size_t i = 0; i < d->length(); ++i) {
      float x;
      std::memcpy(&x, in.payload().data() + i * sizeof(float), sizeof(x));
      if (!std::isfinite(x)) {
        return ReplyError(in, absl::InvalidArgumentError(
                                  absl::StrCat("initial value ", i, " is NaN or Inf")));
      }
    }
  }
  auto it = slices_.find(d->key());
  if (it == slices_.end()) {
    Slice s;
    s.key = d->key();
    s.name = d->name() ? d->name()->str() : "";
    s.length = d->length();
    s.bin_size = d->bin_size();
    s.params.assign(s.length, 0.0f);
    s.agg.assign(s.length, 0.0f);
    s.published.assign(s.length, 0.0f);
    s.down_residue = std::make_unique<SliceState>(s.length);
    auto saved = restored_.find(d->key());
    if (saved != restored_.end() && saved->second.params.size() == s.length) {
      s.params = std::move(saved->second.params);
      s.published = s.params;
      s.version = s.down_base = s.down_version = saved->second.version;
      restored_.erase(saved);
      s.restored = true;
      log_.get()->info("slice '{}' restored at step {}", s.name, s.version);
    }
    it = slices_.emplace(d->key(), std::move(s)).first;
  } else if (it->second.length != d->length() || it->second.bin_size != d->bin_size()) {
    return ReplyError(in, absl::InvalidArgumentError(absl::StrCat(
                              "slice ", d->key(), " exists with length ", it->second.length,
                              " and bin size ", it->second.bin_size)));
  }
  Slice& s = it->second;
  if (d->has_init() && s.version == 0 && s.pushed.empty() && !s.restored) {
    std::memcpy(s.params.data(), in.payload().data(), in.payload().size());
    s.published = s.params;
    s.dense_version = UINT64_MAX;
  }
  transport_->Reply(in, MakeAck(transport_->self(), in.envelope()->request_id()));
}

void Server::OnPush(InMessage& in) {
  const msg::Envelope* env = in.envelope();
  const msg::Push* p = env->body_as_Push();
  auto it = slices_.find(p->key());
  if (it == slices_.end()) {
    return ReplyError(in, absl::InvalidArgumentError(
                              absl::StrCat("push to undeclared slice ", p->key())));
  }
  Slice& s = it->second;
  const int worker = env->sender_rank();
  if (env->sender_role() != msg::Role::Worker || worker < 0 || worker >= num_workers_) {
    return ReplyError(in, absl::InvalidArgumentError("push from an unknown worker"));
  }
  auto header = PeekHeader(in.payload());
  if (!header.ok()) return ReplyError(in, header.status());
  if (static_cast<uint8_t>(header->kind) != static_cast<uint8_t>(p->kind())) {
    return ReplyError(in, absl::InvalidArgumentError(absl::StrCat(
                              "push says payload kind ", msg::EnumNamePayloadKind(p->kind()),
                              " but carries ", CompressorKindName(header->kind))));
  }
  if (header->length != s.length) {
    return ReplyError(in, absl::InvalidArgumentError(absl::StrCat(
                              "push of ", header->length, " elements to slice '", s.name,
                              "' of ", s.length)));
  }
  if (config_.sync) {
    if (p->step() != s.version) {
      return ReplyError(in, absl::FailedPreconditionError(absl::StrCat(
                                "push for step ", p->step(), " but slice '", s.name,
                                "' is at step ", s.version)));
    }
    if (s.pushed.count(worker)) {
      return ReplyError(in, absl::FailedPreconditionError(absl::StrCat(
                                "worker ", worker, " already pushed step ", p->step())));
    }
    if (auto st = DecodeAdd(in.payload(), 1.0f, absl::MakeSpan(s.agg)); !st.ok()) {
      return ReplyError(in, st);
    }
    s.pushed.insert(worker);
    transport_->Reply(in, MakeAck(transport_->self(), env->request_id()));
    MaybeCompleteStep(s);
    return;
  }
  std::fill(s.agg.begin(), s.agg.end(), 0.0f);
  if (auto st = DecodeAdd(in.payload(), 1.0f, absl::MakeSpan(s.agg)); !st.ok()) {
    return ReplyError(in, st);
  }
  ApplyOptimizer(optimizer_, s.agg, absl::MakeSpan(s.params), s.m, s.v, s.adam_t);
  ++s.version;
  transport_->Reply(in, MakeAck(transport_->self(), env->request_id()));
  AnswerHeld(s);
}

void Server::MaybeCompleteStep(Slice& s) {
  if (!config_.sync || s.pushed.empty()) return;
  for (int w : live_workers_) {
    if (!s.pushed.count(w)) return;
  }
  if (optimizer_.kind != OptimizerKind::kSumOnly) {
    const float inv = 1.0f / static_cast<float>(s.pushed.size());
    for (float& x : s.agg) x *= inv;
  }
  ApplyOptimizer(optimizer_, s.agg, absl::MakeSpan(s.params), s.m, s.v, s.adam_t);
  std::fill(s.agg.begin(), s.agg.end(), 0.0f);
  s.pushed.clear();
  ++s.version;
  AnswerHeld(s);
}

void Server::AnswerHeld(Slice& s) {
  std::vector<HeldPull> still;
  for (auto& pull : s.held) {
    if (pull.min_version > s.version) {
      still.push_back(std::move(pull));
      continue;
    }
    if (auto st = AnswerPull(s, pull); !st.ok()) {
      transport_->SendRoute(pull.route, MakeError(transport_->self(), pull.request_id, st));
    }
  }
  s.held = std::move(still);
}

absl::Status Server::AnswerPull(Slice& s, const HeldPull& pull) {
  SharedBytes payload;
  uint64_t base = 0;
  if (pull.format == msg::PullFormat::Dense) {
    if (s.dense_version != s.version || !s.dense_bytes) {
      s.dense_bytes = FloatsToBytes(s.params);
      s.dense_version = s.version;
    }
    payload = s.dense_bytes;
  } else {
    if (s.down_version != s.version) {
      // AdaComp over the change the compressor has not seen yet: params - published - residue.
      scratch_.resize(s.length);
      const float* r = s.down_residue->residue().data();
      for (uint32_t i = 0; i < s.length; ++i) scratch_[i] = s.params[i] - s.published[i] - r[i];
      CompressorOptions copts;
      copts.kind = CompressorKind::kAdaComp;
      copts.bin_size = s.bin_size;
      copts.non_finite = NonFinitePolicy::kSendNothing;
      ADAPS_ASSIGN_OR_RETURN(auto compressor, MakeCompressor(copts));
      ADAPS_RETURN_IF_ERROR(compressor->Compress(scratch_, *s.down_residue, update_));
      auto bytes = std::make_shared<Bytes>();
      ADAPS_RETURN_IF_ERROR(EncodeUpdate(update_, IndexCoding::kRice, bytes.get()));
      ADAPS_RETURN_IF_ERROR(DecodeAdd(*bytes, 1.0f, absl::MakeSpan(s.published)));
      s.down_base = s.down_version;
      s.down_version = s.version;
      s.down_bytes = std::move(bytes);
    }
    if (pull.have_version == s.down_base && s.down_base != s.down_version) {
      payload = s.down_bytes;
      base = s.down_base;
    } else if (pull.have_version == s.down_version) {
      base = s.down_version;  // nothing new
    } else {
      return absl::FailedPreconditionError(absl::StrCat(
          "replica of '", s.name, "' at version ", pull.have_version,
          "; the server can only send the change from version ", s.down_base));
    }
  }
  flatbuffers::FlatBufferBuilder fbb(128);
  auto body = msg::CreatePullResponse(fbb, s.key, pull.format == msg::PullFormat::Dense
                                                      ? s.version
                                                      : s.down_version,
                                      base, pull.format);
  transport_->SendRoute(pull.route, FinishEnvelope(fbb, transport_->self(), body, 0,
                                                   pull.request_id, std::move(payload)));
  return absl::OkStatus();
}

void Server::OnPull(InMessage& in) {
  const msg::Envelope* env = in.envelope();
  const msg::PullRequest* p = env->body_as_PullRequest();
  auto it = slices_.find(p->key());
  if (it == slices_.end()) {
    return ReplyError(in, absl::InvalidArgumentError(
                              absl::StrCat("pull of undeclared slice ", p->key())));
  }
  Slice& s = it->second;
  if (p->format() == msg::PullFormat::Recompressed && !config_.sync) {
    return ReplyError(in, absl::FailedPreconditionError(
                              "recompressed pulls need a server in sync mode"));
  }
  HeldPull pull{in.route(), env->request_id(), config_.sync ? p->min_version() : 0,
                p->have_version(), p->format()};
  if (pull.min_version > s.version) {
    s.held.push_back(std::move(pull));
    return;
  }
  if (auto st = AnswerPull(s, pull); !st.ok()) ReplyError(in, st);
}

void Server::OnSetHyper(InMessage& in) {
  const msg::SetHyper* h = in.envelope()->body_as_SetHyper();
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
  transport_->Reply(in, MakeAck(transport_->self(), in.envelope()->request_id()));
}

absl::Status Server::WriteCheckpoint(const std::string& dir) {
  ADAPS_RET_CHECK(!dir.empty(), absl::StatusCode::kInvalidArgument, "no checkpoint directory");
  const std::string path = absl::StrCat(dir, "/server-", transport_->rank(), ".ckpt");
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
    const uint64_t count = slices_.size();
    out.write(reinterpret_cast<const char*>(&count), sizeof(count));
    for (const auto& [key, s] : slices_) {
      const uint64_t header[3] = {key, s.length, s.version};
      out.write(reinterpret_cast<const char*>(header), sizeof(header));
      out.write(reinterpret_cast<const char*>(s.params.data()),
                static_cast<std::streamsize>(s.params.size() * sizeof(float)));
    }
    if (!out) return absl::UnavailableError(absl::StrCat("short write to ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp));
  }
  log_.get()->info("checkpoint of {} slices written to {}", slices_.size(), path);
  return absl::OkStatus();
}

absl::Status Server::ReadCheckpoint(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/server-", transport_->rank(), ".ckpt");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    log_.get()->info("no checkpoint at {}; starting fresh", path);
    return absl::OkStatus();
  }
  auto damaged = [&] { return absl::DataLossError(absl::StrCat("checkpoint ", path, " is damaged")); };
  uint64_t count = 0;
  if (!in.read(reinterpret_cast<char*>(&count), sizeof(count)) || count > (1u << 24)) {
    return damaged();
  }
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t header[3];
    if (!in.read(reinterpret_cast<char*>(header), sizeof(header)) || header[1] > UINT32_MAX) {
      return damaged();
    }
    Saved saved;
    saved.version = header[2];
    saved.params.resize(header[1]);
    if (!in.read(reinterpret_cast<char*>(saved.params.data()),
                 static_cast<std::streamsize>(header[1] * sizeof(float)))) {
      return damaged();
    }
    restored_[header[0]] = std::move(saved);
  }
  log_.get()->info("checkpoint {} read: {} slices", path, count);
  return absl::OkStatus();
}

void Server::OnCheckpoint(InMessage& in) {
  const msg::Checkpoint* c = in.envelope()->body_as_Checkpoint();
  std::string dir = c->directory() ? c->directory()->str() : "";
  // A request may not pick where the server writes: that would let any client that reaches
  // the port create files anywhere the server may write. Only --checkpoint_dir is used.
  if (config_.checkpoint_dir.empty()) {
    return ReplyError(in, absl::FailedPreconditionError(
                              "checkpoint requested but the server has no --checkpoint_dir"));
  }
  if (!dir.empty() && dir != config_.checkpoint_dir) {
    return ReplyError(in, absl::PermissionDeniedError(absl::StrCat(
                              "checkpoint directory '", dir, "' refused: this server writes only to ",
                              config_.checkpoint_dir)));
  }
  dir = config_.checkpoint_dir;
  if (auto st = WriteCheckpoint(dir); !st.ok()) return ReplyError(in, st);
  transport_->Reply(in, MakeAck(transport_->self(), in.envelope()->request_id()));
}

}  // namespace adaps
