#include "common/cluster_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace adaps {

std::string ProbeEndpoint(const std::string& endpoint, absl::Duration timeout) {
  constexpr absl::string_view kTcp = "tcp://";
  if (!absl::StartsWith(endpoint, kTcp)) return "";
  const std::string rest = endpoint.substr(kTcp.size());
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return "no port in the address";
  std::string host = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::StrCat("unknown host '", host, "' (", ::gai_strerror(rc), ")");
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const int ready = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
        socklen_t len = sizeof(err);
        if (ready <= 0) {
          err = ETIMEDOUT;
        } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
          err = errno;
        }
      }
    }
    ::close(fd);
    if (err == 0) {
      ::freeaddrinfo(found);
      return "";
    }
    why = err == ETIMEDOUT
              ? absl::StrCat("no answer within ", absl::FormatDuration(timeout))
              : std::string(std::strerror(err));
    for (char& c : why) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  ::freeaddrinfo(found);
  return why;
}

absl::Status ShutdownStatus(const msg::Shutdown& shutdown) {
  const std::string reason = shutdown.reason() ? shutdown.reason()->str() : "";
  const int code = shutdown.code();
  if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::OkStatus();
  }
  return absl::Status(static_cast<absl::StatusCode>(code), absl::StrCat("cluster stopped: ", reason));
}

ClusterClient::ClusterClient(Transport& transport, RoleLog& log,
                             ClusterClientOptions options, Callbacks callbacks)
    : transport_(transport),
      log_(log),
      options_(std::move(options)),
      callbacks_(std::move(callbacks)),
      address_(options_.address),
      instance_([] {
        std::random_device device;
        const uint64_t v = (uint64_t{device()} << 32) ^ device();
        return v == 0 ? 1 : v;
      }()) {
  transport_.AddTimer(absl::Milliseconds(100), [this] { Heartbeat(); });
}

OutMessage ClusterClient::RegisterMessage(uint64_t request_id, int rank, uint32_t epoch) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto steps = fbb.CreateVector(options_.checkpoint_steps ? options_.checkpoint_steps()
                                                          : std::vector<uint64_t>{});
  auto body = msg::CreateRegister(fbb, transport_.self().role, fbb.CreateString(address_),
                                  fbb.CreateString(options_.identity), rank, epoch, steps,
                                  fbb.CreateString(options_.optimizer), instance_);
  return FinishEnvelope(fbb, transport_.self(), body, request_id, 0);
}

