// The ZeroMQ transport of every adaps process.
//
// One Transport per role object. It owns one I/O thread, and that thread owns every socket:
// an optional ROUTER (servers, scheduler) bound to `bind_endpoint`, and one DEALER per
// connected peer (scheduler, servers). Other threads hand work to the I/O thread through a
// closable command queue woken by an eventfd; handlers, reply callbacks and timers all run
// on the I/O thread and must not block.
//
// Messages are one Envelope frame plus an optional payload frame (common/messages.h).
// Every received header is verified; a message that fails verification, has the wrong
// frame count or a payload size other than its header says is dropped and counted; a
// request from a peer with another protocol version is answered with an Error.
//
// Requests carry a deadline: the callback runs exactly once, with the reply, the peer's
// Error as a status, kUnavailable when the message could not be handed to a connected peer
// before the deadline (peer gone / never there), when the connection it was handed to
// closed before the answer came (ZeroMQ does not send a message again on the next
// connection: the peer's process died, or a new one took its address) or when
// FailPeer/Stop ran, or kDeadlineExceeded when it was sent but no answer came in time.
// Each DEALER is watched through a ZeroMQ socket monitor for that.
//
// Thread-safety: all public methods are thread-safe. Start/Stop from one owner thread.
#ifndef ADAPS_COMMON_TRANSPORT_H_
#define ADAPS_COMMON_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/messages.h"
#include "spdlog/spdlog.h"
#include "zmq.hpp"

// ADAPS_DCHECK_ON_IO_THREAD(transport): state owned by a transport's I/O thread is touched
// only there (tensorpipe's inLoop()). `transport` is a Transport* or a Transport&-like
// pointer expression. Active when NDEBUG is not defined or ADAPS_DCHECKS is (the build
// defines it whenever the tests are built, cmake/Options.cmake); a violation is a programmer
// error: it prints where and aborts.
// ADAPS_DCHECK(condition, what): the same for any other rule of this kind (an engine
// thread's shards, server/engine_thread.h); `condition` is not evaluated when inactive.
#if !defined(NDEBUG) || defined(ADAPS_DCHECKS)
#define ADAPS_DCHECK(condition, what)                                   \
  do {                                                                  \
    if (!(condition)) ::adaps::internal::DcheckFailed(__FILE__, __LINE__, what); \
  } while (false)
#define ADAPS_DCHECK_ON_IO_THREAD(transport)                                        \
  do {                                                                              \
    if (!(transport)->OnIoThread()) {                                               \
      ::adaps::internal::DcheckFailed(__FILE__, __LINE__, "not on the I/O thread"); \
    }                                                                               \
  } while (false)
#else
#define ADAPS_DCHECK(condition, what) \
  do {                                \
  } while (false)
#define ADAPS_DCHECK_ON_IO_THREAD(transport) \
  do {                                       \
  } while (false)
#endif

namespace adaps {

namespace internal {
// Prints "file:line: what" to stderr and aborts. Only for the ADAPS_DCHECK macros.
[[noreturn]] void DcheckFailed(const char* file, int line, const char* what);
}  // namespace internal

// A ZeroMQ context shared by the transports of one process (needed for inproc://).
// With CURVE it also runs the process's ZAP handler (libzmq allows one per context): a
// thread answering the authentication requests of every CURVE ROUTER of the context, each
// by its own ZAP domain and list of allowed client keys. Started by the first
// AllowClients, stopped in the destructor.
class TransportContext {
 public:
  explicit TransportContext(int io_threads = 1);
  ~TransportContext();
  zmq::context_t& get() { return ctx_; }

  // Registers the client public keys (Z85) a ROUTER with ZAP domain `domain` accepts.
  // kInvalidArgument for a malformed key; kUnavailable when the handler cannot start.
  absl::Status AllowClients(const std::string& domain, const std::vector<std::string>& keys);
  // Connections the ZAP handler refused so far.
  uint64_t refused() const { return refused_.load(); }

