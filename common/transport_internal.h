// Helpers shared by the files of the transport (transport.cc: the API and sockets;
// transport_io.cc: the I/O thread's loop; transport_context.cc: the context and its ZAP
// handler). Not part of the public interface.
#ifndef ADAPS_COMMON_TRANSPORT_INTERNAL_H_
#define ADAPS_COMMON_TRANSPORT_INTERNAL_H_

#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/messages.h"
#include "zmq.hpp"

namespace adaps {
namespace transport_internal {

inline constexpr size_t kMaxReadsPerWake = 256;

// A ZeroMQ message that sends `bytes` without copying them (keeps them alive until sent).
zmq::message_t ZeroCopy(const SharedBytes& bytes);

// A libzmq error as a status: kInvalidArgument for a malformed endpoint, else kUnavailable.
inline absl::Status FromZmq(const zmq::error_t& e, absl::string_view what) {
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  if (e.num() == EINVAL || e.num() == EPROTONOSUPPORT || e.num() == ENODEV) {
    code = absl::StatusCode::kInvalidArgument;
  }
  return absl::Status(code, absl::StrCat(what, ": ", e.what()));
}

}  // namespace transport_internal
}  // namespace adaps

#endif  // ADAPS_COMMON_TRANSPORT_INTERNAL_H_
