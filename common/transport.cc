#include "common/transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "zmq_addon.hpp"

namespace adaps {

namespace internal {
void DcheckFailed(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: ADAPS_DCHECK failed: %s\n", file, line, what);
  std::abort();
}
}  // namespace internal
namespace {

std::string RandomRoutingId() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id(16, '\0');
  for (size_t i = 0; i < id.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(&id[i], &r, 8);
  }
  if (id[0] == '\0') id[0] = 1;
  return id;
}

}  // namespace
namespace {

constexpr size_t kMaxReadsPerWake = 256;

void FreeShared(void* /*data*/, void* hint) { delete static_cast<SharedBytes*>(hint); }

zmq::message_t ZeroCopy(const SharedBytes& bytes) {
  auto* holder = new SharedBytes(bytes);
  return zmq::message_t(const_cast<uint8_t*>((*holder)->data()), (*holder)->size(), &FreeShared,
                        holder);
}

absl::Status FromZmq(const zmq::error_t& e, absl::string_view what) {
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  if (e.num() == EINVAL || e.num() == EPROTONOSUPPORT || e.num() == ENODEV) {
    code = absl::StatusCode::kInvalidArgument;
  }
  return absl::Status(code, absl::StrCat(what, ": ", e.what()));
}

}  // namespace

TransportContext::TransportContext(int io_threads) : ctx_(std::max(1, io_threads)) {}

TransportContext::~TransportContext() {
  zap_stop_.store(true);
  if (zap_thread_.joinable()) zap_thread_.join();
  zap_socket_.reset();
}

absl::Status TransportContext::AllowClients(const std::string& domain,
                                            const std::vector<std::string>& keys) {
  std::set<std::string> binary;
  for (const auto& k : keys) {
    uint8_t raw[32];
    if (k.size() != 40 || zmq_z85_decode(raw, k.c_str()) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("'", k, "' is not a Z85 CURVE key"));
    }
    binary.emplace(reinterpret_cast<const char*>(raw), 32);
  }
  absl::MutexLock lock(&mu_);
  allowed_[domain] = std::move(binary);
  if (zap_socket_) return absl::OkStatus();
  try {
    zap_socket_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::rep);
    zap_socket_->set(zmq::sockopt::linger, 0);
    zap_socket_->bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    zap_socket_.reset();
    return absl::UnavailableError(absl::StrCat("cannot start the ZAP handler: ", e.what()));
  }
  zap_thread_ = std::thread([this, socket = zap_socket_.get()] { RunZap(socket); });
  return absl::OkStatus();
}

// ZAP (RFC 27): request frames version, request id, domain, address, identity, mechanism,
// credentials...; reply version, request id, status code, status text, user id, metadata.
void TransportContext::RunZap(zmq::socket_t* socket) {
  while (!zap_stop_.load()) {
    zmq::pollitem_t item{socket->handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(*socket, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        continue;
      }
      std::string request_id = frames.size() > 1 ? frames[1].to_string() : "";
      bool ok = false;
      if (frames.size() >= 7 && frames[0].to_string() == "1.0" &&
          frames[5].to_string() == "CURVE" && frames[6].size() == 32) {
        absl::MutexLock lock(&mu_);
        auto it = allowed_.find(frames[2].to_string());
        ok = it != allowed_.end() && it->second.count(frames[6].to_string()) > 0;
      }
      if (!ok) refused_.fetch_add(1);
      std::vector<zmq::const_buffer> reply = {
          zmq::str_buffer("1.0"), zmq::buffer(request_id),
          ok ? zmq::str_buffer("200") : zmq::str_buffer("400"),
          ok ? zmq::str_buffer("OK") : zmq::str_buffer("client key not allowed"),
          zmq::str_buffer(""), zmq::str_buffer("")};
      (void)zmq::send_multipart(*socket, reply);
    } catch (const zmq::error_t&) {
      if (zap_stop_.load()) break;
    }
  }
}

Transport::Transport(TransportOptions options, Handler handler)
    : options_(std::move(options)), handler_(std::move(handler)), rank_(options_.self.rank) {
  context_ = options_.context ? options_.context : std::make_shared<TransportContext>(1);
}

Transport::~Transport() { Stop(); }

