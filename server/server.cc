#include "server/server.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
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
  if (name == "mean") return OptimizerKind::kMean;
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "nesterov") return OptimizerKind::kNesterov;
  if (name == "adam") return OptimizerKind::kAdam;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown optimizer '", name, "' (expected sum, mean, sgd, momentum, nesterov or adam)"));
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
    case OptimizerKind::kMean:
      std::copy(grad.begin(), grad.end(), p.begin());
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
  ADAPS_RET_CHECK(c.scheduler_grace > absl::ZeroDuration(), absl::StatusCode::kInvalidArgument,
                  "scheduler grace must be positive");
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
  topts.curve = config_.curve;
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
  address_ = address;
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
    // Info, not warn: workers also leave on a normal finish; the scheduler warns of deaths.
    log_.get()->info("{} live workers now", live_workers_.size());
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
    {
      const msg::Shutdown* sd = env->body_as_Shutdown();
      const std::string reason = sd->reason() ? sd->reason()->str() : "";
      log_.get()->info("shutdown: {}", reason);
      const int code = sd->code();
      Finish(code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)
                 ? absl::OkStatus()
                 : absl::Status(static_cast<absl::StatusCode>(code),
                                absl::StrCat("cluster stopped: ", reason)));
    }
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
  const msg::Envelope* env = in.envelope();
  // (Not checked against num_workers_: a worker may declare before our own view arrived.)
  if (env->sender_role() != msg::Role::Worker || env->sender_rank() < 0) {
    return ReplyError(in, absl::InvalidArgumentError("slice declared by a non-worker"));
  }
  if (d->length() > config_.max_slice_elements && slices_.find(d->key()) == slices_.end()) {
    return ReplyError(in, absl::ResourceExhaustedError(absl::StrCat(
                              "slice of ", d->length(), " elements exceeds --max_slice_elements ",
                              config_.max_slice_elements)));
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
  // A worker never waits for more than the step after the current one (its push for this
  // step is in); anything further would be held forever, so a client could pile them up.
  if (config_.sync && p->min_version() > s.version + 1) {
    return ReplyError(in, absl::FailedPreconditionError(absl::StrCat(
                              "pull for version ", p->min_version(), " but slice '", s.name,
                              "' is at ", s.version)));
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

namespace {

// Checkpoint file: "ADAPSCK2" | u64 slice count | per slice: u64 key, u32 length, u32 bin
// size, u64 version, u64 adam_t, u64 down_base, u64 down_version, string name, then the
// float arrays params, m, v, published, downlink residue (each u64 count + floats) | u32
// CRC-32 of everything before it. Native byte order: a checkpoint moves with its server.
constexpr char kCheckpointMagic[8] = {'A', 'D', 'A', 'P', 'S', 'C', 'K', '2'};

uint32_t Crc32(const uint8_t* data, size_t n, uint32_t crc = 0) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

class Writer {
 public:
  template <typename T>
  void Put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void PutFloats(absl::Span<const float> v) {
    Put<uint64_t>(v.size());
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    bytes.insert(bytes.end(), p, p + v.size() * sizeof(float));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> bytes;
};

class Reader {
 public:
  explicit Reader(absl::Span<const uint8_t> b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetFloats(std::vector<float>* v, uint64_t max) {
    uint64_t n;
    if (!Get(&n) || n > max || (b_.size() - pos_) / sizeof(float) < n) return false;
    v->resize(n);
    if (n) std::memcpy(v->data(), b_.data() + pos_, n * sizeof(float));
    pos_ += n * sizeof(float);
    return true;
  }
  bool GetString(std::string* s) {
    uint64_t n;
    if (!Get(&n) || n > b_.size() - pos_) return false;
    s->assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool AtEnd() const { return pos_ == b_.size(); }

 private:
  absl::Span<const uint8_t> b_;
  size_t pos_ = 0;
};

absl::Status WriteFileDurably(const std::string& path, const std::vector<uint8_t>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("short write to ", path, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed) return absl::UnavailableError(absl::StrCat("cannot fsync ", path));
  return absl::OkStatus();
}

void SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

absl::Status Server::WriteCheckpoint(const std::string& dir) {
  ADAPS_RET_CHECK(!dir.empty(), absl::StatusCode::kInvalidArgument, "no checkpoint directory");
  const std::string path = absl::StrCat(dir, "/server-", transport_->rank(), ".ckpt");
  const std::string tmp = path + ".tmp";
  Writer w;
  w.bytes.insert(w.bytes.end(), kCheckpointMagic, kCheckpointMagic + sizeof(kCheckpointMagic));
  w.Put<uint64_t>(slices_.size());
  for (const auto& [key, s] : slices_) {
    w.Put<uint64_t>(key);
    w.Put<uint32_t>(s.length);
    w.Put<uint32_t>(s.bin_size);
    w.Put<uint64_t>(s.version);
    w.Put<uint64_t>(s.adam_t);
    w.Put<uint64_t>(s.down_base);
    w.Put<uint64_t>(s.down_version);
    w.PutString(s.name);
    w.PutFloats(s.params);
    w.PutFloats(s.m);
    w.PutFloats(s.v);
    w.PutFloats(s.published);
    w.PutFloats(s.down_residue->residue());
  }
  w.Put<uint32_t>(Crc32(w.bytes.data(), w.bytes.size()));
  ADAPS_RETURN_IF_ERROR(WriteFileDurably(tmp, w.bytes));
  // Keep the previous checkpoint: if this one is found damaged at restore, that one is used.
  if (::access(path.c_str(), F_OK) == 0 && std::rename(path.c_str(), (path + ".prev").c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot keep the previous checkpoint ", path));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  SyncDirectory(dir);
  log_.get()->info("checkpoint of {} slices written to {}", slices_.size(), path);
  return absl::OkStatus();
}

absl::Status Server::LoadCheckpointFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("no checkpoint at ", path));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto damaged = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " is damaged: ", why));
  };
  if (bytes.size() < sizeof(kCheckpointMagic) + 12 ||
      std::memcmp(bytes.data(), kCheckpointMagic, sizeof(kCheckpointMagic)) != 0) {
    return damaged("not an adaps checkpoint (bad magic or too short)");
  }
  uint32_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 4, 4);
  if (Crc32(bytes.data(), bytes.size() - 4) != stored) return damaged("checksum mismatch");
  Reader r(absl::MakeConstSpan(bytes).subspan(sizeof(kCheckpointMagic), bytes.size() - 12));
  uint64_t count;
  if (!r.Get(&count)) return damaged("truncated");
  std::map<uint64_t, Slice> loaded;
  for (uint64_t i = 0; i < count; ++i) {
    Slice s;
    std::vector<float> residue;
    if (!r.Get(&s.key) || !r.Get(&s.length) || !r.Get(&s.bin_size) || !r.Get(&s.version) ||
        !r.Get(&s.adam_t) || !r.Get(&s.down_base) || !r.Get(&s.down_version) ||
        !r.GetString(&s.name) || !r.GetFloats(&s.params, s.length) ||
        !r.GetFloats(&s.m, s.length) || !r.GetFloats(&s.v, s.length) ||
        !r.GetFloats(&s.published, s.length) || !r.GetFloats(&residue, s.length)) {
      return damaged("truncated slice record");
    }
    if (s.length == 0 || s.bin_size == 0 || s.params.size() != s.length ||
        s.published.size() != s.length || residue.size() != s.length) {
      return damaged("inconsistent slice record");
    }
    s.agg.assign(s.length, 0.0f);
    s.down_residue = std::make_unique<SliceState>(s.length);
    std::copy(residue.begin(), residue.end(), s.down_residue->residue().begin());
    s.restored = true;
    loaded.emplace(s.key, std::move(s));
  }
  if (!r.AtEnd()) return damaged("trailing bytes");
  slices_ = std::move(loaded);
  for (const auto& [key, s] : slices_) {
    log_.get()->info("slice '{}' restored at step {}", s.name, s.version);
  }
  return absl::OkStatus();
}

absl::Status Server::ReadCheckpoint(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/server-", transport_->rank(), ".ckpt");
  absl::Status latest = LoadCheckpointFile(path);
  if (latest.ok()) {
    log_.get()->info("restored {} slices from {}", slices_.size(), path);
    return latest;
  }
  absl::Status previous = LoadCheckpointFile(path + ".prev");
  if (latest.code() == absl::StatusCode::kNotFound && previous.code() == absl::StatusCode::kNotFound) {
    log_.get()->info("no checkpoint at {}; starting fresh", path);
    return absl::OkStatus();
  }
  if (previous.ok()) {
    log_.get()->error("{}; refused, restored {} slices from the previous checkpoint {}.prev",
                      latest.ToString(), slices_.size(), path);
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrCat("no usable checkpoint: ", latest.message(), "; ",
                                          previous.message()));
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