 private:
  void RunZap(zmq::socket_t* socket);

  zmq::context_t ctx_;
  absl::Mutex mu_;
  std::map<std::string, std::set<std::string>> allowed_ ABSL_GUARDED_BY(mu_);  // binary keys
  std::unique_ptr<zmq::socket_t> zap_socket_;
  std::thread zap_thread_;
  std::atomic<bool> zap_stop_{false};
  std::atomic<uint64_t> refused_{0};
};

// A received, verified message. Move-only; owns its frames.
class InMessage {
 public:
  InMessage() = default;
  InMessage(InMessage&&) = default;
  InMessage& operator=(InMessage&&) = default;

  const msg::Envelope* envelope() const { return envelope_; }
  absl::Span<const uint8_t> payload() const {
    return absl::MakeConstSpan(static_cast<const uint8_t*>(payload_.data()), payload_.size());
  }
  // ROUTER messages: the route to answer on. Empty for messages received on a DEALER.
  const std::string& route() const { return route_; }
  // DEALER messages: the peer id returned by Connect. -1 for ROUTER messages.
  int peer() const { return peer_; }
  size_t wire_bytes() const { return header_.size() + payload_.size(); }

 private:
  friend class Transport;
  zmq::message_t header_;
  std::vector<uint64_t> aligned_;  // aligned copy of a misaligned header (else empty)
  zmq::message_t payload_;
  const msg::Envelope* envelope_ = nullptr;
  std::string route_;
  int peer_ = -1;
};

// True for a request's kUnavailable that says the connection it was handed to closed before
// the answer came (the peer's process died or restarted): asking again may succeed at once.
bool IsConnectionLost(const absl::Status& status);

struct TransportStats {
  uint64_t messages_in = 0;
  uint64_t messages_out = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t dropped_invalid = 0;   // failed verification / frame checks
  uint64_t dropped_unsendable = 0;  // fire-and-forget that found no peer in time
  uint64_t late_replies = 0;      // replies to requests that had already completed
  uint64_t connections_lost = 0;  // DEALER connections that closed (their requests failed)
};

struct TransportOptions {
  Sender self;
  std::string bind_endpoint;                 // empty: no ROUTER
  std::shared_ptr<TransportContext> context;  // null: the transport makes its own
  const RoleLog* log = nullptr;               // null: no logging; must outlive the transport
  // How long a fire-and-forget message may wait for its peer before being dropped.
  absl::Duration send_timeout = absl::Seconds(5);
  // Largest frame the ROUTER accepts; a peer sending more is disconnected by libzmq before
  // the bytes are buffered. <= 0: no limit.
  int64_t max_message_bytes = 0;
  // CURVE (enabled when curve.enabled()): the ROUTER serves with the server key pair and
  // accepts only curve.allowed_clients; every DEALER authenticates with the client pair and
  // expects the server public key. Plaintext peers cannot connect to a CURVE socket.
  CurveKeys curve;
};

class Transport {
 public:
  using Handler = std::function<void(InMessage)>;
  using ReplyCallback = std::function<void(absl::StatusOr<InMessage>)>;

  // `handler` gets every message that is not a reply to one of our requests.
  Transport(TransportOptions options, Handler handler);
  ~Transport();  // Stop()
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Binds the ROUTER (if any) and starts the I/O thread. kUnavailable when the address is
  // in use or cannot be bound; kInvalidArgument for a malformed endpoint;
  // kFailedPrecondition when called twice.
  absl::Status Start();
  // Fails every pending request with kUnavailable, closes the sockets, joins the thread.
  void Stop();

  // The endpoint the ROUTER is bound to, with the real port (tcp://127.0.0.1:port=0 ->
  // tcp://127.0.0.1:41234). Empty before Start or without ROUTER.
  std::string bound_endpoint() const;