absl::Status Transport::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (running_ || stopping_) return absl::FailedPreconditionError("transport already started");
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError("eventfd failed");
  std::string bound;
  if (!options_.bind_endpoint.empty()) {
    try {
      router_ = std::make_unique<zmq::socket_t>(context_->get(), zmq::socket_type::router);
      router_->set(zmq::sockopt::linger, 200);
      router_->set(zmq::sockopt::router_mandatory, 1);
      // A node reconnecting with its routing id takes its route over at once.
      router_->set(zmq::sockopt::router_handover, 1);
      router_->set(zmq::sockopt::sndhwm, 0);
      router_->set(zmq::sockopt::rcvhwm, 0);
      if (options_.max_message_bytes > 0) {
        router_->set(zmq::sockopt::maxmsgsize, options_.max_message_bytes);
      }
      if (options_.curve.enabled()) {
        const std::string domain = absl::StrCat("adaps-", reinterpret_cast<uintptr_t>(this));
        absl::Status allowed = context_->AllowClients(domain, options_.curve.allowed_clients);
        if (!allowed.ok()) {
          router_.reset();
          close(wake_fd_);
          wake_fd_ = -1;
          return allowed;
        }
        router_->set(zmq::sockopt::zap_domain, domain);
        router_->set(zmq::sockopt::curve_server, 1);
        router_->set(zmq::sockopt::curve_secretkey, options_.curve.server_secret_key);
      }
      router_->bind(options_.bind_endpoint);
      bound = router_->get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      router_.reset();
      close(wake_fd_);
      wake_fd_ = -1;
      absl::Status s = FromZmq(e, absl::StrCat("cannot bind ", options_.bind_endpoint));
      if (e.num() == EADDRINUSE) {
        s = absl::UnavailableError(
            absl::StrCat("cannot bind ", options_.bind_endpoint, ": address in use"));
      }
      return s;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    bound_endpoint_ = bound;
    running_ = true;
  }
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void Transport::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    stopping_ = true;
  }
  Wake();
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  running_ = false;
  if (wake_fd_ >= 0) close(wake_fd_);
  wake_fd_ = -1;
}

std::string Transport::bound_endpoint() const {
  absl::MutexLock lock(&mu_);
  return bound_endpoint_;
}

void Transport::Wake() {
  uint64_t one = 1;
  if (wake_fd_ >= 0) {
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
  }
}

bool Transport::Post(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!running_ || stopping_) return false;
    commands_.push_back(std::move(fn));
  }
  Wake();
  return true;
}

void Transport::AddTimer(absl::Duration period, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  timers_.push_back(Timer{period, absl::InfinitePast(), std::move(fn)});
}

absl::StatusOr<int> Transport::Connect(const std::string& endpoint) {
  auto connect = [this, endpoint]() -> absl::StatusOr<int> {
    try {
      auto socket = std::make_unique<zmq::socket_t>(context_->get(), zmq::socket_type::dealer);
      socket->set(zmq::sockopt::linger, 200);
      socket->set(zmq::sockopt::immediate, 1);
      socket->set(zmq::sockopt::sndhwm, 0);
      socket->set(zmq::sockopt::rcvhwm, 0);
      socket->set(zmq::sockopt::reconnect_ivl, 50);
      socket->set(zmq::sockopt::reconnect_ivl_max, 1000);
      // A random routing id that survives reconnects: the peer's ROUTER keeps seeing the
      // same route for this node (the scheduler authorises control messages by route), and
      // nobody else can guess it. The first byte is non-zero (libzmq reserves 0).
      socket->set(zmq::sockopt::routing_id, zmq::buffer(RandomRoutingId()));
      if (options_.curve.enabled()) {
        socket->set(zmq::sockopt::curve_serverkey, options_.curve.server_public_key);
        socket->set(zmq::sockopt::curve_publickey, options_.curve.client_public_key);
        socket->set(zmq::sockopt::curve_secretkey, options_.curve.client_secret_key);
      }
      socket->connect(endpoint);
      dealers_.push_back(std::move(socket));
      return static_cast<int>(dealers_.size()) - 1;
    } catch (const zmq::error_t& e) {
      return FromZmq(e, absl::StrCat("cannot connect to '", endpoint, "'"));
    }
  };
  if (OnIoThread()) return connect();
  absl::StatusOr<int> result = absl::FailedPreconditionError("transport not running");
  absl::Notification done;
  if (!Post([&] {
        result = connect();
        done.Notify();
      })) {
    return result;
  }
  done.WaitForNotification();
  return result;
}

