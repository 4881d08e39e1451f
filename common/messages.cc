#include "common/messages.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace adaps {

static_assert(static_cast<int>(msg::PayloadKind::Dense) ==
              static_cast<int>(CompressorKind::kDense));
static_assert(static_cast<int>(msg::PayloadKind::AdaComp) ==
              static_cast<int>(CompressorKind::kAdaComp));
static_assert(static_cast<int>(msg::PayloadKind::TopK) == static_cast<int>(CompressorKind::kTopK));
static_assert(static_cast<int>(msg::PayloadKind::Sign) == static_cast<int>(CompressorKind::kSign));
// Segmented (a fusion bucket's container, common/wire_codec.h) has no compressor kind.
static_assert(static_cast<int>(msg::PayloadKind::Segmented) ==
              static_cast<int>(CompressorKind::kSign) + 1);
static_assert(msg::PayloadKind::MAX == msg::PayloadKind::Segmented);

absl::StatusOr<uint64_t> SliceKey(uint32_t tensor_id, uint64_t index) {
  if (index >= kMaxSlicesPerTensor) {
    return absl::InvalidArgumentError(absl::StrCat("slice index ", index, " of tensor ",
                                                   tensor_id, " does not fit in 24 bits"));
  }
  return (uint64_t{tensor_id} << kSliceIndexBits) | index;
}

msg::PayloadKind PayloadKindFor(CompressorKind kind) {
  return static_cast<msg::PayloadKind>(static_cast<uint8_t>(kind));
}

absl::StatusOr<CompressorKind> CompressorKindFor(msg::PayloadKind kind) {
  if (static_cast<uint8_t>(kind) > static_cast<uint8_t>(msg::PayloadKind::Sign)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown payload kind ", static_cast<int>(kind)));
  }
  return static_cast<CompressorKind>(static_cast<uint8_t>(kind));
}

OutMessage MakeAck(const Sender& sender, uint64_t reply_to) {
  flatbuffers::FlatBufferBuilder fbb(128);
  auto body = msg::CreateAck(fbb);
  return FinishEnvelope(fbb, sender, body, 0, reply_to);
}

OutMessage MakeError(const Sender& sender, uint64_t reply_to, const absl::Status& status) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto body = msg::CreateError(fbb, static_cast<int>(status.code()),
                               fbb.CreateString(std::string(status.message())));
  return FinishEnvelope(fbb, sender, body, 0, reply_to);
}

absl::StatusOr<const msg::Envelope*> VerifyEnvelope(absl::Span<const uint8_t> header) {
  flatbuffers::Verifier verifier(header.data(), header.size(), /*max_depth=*/32,
                                 /*max_tables=*/100000);
  if (header.empty() || !msg::VerifyEnvelopeBuffer(verifier)) {
    return absl::DataLossError(
        absl::StrCat("message header of ", header.size(), " bytes failed verification"));
  }
  const msg::Envelope* env = msg::GetEnvelope(header.data());
  if (env->version() != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("protocol version mismatch: peer speaks version ", env->version(),
                     ", this build speaks version ", kProtocolVersion));
  }
  if (env->body_type() == msg::Body::NONE || env->body() == nullptr) {
    return absl::DataLossError("message has no body");
  }
  return env;
}

absl::Status StatusFromError(const msg::Error* error) {
  if (error == nullptr) return absl::UnknownError("malformed error reply");
  int code = error->code();
  if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    code = static_cast<int>(absl::StatusCode::kUnknown);
  }
  return absl::Status(static_cast<absl::StatusCode>(code),
                      error->message() ? error->message()->str() : "");
}

SharedBytes FloatsToBytes(absl::Span<const float> values) {
  auto bytes = std::make_shared<Bytes>(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(bytes->data(), values.data(), bytes->size());
  return bytes;
}

}  // namespace adaps