  // Connects a new DEALER to `endpoint`; returns its peer id. kInvalidArgument for a bad
  // endpoint; kFailedPrecondition when not running.
  absl::StatusOr<int> Connect(const std::string& endpoint);

  uint64_t NewRequestId() { return next_request_id_.fetch_add(1) + 1; }
  void SetRank(int rank) { rank_.store(rank); }
  int rank() const { return rank_.load(); }
  Sender self() const { return Sender{options_.self.role, rank_.load()}; }

  // Fire-and-forget to a DEALER peer or a ROUTER route.
  void Send(int peer, OutMessage message);
  void SendRoute(std::string route, OutMessage message);
  // Answers `to` (a request received on the ROUTER or a DEALER).
  void Reply(const InMessage& to, OutMessage message);

  // Sends a request built with `request_id` (from NewRequestId) and calls `callback` once.
  void Request(int peer, uint64_t request_id, OutMessage message, absl::Time deadline,
               ReplyCallback callback);

  // Runs `fn` on the I/O thread. Returns false when the transport is not running.
  bool Post(std::function<void()> fn);
  // Adds a periodic timer (runs on the I/O thread). Call before Start.
  void AddTimer(absl::Duration period, std::function<void()> fn);
  // Fails pending and queued requests to `peer` with `status` (e.g. peer declared dead).
  void FailPeer(int peer, const absl::Status& status);
  bool OnIoThread() const { return std::this_thread::get_id() == io_thread_id_.load(); }

  TransportStats stats() const;

 private:
  struct Pending {
    int peer;
    absl::Time deadline;
    ReplyCallback callback;
  };
  struct Outgoing {
    int peer = -1;       // >= 0: DEALER peer
    std::string route;   // else: ROUTER route
    OutMessage message;
    uint64_t request_id = 0;
    absl::Time deadline;
  };
  struct Timer {
    absl::Duration period;
    absl::Time next;
    std::function<void()> fn;
  };

  void Run();
  void Wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DrainCommands();
  bool TrySend(Outgoing& out);  // true when handed to ZeroMQ (or dropped for good)
  void FlushOutbox();
  void ReadRouter();
  void ReadDealer(int peer);
  void ReadMonitor(int peer);
  void ConnectionLost(int peer);
  void Dispatch(std::vector<zmq::message_t>& frames, size_t first, std::string route, int peer);
  void ExpireDeadlines(absl::Time now);
  void Complete(uint64_t request_id, absl::StatusOr<InMessage> result);
  void Enqueue(Outgoing out);

  const TransportOptions options_;
  const Handler handler_;
  std::shared_ptr<TransportContext> context_;
  std::atomic<uint64_t> next_request_id_{0};
  std::atomic<int> rank_;
  std::atomic<std::thread::id> io_thread_id_{};
  int wake_fd_ = -1;

  mutable absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  std::string bound_endpoint_ ABSL_GUARDED_BY(mu_);
  TransportStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<Timer> timers_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;

  // Owned by the I/O thread (after Start).
  std::unique_ptr<zmq::socket_t> router_;
  std::vector<std::unique_ptr<zmq::socket_t>> dealers_;
  // monitors_[p]: the PAIR socket receiving dealers_[p]'s disconnect events.
  std::vector<std::unique_ptr<zmq::socket_t>> monitors_;
  // reconnecting_[p]: dealers_[p]'s connection closed and no new one is up yet. Nothing is
  // sent to p meanwhile: ZeroMQ reports the close before the DEALER drops the closed
  // connection's pipe, and a message sent in between goes into that pipe and is lost.
  std::vector<char> reconnecting_;
  std::vector<int> flush_peers_;  // FlushOutbox: the peers it has something for (sorted)
  std::deque<Outgoing> outbox_;
  std::map<uint64_t, Pending> pending_;
  TransportStats local_stats_;
};

}  // namespace adaps

#endif  // ADAPS_COMMON_TRANSPORT_H_