void Transport::Enqueue(Outgoing out) {
  if (OnIoThread()) {
    outbox_.push_back(std::move(out));
    FlushOutbox();
    return;
  }
  auto shared = std::make_shared<Outgoing>(std::move(out));
  // Not running: a fire-and-forget message has nowhere to go (requests go through Request,
  // which reports that to its callback).
  Post([this, shared] {
    outbox_.push_back(std::move(*shared));
    FlushOutbox();
  });
}

void Transport::Send(int peer, OutMessage message) {
  Outgoing out;
  out.peer = peer;
  out.message = std::move(message);
  out.deadline = absl::Now() + options_.send_timeout;
  Enqueue(std::move(out));
}

void Transport::SendRoute(std::string route, OutMessage message) {
  Outgoing out;
  out.route = std::move(route);
  out.message = std::move(message);
  out.deadline = absl::Now() + options_.send_timeout;
  Enqueue(std::move(out));
}

void Transport::Reply(const InMessage& to, OutMessage message) {
  if (to.peer_ >= 0) {
    Send(to.peer_, std::move(message));
  } else {
    SendRoute(to.route_, std::move(message));
  }
}

void Transport::Request(int peer, uint64_t request_id, OutMessage message, absl::Time deadline,
                        ReplyCallback callback) {
  auto shared_cb = std::make_shared<ReplyCallback>(std::move(callback));
  auto register_and_send = [this, peer, request_id, deadline, shared_cb,
                            msg = std::make_shared<OutMessage>(std::move(message))]() mutable {
    pending_[request_id] = Pending{peer, deadline, std::move(*shared_cb)};
    Outgoing out;
    out.peer = peer;
    out.message = std::move(*msg);
    out.request_id = request_id;
    out.deadline = deadline;
    outbox_.push_back(std::move(out));
    FlushOutbox();
  };
  if (OnIoThread()) {
    register_and_send();
    return;
  }
  if (!Post(std::move(register_and_send))) {
    (*shared_cb)(absl::UnavailableError("transport is not running"));
  }
}

void Transport::FailPeer(int peer, const absl::Status& status) {
  auto fail = [this, peer, status] {
    std::vector<uint64_t> ids;
    for (const auto& [id, p] : pending_) {
      if (p.peer == peer) ids.push_back(id);
    }
    outbox_.erase(std::remove_if(outbox_.begin(), outbox_.end(),
                                 [peer](const Outgoing& o) { return o.peer == peer; }),
                  outbox_.end());
    for (uint64_t id : ids) Complete(id, status);
  };
  if (OnIoThread()) {
    fail();
  } else {
    Post(fail);
  }
}

TransportStats Transport::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool Transport::TrySend(Outgoing& out) {
  zmq::socket_t* socket = nullptr;
  if (out.peer >= 0) {
    if (out.peer >= static_cast<int>(dealers_.size())) {
      if (out.request_id) {
        Complete(out.request_id, absl::InvalidArgumentError(absl::StrCat("no peer ", out.peer)));
      }
      return true;
    }
    socket = dealers_[out.peer].get();
  } else {
    socket = router_.get();
    if (socket == nullptr) return true;
  }
  const size_t header_size = out.message.header.size();
  const size_t payload_size = out.message.payload ? out.message.payload->size() : 0;
  try {
    const auto more = zmq::send_flags::dontwait | zmq::send_flags::sndmore;
    if (!out.route.empty() || out.peer < 0) {
      if (!socket->send(zmq::buffer(out.route), more)) return false;
      zmq::message_t header(out.message.header.data(), header_size);
      (void)socket->send(header, out.message.payload ? more : zmq::send_flags::dontwait);
    } else {
      zmq::message_t header(out.message.header.data(), header_size);
      if (!socket->send(header, out.message.payload ? more : zmq::send_flags::dontwait)) {
        return false;
      }
    }
    if (out.message.payload) {
      zmq::message_t payload = ZeroCopy(out.message.payload);
      (void)socket->send(payload, zmq::send_flags::dontwait);
    }
  } catch (const zmq::error_t& e) {
    // ROUTER_MANDATORY: the route is gone. Nothing to retry.
    if (out.request_id) Complete(out.request_id, FromZmq(e, "send failed"));
    ++local_stats_.dropped_unsendable;
    return true;
  }
  ++local_stats_.messages_out;
  local_stats_.bytes_out += header_size + payload_size;
  return true;
}

