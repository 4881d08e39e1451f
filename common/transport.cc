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
#include "common/transport_internal.h"
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

namespace transport_internal {

namespace {
void FreeShared(void* /*data*/, void* hint) { delete static_cast<SharedBytes*>(hint); }
}  // namespace

zmq::message_t ZeroCopy(const SharedBytes& bytes) {
  auto* holder = new SharedBytes(bytes);
  return zmq::message_t(const_cast<uint8_t*>((*holder)->data()), (*holder)->size(), &FreeShared,
                        holder);
}

}  // namespace transport_internal

using transport_internal::FromZmq;

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
    Wake();
  }
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

void Transport::Wake() {  // with mu_ held (Post, Stop): wake_fd_ is open
  uint64_t one = 1;
  if (wake_fd_ >= 0) {
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
  }
}

bool Transport::Post(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (!running_ || stopping_) return false;
  commands_.push_back(std::move(fn));
  // Under mu_: Stop closes the eventfd under it, so this never writes to a closed (or
  // reused) descriptor. A non-blocking eventfd write does not wait.
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
      // A request handed to a connection that closes is lost with it: the monitor tells
      // the I/O thread, which fails those requests at once (ConnectionLost).
      static std::atomic<uint64_t> monitors{0};
      const std::string monitor_endpoint = absl::StrCat(
          "inproc://adaps-monitor-", reinterpret_cast<uintptr_t>(this), "-", monitors.fetch_add(1));
      if (zmq_socket_monitor(socket->handle(), monitor_endpoint.c_str(),
                             ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECTED) != 0) {
        throw zmq::error_t();
      }
      auto monitor = std::make_unique<zmq::socket_t>(context_->get(), zmq::socket_type::pair);
      monitor->set(zmq::sockopt::linger, 0);
      monitor->connect(monitor_endpoint);
      socket->connect(endpoint);
      dealers_.push_back(std::move(socket));
      monitors_.push_back(std::move(monitor));
      reconnecting_.push_back(0);
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

}  // namespace adaps
