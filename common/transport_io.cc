// Transport, the I/O thread's part: the loop, sending, receiving, dispatching and deadlines.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/transport.h"
#include "common/transport_internal.h"
#include "zmq_addon.hpp"

namespace adaps {

using transport_internal::FromZmq;
using transport_internal::kMaxReadsPerWake;
using transport_internal::ZeroCopy;

namespace {

constexpr char kConnectionLostPayload[] = "adaps.dev/transport/connection-lost";

// Reads the messages waiting on `socket` without blocking (at most kMaxReadsPerWake, so that
// one busy socket does not starve the others) and hands each one's frames to `handle`.
template <typename Handle>
void ReadWaiting(zmq::socket_t& socket, Handle&& handle) {
  for (size_t i = 0; i < kMaxReadsPerWake; ++i) {
    std::vector<zmq::message_t> frames;
    std::optional<size_t> got;
    try {
      got = zmq::recv_multipart(socket, std::back_inserter(frames), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      return;
    }
    if (!got) return;
    handle(frames);
  }
}

}  // namespace

bool IsConnectionLost(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable &&
         status.GetPayload(kConnectionLostPayload).has_value();
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
    if (reconnecting_[out.peer]) return false;  // kept in the outbox until it is up
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
  if (outbox_.empty()) return;
  // A connection that closed is accounted for before anything is handed to its successor
  // (else a request sent on the new connection would be failed for the old one's close):
  // the monitors of the peers with something to send are read first.
  flush_peers_.clear();
  for (const Outgoing& o : outbox_) {
    if (o.peer >= 0 && static_cast<size_t>(o.peer) < monitors_.size()) {
      flush_peers_.push_back(o.peer);
    }
  }
  std::sort(flush_peers_.begin(), flush_peers_.end());
  flush_peers_.erase(std::unique(flush_peers_.begin(), flush_peers_.end()), flush_peers_.end());
  for (int peer : flush_peers_) ReadMonitor(peer);
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
  ReadWaiting(*router_, [this](std::vector<zmq::message_t>& frames) {
    if (frames.size() < 2) {
      ++local_stats_.dropped_invalid;
      return;
    }
    std::string route = frames[0].to_string();
    Dispatch(frames, 1, std::move(route), -1);
  });
}

void Transport::ReadDealer(int peer) {
  ReadWaiting(*dealers_[peer], [this, peer](std::vector<zmq::message_t>& frames) {
    Dispatch(frames, 0, std::string(), peer);
  });
}

void Transport::ReadMonitor(int peer) {
  ReadWaiting(*monitors_[peer], [this, peer](std::vector<zmq::message_t>& frames) {
    // Frame 0: the event (16 bits) and its value (32 bits); frame 1: the endpoint.
    uint16_t event = 0;
    if (!frames.empty() && frames[0].size() >= sizeof(event)) {
      std::memcpy(&event, frames[0].data(), sizeof(event));
    }
    if (event == ZMQ_EVENT_DISCONNECTED) {
      reconnecting_[peer] = 1;  // before the callers of the lost requests ask again
      ConnectionLost(peer);
    } else if (event == ZMQ_EVENT_CONNECTED) {
      // A new TCP connection, at least reconnect_ivl after the close: by now the DEALER
      // has the old pipe's termination, which it handles before it takes any send.
      reconnecting_[peer] = 0;
    }
  });
}

void Transport::ConnectionLost(int peer) {
  ++local_stats_.connections_lost;
  // What is still in the outbox was never handed to the closed connection: it goes on the
  // next one. Everything else pending to this peer went into the closed one, or is being
  // answered on it, and no answer will come.
  std::vector<uint64_t> lost;
  for (const auto& [id, p] : pending_) {
    if (p.peer != peer) continue;
    const bool queued = std::any_of(outbox_.begin(), outbox_.end(),
                                    [id = id](const Outgoing& o) { return o.request_id == id; });
    if (!queued) lost.push_back(id);
  }
  if (!lost.empty() && options_.log) {
    options_.log->get()->warn("connection to peer {} lost with {} request(s) in it: failing them",
                              peer, lost.size());
  }
  absl::Status status = absl::UnavailableError(absl::StrCat(
      "connection to peer ", peer, " lost before the answer came (its process died or restarted)"));
  status.SetPayload(kConnectionLostPayload, absl::Cord("1"));
  for (uint64_t id : lost) Complete(id, status);
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
    const size_t ndealers = dealers_.size();
    for (auto& d : dealers_) items.push_back(zmq::pollitem_t{d->handle(), 0, ZMQ_POLLIN, 0});
    for (size_t d = 0; d < ndealers; ++d) {
      items.push_back(zmq::pollitem_t{monitors_[d]->handle(), 0, ZMQ_POLLIN, 0});
    }
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
    // Dealers added by handlers during this iteration are polled next time. Answers are
    // read before the monitors: one that arrived before its connection closed counts.
    for (size_t d = 0; d < ndealers; ++d) {
      if (items[idx + d].revents & ZMQ_POLLIN) ReadDealer(static_cast<int>(d));
    }
    for (size_t d = 0; d < ndealers; ++d) {
      if (items[idx + ndealers + d].revents & ZMQ_POLLIN) ReadMonitor(static_cast<int>(d));
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
  for (auto& d : dealers_) zmq_socket_monitor(d->handle(), nullptr, 0);
  monitors_.clear();
  reconnecting_.clear();
  dealers_.clear();
  io_thread_id_.store(std::thread::id());
}

}  // namespace adaps