absl::StatusOr<InMessage> ClusterClient::Register(std::function<absl::Status()> on_registered) {
  if (options_.scheduler.empty()) return absl::InvalidArgumentError("no scheduler address");
  if (options_.register_timeout <= absl::ZeroDuration() ||
      options_.scheduler_grace <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("register timeout and scheduler grace must be positive");
  }
  absl::StatusOr<int> peer = transport_.Connect(options_.scheduler);
  if (!peer.ok()) return peer.status();
  scheduler_peer_.store(*peer);

  auto promise = std::make_shared<std::promise<absl::StatusOr<InMessage>>>();
  auto future = promise->get_future();
  const absl::Time register_deadline = absl::Now() + options_.register_timeout;
  // Sent again when the connection closes before the answer (a scheduler restarted while the
  // job forms): the new process never saw the first one.
  auto send = std::make_shared<std::function<void()>>();
  std::weak_ptr<std::function<void()>> weak_send = send;
  *send = [this, promise, peer = *peer, register_deadline, weak_send,
           on_registered = std::move(on_registered)] {
    const uint64_t id = transport_.NewRequestId();
    transport_.Request(
        peer, id, RegisterMessage(id, options_.claim_rank, /*epoch=*/0), register_deadline,
        [this, promise, register_deadline, again = weak_send.lock(),
         on_registered](absl::StatusOr<InMessage> reply) {
          if (IsConnectionLost(reply.status()) && absl::Now() < register_deadline && again) {
            log_.get()->warn("the scheduler's connection closed before it answered (restarted?): "
                             "registering again");
            (*again)();
            return;
          }
          if (reply.ok() && reply->envelope()->body_type() != msg::Body::ClusterView) {
            reply = absl::DataLossError("the scheduler answered Register with something else");
          }
          if (reply.ok()) {
            last_heard_ = absl::Now();
            OnView(*reply->envelope()->body_as_ClusterView());
            registered_.store(true);
            if (on_registered) {
              if (absl::Status st = on_registered(); !st.ok()) reply = st;
            }
          }
          promise->set_value(std::move(reply));
        });
  };
  (*send)();
  // Silence is the worst answer to a mistyped address: probe it at once, then say every
  // few seconds what we are waiting for and why, while the deadline runs.
  const absl::Time deadline = register_deadline;
  const absl::Time start = absl::Now();
  std::string cause;
  absl::Duration tick = absl::Seconds(1);
  while (future.wait_for(std::chrono::milliseconds(absl::ToInt64Milliseconds(tick))) !=
         std::future_status::ready) {
    tick = absl::Seconds(3);
    if (absl::Now() > deadline + absl::Seconds(5)) {
      return absl::DeadlineExceededError("register request not answered");  // a transport bug
    }
    cause = ProbeEndpoint(options_.scheduler, absl::Seconds(1));
    const std::string waited = absl::FormatDuration(absl::Trunc(absl::Now() - start,
                                                                absl::Seconds(1)));
    if (!cause.empty()) {
      log_.get()->warn("scheduler at {} not reachable after {}: {}; retrying until {} have passed",
                       options_.scheduler, waited, cause,
                       absl::FormatDuration(options_.register_timeout));
    } else {
      log_.get()->info("scheduler at {} reachable; after {} still waiting for the other nodes",
                       options_.scheduler, waited);
    }
  }
  absl::StatusOr<InMessage> reply = future.get();
  if (!reply.ok() && (reply.status().code() == absl::StatusCode::kUnavailable ||
                      reply.status().code() == absl::StatusCode::kDeadlineExceeded)) {
    if (cause.empty()) cause = ProbeEndpoint(options_.scheduler, absl::Seconds(1));
    if (!cause.empty()) {
      return absl::UnavailableError(absl::StrCat("scheduler at ", options_.scheduler,
                                                 " not reachable: ", cause));
    }
    if (reply.status().code() == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(absl::StrCat("scheduler at ", options_.scheduler,
                                                 " unreachable: ", reply.status().message()));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "no cluster view from the scheduler at ", options_.scheduler, " within ",
        absl::FormatDuration(options_.register_timeout),
        " (it was reachable: the other nodes did not all register)"));
  }
  return reply;
}

bool ClusterClient::Handle(const InMessage& in) {
  ADAPS_DCHECK_ON_IO_THREAD(&transport_);
  const msg::Envelope* env = in.envelope();
  const msg::Body type = env->body_type();
  if (type != msg::Body::ClusterView && type != msg::Body::Shutdown) return false;
  const int peer = scheduler_peer_.load();
  if (peer < 0 || in.peer() != peer) {
    if (refused_.fetch_add(1) == 0) {
      log_.get()->warn("refused a {} that did not come from the scheduler (further ones are "
                       "only counted)",
                       msg::EnumNameBody(type));
    }
    if (env->request_id() != 0) {
      transport_.Reply(in, MakeError(transport_.self(), env->request_id(),
                                     absl::PermissionDeniedError(absl::StrCat(
                                         msg::EnumNameBody(type),
                                         " is accepted only from the scheduler"))));
    }
    return true;
  }
  last_heard_ = absl::Now();
  if (type == msg::Body::ClusterView) {
    OnView(*env->body_as_ClusterView());
  } else {
    const msg::Shutdown* sd = env->body_as_Shutdown();
    log_.get()->info("the scheduler shut the cluster down: {}",
                     sd->reason() ? sd->reason()->str() : "");
    Finish(ShutdownStatus(*sd));
  }
  return true;
}

void ClusterClient::OnView(const msg::ClusterView& view) {
  ADAPS_DCHECK_ON_IO_THREAD(&transport_);
  if (view.epoch() < epoch_.load()) return;
  epoch_.store(view.epoch());
  if (view.your_rank() >= 0 && transport_.rank() != view.your_rank()) {
    transport_.SetRank(view.your_rank());
    log_.SetRank(view.your_rank());
  }
  heartbeat_interval_ = absl::Milliseconds(std::max<uint32_t>(10, view.heartbeat_interval_ms()));
  if (callbacks_.on_view) callbacks_.on_view(view);
}