void Transport::FlushOutbox() {
  const absl::Time now = absl::Now();
  for (auto it = outbox_.begin(); it != outbox_.end();) {
    if (TrySend(*it)) {
      it = outbox_.erase(it);
    } else if (now > it->deadline) {
      if (it->request_id) {
        Complete(it->request_id,
                 absl::UnavailableError(absl::StrCat(
                     "peer ", it->peer, " not reachable: message could not be delivered")));
      } else {
        ++local_stats_.dropped_unsendable;
      }
      it = outbox_.erase(it);
    } else {
      ++it;
    }
  }
}

void Transport::Complete(uint64_t request_id, absl::StatusOr<InMessage> result) {
  auto it = pending_.find(request_id);
  if (it == pending_.end()) {
    ++local_stats_.late_replies;
    return;
  }
  ReplyCallback cb = std::move(it->second.callback);
  pending_.erase(it);
  if (cb) cb(std::move(result));
}

void Transport::ExpireDeadlines(absl::Time now) {
  std::vector<uint64_t> expired;
  for (const auto& [id, p] : pending_) {
    if (now > p.deadline) expired.push_back(id);
  }
  for (uint64_t id : expired) {
    bool unsent = std::any_of(outbox_.begin(), outbox_.end(),
                              [id](const Outgoing& o) { return o.request_id == id; });
    if (unsent) {
      outbox_.erase(std::remove_if(outbox_.begin(), outbox_.end(),
                                   [id](const Outgoing& o) { return o.request_id == id; }),
                    outbox_.end());
      Complete(id, absl::UnavailableError("peer not reachable before the deadline"));
    } else {
      Complete(id, absl::DeadlineExceededError("no answer before the deadline"));
    }
  }
}

void Transport::DrainCommands() {
  std::deque<std::function<void()>> commands;
  {
    absl::MutexLock lock(&mu_);
    commands.swap(commands_);
  }
  for (auto& fn : commands) fn();
}

void Transport::Dispatch(std::vector<zmq::message_t>& frames, size_t first, std::string route,
                         int peer) {
  const size_t n = frames.size() - first;
  if (n < 1 || n > 2) {
    ++local_stats_.dropped_invalid;
    return;
  }
  InMessage in;
  in.header_ = std::move(frames[first]);
  if (n == 2) in.payload_ = std::move(frames[first + 1]);
  in.route_ = std::move(route);
  in.peer_ = peer;
  local_stats_.bytes_in += in.wire_bytes();
  ++local_stats_.messages_in;
  if (reinterpret_cast<uintptr_t>(in.header_.data()) % alignof(uint64_t) != 0) {
    // FlatBuffers needs an aligned buffer; libzmq keeps very small frames inline, where
    // alignment is not promised. Copy those (a few dozen bytes).
    in.aligned_.resize((in.header_.size() + 7) / 8);
    std::memcpy(in.aligned_.data(), in.header_.data(), in.header_.size());
  }
  absl::Span<const uint8_t> header =
      in.aligned_.empty()
          ? absl::Span<const uint8_t>(static_cast<const uint8_t*>(in.header_.data()),
                                      in.header_.size())
          : absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(in.aligned_.data()),
                                      in.header_.size());
  absl::StatusOr<const msg::Envelope*> env = VerifyEnvelope(header);
  if (!env.ok()) {
    if (env.status().code() == absl::StatusCode::kFailedPrecondition) {
      // Verified but another protocol version: tell a requester why.
      const msg::Envelope* raw = msg::GetEnvelope(header.data());
      if (raw->request_id() != 0) {
        OutMessage err = MakeError(self(), raw->request_id(), env.status());
        Outgoing out;
        out.peer = in.peer_;
        out.route = in.route_;
        out.message = std::move(err);
        out.deadline = absl::Now() + options_.send_timeout;
        outbox_.push_back(std::move(out));
      }
      if (options_.log) options_.log->get()->warn("{}", env.status().ToString());
    }
    ++local_stats_.dropped_invalid;
    return;
  }
  const uint64_t expected = (*env)->payload_size();
  if ((n == 2) != (expected > 0) || (n == 2 && in.payload_.size() != expected)) {
    ++local_stats_.dropped_invalid;
    if (options_.log) {
      options_.log->get()->warn("dropped message: payload frame of {} bytes, header says {}",
                            n == 2 ? in.payload_.size() : 0, expected);
    }
    return;
  }
  in.envelope_ = *env;
  const uint64_t reply_to = (*env)->reply_to();
  if (reply_to != 0) {
    if ((*env)->body_type() == msg::Body::Error) {
      Complete(reply_to, StatusFromError((*env)->body_as_Error()));
    } else {
      Complete(reply_to, std::move(in));
    }
    return;
  }
  if (handler_) handler_(std::move(in));
}

