// Building and checking adaps messages (schemas/adaps.fbs).
//
// An OutMessage is a finished Envelope plus an optional shared payload (frame 1) that the
// transport sends without copying. VerifyEnvelope runs the FlatBuffers Verifier and the
// protocol-version check on every received header; nothing reads a header before it.
// Thread-safety: plain values; OutMessage payloads are immutable and shareable.
#ifndef ADAPS_COMMON_MESSAGES_H_
#define ADAPS_COMMON_MESSAGES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/compressor.h"
#include "flatbuffers/flatbuffers.h"
#include "schemas/adaps_generated.h"

namespace adaps {

inline constexpr uint16_t kProtocolVersion = 1;

using Bytes = std::vector<uint8_t>;
using SharedBytes = std::shared_ptr<const Bytes>;

// Slice keys (schemas/README.md): slice `index` of tensor `tensor_id` has the key
// (tensor_id << 24) | index. The one place that spells the rule. kInvalidArgument when
// `index` does not fit in 24 bits.
inline constexpr int kSliceIndexBits = 24;
inline constexpr uint64_t kMaxSlicesPerTensor = uint64_t{1} << kSliceIndexBits;
absl::StatusOr<uint64_t> SliceKey(uint32_t tensor_id, uint64_t index);

// The schema's payload kind and the codec's kind are one numbering (the static_asserts in
// messages.cc); these are the only conversions between them.
msg::PayloadKind PayloadKindFor(CompressorKind kind);
// kInvalidArgument for a payload kind the codec does not know (a newer peer, a forged push).
absl::StatusOr<CompressorKind> CompressorKindFor(msg::PayloadKind kind);

// Who sends: put in every envelope.
struct Sender {
  msg::Role role = msg::Role::Unknown;
  int rank = -1;
};

struct OutMessage {
  flatbuffers::DetachedBuffer header;
  SharedBytes payload;  // may be null: no frame 1
};

// Finishes `fbb` as an Envelope around `body`. `payload` (may be null) becomes frame 1 and
// its size is recorded in the header.
template <typename T>
OutMessage FinishEnvelope(flatbuffers::FlatBufferBuilder& fbb, const Sender& sender,
                          flatbuffers::Offset<T> body, uint64_t request_id, uint64_t reply_to,
                          SharedBytes payload = nullptr) {
  msg::EnvelopeBuilder eb(fbb);
  eb.add_version(kProtocolVersion);
  eb.add_sender_role(sender.role);
  eb.add_sender_rank(sender.rank);
  eb.add_request_id(request_id);
  eb.add_reply_to(reply_to);
  eb.add_payload_size(payload ? payload->size() : 0);
  eb.add_body_type(msg::BodyTraits<T>::enum_value);
  eb.add_body(body.Union());
  fbb.Finish(eb.Finish());
  return OutMessage{fbb.Release(), std::move(payload)};
}

// Convenience builders for the small bodies.
OutMessage MakeAck(const Sender& sender, uint64_t reply_to);
OutMessage MakeError(const Sender& sender, uint64_t reply_to, const absl::Status& status);

// `header` must be 8-byte aligned (FlatBuffers reads it in place; the transport copies
// frames that libzmq hands over unaligned).
// kDataLoss when the bytes are not a valid Envelope (Verifier) or carry no body;
// kFailedPrecondition when the protocol version differs (the message names both).
absl::StatusOr<const msg::Envelope*> VerifyEnvelope(absl::Span<const uint8_t> header);

// The status an Error body stands for (never OK: a code of 0 becomes kUnknown).
absl::Status StatusFromError(const msg::Error* error);

// Copies floats into a new shared byte buffer (raw little-endian float32).
SharedBytes FloatsToBytes(absl::Span<const float> values);

}  // namespace adaps

#endif  // ADAPS_COMMON_MESSAGES_H_
