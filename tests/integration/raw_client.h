// A hostile or forging client for the integration tests: a raw ZeroMQ DEALER that sends one
// request (header and optional payload frame) and waits for the answer to it, with none of
// the transport's bookkeeping, so a test can reach a scheduler's or a server's port the way
// a stranger on the network would.
#ifndef ADAPS_TESTS_INTEGRATION_RAW_CLIENT_H_
#define ADAPS_TESTS_INTEGRATION_RAW_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/messages.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace adaps {
namespace testing {

// What came back for one raw request: nothing (dropped), an answer, or an Error; the
// answer's header, 8-byte aligned (FlatBuffers needs it; libzmq keeps small frames inline,
// unaligned).
struct RawAnswer {
  bool answered = false;
  msg::Body body = msg::Body::NONE;
  absl::Status status;
  std::vector<uint64_t> header;
};

class RawClient {
 public:
  RawClient(zmq::context_t& ctx, const std::string& endpoint)
      : socket_(ctx, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(endpoint);
  }

  // Any frames, well-formed or not, as one multipart message.
  void SendFrames(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      (void)socket_.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore
                                                                     : zmq::send_flags::none);
    }
  }
  void Send(const OutMessage& m) {
    (void)socket_.send(zmq::buffer(m.header.data(), m.header.size()),
                       m.payload ? zmq::send_flags::sndmore : zmq::send_flags::none);
    if (m.payload) (void)socket_.send(zmq::buffer(*m.payload), zmq::send_flags::none);
  }

  // Waits for the answer to `request_id` (other messages are skipped).
  RawAnswer Wait(uint64_t request_id, absl::Duration timeout) {
    RawAnswer a;
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(socket_, std::back_inserter(frames))) continue;
      std::vector<uint64_t> aligned((frames[0].size() + 7) / 8);
      std::memcpy(aligned.data(), frames[0].data(), frames[0].size());
      auto env = VerifyEnvelope(absl::MakeConstSpan(
          reinterpret_cast<const uint8_t*>(aligned.data()), frames[0].size()));
      if (!env.ok() || (*env)->reply_to() != request_id) continue;
      a.answered = true;
      a.body = (*env)->body_type();
      if (a.body == msg::Body::Error) a.status = StatusFromError((*env)->body_as_Error());
      a.header = std::move(aligned);
      return a;
    }
    return a;
  }

  // Send, then Wait.
  RawAnswer Exchange(const OutMessage& m, uint64_t request_id,
                     absl::Duration timeout = absl::Seconds(3)) {
    Send(m);
    return Wait(request_id, timeout);
  }

  // The status of the answer to `request_id` (kDeadlineExceeded when none came within
  // `timeout`); its header in `reply` when given.
  absl::Status Call(const OutMessage& m, uint64_t request_id,
                    std::vector<uint64_t>* reply = nullptr,
                    absl::Duration timeout = absl::Seconds(5)) {
    RawAnswer a = Exchange(m, request_id, timeout);
    if (!a.answered) return absl::DeadlineExceededError("no answer");
    if (!a.status.ok()) return a.status;
    if (reply) *reply = std::move(a.header);
    return absl::OkStatus();
  }

 private:
  zmq::socket_t socket_;
};

}  // namespace testing
}  // namespace adaps

#endif  // ADAPS_TESTS_INTEGRATION_RAW_CLIENT_H_