void Transport::ReadRouter() {
  for (size_t i = 0; i < kMaxReadsPerWake; ++i) {
    std::vector<zmq::message_t> frames;
    std::optional<size_t> got;
    try {
      got = zmq::recv_multipart(*router_, std::back_inserter(frames), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      return;
    }
    if (!got) return;
    if (frames.size() < 2) {
      ++local_stats_.dropped_invalid;
      continue;
    }
    std::string route = frames[0].to_string();
    Dispatch(frames, 1, std::move(route), -1);
  }
}

void Transport::ReadDealer(int peer) {
  for (size_t i = 0; i < kMaxReadsPerWake; ++i) {
    std::vector<zmq::message_t> frames;
    std::optional<size_t> got;
    try {
      got = zmq::recv_multipart(*dealers_[peer], std::back_inserter(frames),
                                zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      return;
    }
    if (!got) return;
    Dispatch(frames, 0, std::string(), peer);
  }
}

void Transport::Run() {
  io_thread_id_.store(std::this_thread::get_id());
  std::vector<Timer> timers;
  {
    absl::MutexLock lock(&mu_);
    timers = timers_;
  }
  const absl::Time start = absl::Now();
  for (auto& t : timers) t.next = start + t.period;
  std::vector<zmq::pollitem_t> items;
  while (true) {
    DrainCommands();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
    }
    FlushOutbox();
    absl::Time now = absl::Now();
    ExpireDeadlines(now);
    for (auto& t : timers) {
      if (now >= t.next) {
        t.fn();
        t.next = now + t.period;
      }
    }
    absl::Time wake_at = now + absl::Milliseconds(100);
    for (const auto& t : timers) wake_at = std::min(wake_at, t.next);
    for (const auto& [id, p] : pending_) wake_at = std::min(wake_at, p.deadline);
    if (!outbox_.empty()) wake_at = std::min(wake_at, now + absl::Milliseconds(2));
    const int64_t timeout_ms =
        std::max<int64_t>(0, absl::ToInt64Milliseconds(wake_at - now) + 1);
    {
      absl::MutexLock lock(&mu_);
      stats_ = local_stats_;
    }

    items.clear();
    items.push_back(zmq::pollitem_t{nullptr, wake_fd_, ZMQ_POLLIN, 0});
    if (router_) items.push_back(zmq::pollitem_t{router_->handle(), 0, ZMQ_POLLIN, 0});
    for (auto& d : dealers_) items.push_back(zmq::pollitem_t{d->handle(), 0, ZMQ_POLLIN, 0});
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(timeout_ms));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR && options_.log) options_.log->get()->error("poll: {}", e.what());
      continue;
    }
    size_t idx = 0;
    if (items[idx++].revents & ZMQ_POLLIN) {
      uint64_t value;
      ssize_t r = read(wake_fd_, &value, sizeof(value));
      (void)r;
    }
    if (router_ && (items[idx++].revents & ZMQ_POLLIN)) ReadRouter();
    // Dealers added by handlers during this iteration are polled next time.
    const size_t ndealers = items.size() - idx;
    for (size_t d = 0; d < ndealers; ++d) {
      if (items[idx + d].revents & ZMQ_POLLIN) ReadDealer(static_cast<int>(d));
    }
  }
  // Flush what can be flushed (e.g. a final Shutdown or Ack), then fail what is left.
  FlushOutbox();
  std::vector<uint64_t> ids;
  for (const auto& [id, p] : pending_) ids.push_back(id);
  for (uint64_t id : ids) Complete(id, absl::UnavailableError("transport stopped"));
  outbox_.clear();
  {
    absl::MutexLock lock(&mu_);
    stats_ = local_stats_;
    // Run posted commands that raced with Stop so their waiters wake (Connect).
  }
  DrainCommands();
  router_.reset();
  dealers_.clear();
  io_thread_id_.store(std::thread::id());
}

}  // namespace adaps
