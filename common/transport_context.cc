// TransportContext: the ZeroMQ context of a process and its ZAP (CURVE) handler.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/transport.h"
#include "zmq_addon.hpp"

namespace adaps {

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

}  // namespace adaps