void ClusterClient::Finish(const absl::Status& status) {
  if (finished_.exchange(true)) return;
  if (callbacks_.on_shutdown) callbacks_.on_shutdown(status);
}

void ClusterClient::Heartbeat() {
  ADAPS_DCHECK_ON_IO_THREAD(&transport_);
  if (!registered_.load() || finished_.load() || left_.load()) return;
  const absl::Time now = absl::Now();
  if (now - last_heartbeat_sent_ < heartbeat_interval_) return;
  last_heartbeat_sent_ = now;
  if (now - last_heard_ > options_.scheduler_grace) {
    log_.get()->error("the scheduler at {} has been silent for {}: giving up",
                      options_.scheduler, absl::FormatDuration(now - last_heard_));
    Finish(absl::UnavailableError(absl::StrCat("lost the scheduler at ", options_.scheduler,
                                               ": silent for ",
                                               absl::FormatDuration(now - last_heard_))));
    return;
  }
  flatbuffers::FlatBufferBuilder fbb(64);
  auto steps = fbb.CreateVector(options_.checkpoint_steps ? options_.checkpoint_steps()
                                                          : std::vector<uint64_t>{});
  auto body = msg::CreateHeartbeat(fbb, epoch_.load(), steps,
                                   options_.residue_norm ? options_.residue_norm() : -1.0f);
  const uint64_t id = transport_.NewRequestId();
  transport_.Request(scheduler_peer_.load(), id,
                     FinishEnvelope(fbb, transport_.self(), body, id, 0),
                     now + heartbeat_interval_ * 2, [this](absl::StatusOr<InMessage> reply) {
                       if (reply.ok()) {
                         last_heard_ = absl::Now();
                         const msg::HeartbeatAck* ack = reply->envelope()->body_as_HeartbeatAck();
                         if (ack != nullptr && options_.on_common_step) {
                           options_.on_common_step(ack->common_step());
                         }
                       } else if (reply.status().code() ==
                                  absl::StatusCode::kFailedPrecondition) {
                         Reregister();  // a restarted scheduler that does not know us
                       } else if (reply.status().code() == absl::StatusCode::kAborted) {
                         // Declared dead while we were stalled: the cluster went on.
                         log_.get()->error("the scheduler says: {}", std::string(reply.status().message()));
                         Finish(reply.status());
                       }
                     });
}

void ClusterClient::Reregister() {
  ADAPS_DCHECK_ON_IO_THREAD(&transport_);
  if (reregistering_ || finished_.load()) return;
  reregistering_ = true;
  log_.get()->warn("the scheduler does not know this node: registering again as rank {}",
                   transport_.rank());
  const uint64_t id = transport_.NewRequestId();
  transport_.Request(scheduler_peer_.load(), id,
                     RegisterMessage(id, transport_.rank(), epoch_.load()),
                     absl::Now() + options_.scheduler_grace,
                     [this](absl::StatusOr<InMessage> reply) {
                       reregistering_ = false;
                       if (!reply.ok() ||
                           reply->envelope()->body_type() != msg::Body::ClusterView) {
                         return;
                       }
                       last_heard_ = absl::Now();
                       OnView(*reply->envelope()->body_as_ClusterView());
                       log_.get()->info("registered again with the scheduler");
                     });
}

absl::Status ClusterClient::Leave(absl::Duration timeout) {
  const int peer = scheduler_peer_.load();
  if (peer < 0 || finished_.load() || left_.exchange(true)) return absl::OkStatus();
  flatbuffers::FlatBufferBuilder fbb(64);
  auto body = msg::CreateLeave(fbb);
  const uint64_t id = transport_.NewRequestId();
  auto promise = std::make_shared<std::promise<absl::Status>>();
  auto future = promise->get_future();
  transport_.Request(peer, id, FinishEnvelope(fbb, transport_.self(), body, id, 0),
                     absl::Now() + timeout, [promise](absl::StatusOr<InMessage> reply) {
                       promise->set_value(reply.status());
                     });
  if (future.wait_for(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout) + 2000)) !=
      std::future_status::ready) {
    return absl::DeadlineExceededError("leave not answered");
  }
  return future.get();
}

}  // namespace adaps
