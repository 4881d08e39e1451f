#include "common/messages.h"

#include <vector>

#include "gtest/gtest.h"

namespace adaps {
namespace {

OutMessage MakePush(uint16_t version) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = msg::CreatePush(fbb, 42, 7, msg::PayloadKind::AdaComp);
  msg::EnvelopeBuilder eb(fbb);
  eb.add_version(version);
  eb.add_sender_role(msg::Role::Worker);
  eb.add_sender_rank(3);
  eb.add_request_id(9);
  eb.add_body_type(msg::Body::Push);
  eb.add_body(body.Union());
  fbb.Finish(eb.Finish());
  return OutMessage{fbb.Release(), nullptr};
}

absl::Span<const uint8_t> Span(const OutMessage& m) {
  return absl::MakeConstSpan(m.header.data(), m.header.size());
}

TEST(Messages, VerifiedEnvelopeReadsBack) {
  auto payload = std::make_shared<Bytes>(Bytes{1, 2, 3});
  flatbuffers::FlatBufferBuilder fbb;
  auto body = msg::CreatePullRequest(fbb, 5, 6, 4, msg::PullFormat::Recompressed);
  OutMessage m = FinishEnvelope(fbb, Sender{msg::Role::Worker, 2}, body, 11, 0, payload);
  auto env = VerifyEnvelope(Span(m));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ((*env)->version(), kProtocolVersion);
  EXPECT_EQ((*env)->sender_rank(), 2);
  EXPECT_EQ((*env)->request_id(), 11u);
  EXPECT_EQ((*env)->payload_size(), 3u);
  ASSERT_EQ((*env)->body_type(), msg::Body::PullRequest);
  EXPECT_EQ((*env)->body_as_PullRequest()->min_version(), 6u);
  EXPECT_EQ((*env)->body_as_PullRequest()->format(), msg::PullFormat::Recompressed);
}

TEST(Messages, GarbageFailsVerificationAsDataLoss) {
  std::vector<uint8_t> garbage(64);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<uint8_t>(i * 37 + 11);
  EXPECT_EQ(VerifyEnvelope(garbage).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(VerifyEnvelope({}).status().code(), absl::StatusCode::kDataLoss);
}

TEST(Messages, TruncatedEnvelopeFailsVerification) {
  OutMessage m = MakePush(kProtocolVersion);
  for (size_t len = 0; len < m.header.size(); len += 3) {
    EXPECT_FALSE(VerifyEnvelope(Span(m).subspan(0, len)).ok()) << "length " << len;
  }
}

TEST(Messages, OtherProtocolVersionIsAClearError) {
  OutMessage m = MakePush(kProtocolVersion + 1);
  absl::Status s = VerifyEnvelope(Span(m)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("protocol version"), absl::string_view::npos) << s;
}

TEST(Messages, EnvelopeWithoutBodyIsRejected) {
  flatbuffers::FlatBufferBuilder fbb;
  msg::EnvelopeBuilder eb(fbb);
  eb.add_version(kProtocolVersion);
  fbb.Finish(eb.Finish());
  auto buf = fbb.Release();
  EXPECT_EQ(VerifyEnvelope(absl::MakeConstSpan(buf.data(), buf.size())).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(Messages, ErrorBodyBecomesItsStatus) {
  OutMessage m = MakeError(Sender{}, 5, absl::InvalidArgumentError("bad key"));
  auto env = VerifyEnvelope(Span(m));
  ASSERT_TRUE(env.ok());
  absl::Status s = StatusFromError((*env)->body_as_Error());
  EXPECT_EQ(s, absl::InvalidArgumentError("bad key"));
}

TEST(SliceKey, PutsTheTensorAbove24BitsOfSliceIndex) {
  EXPECT_EQ(*SliceKey(0, 0), 0u);
  EXPECT_EQ(*SliceKey(1, 0), uint64_t{1} << 24);
  EXPECT_EQ(*SliceKey(3, 5), (uint64_t{3} << 24) | 5);
  EXPECT_EQ(*SliceKey(0xffffffffu, (1u << 24) - 1), (uint64_t{0xffffffffu} << 24) | 0xffffff);
}

TEST(SliceKey, IndexOf24BitsOrMoreIsRejected) {
  EXPECT_EQ(SliceKey(1, uint64_t{1} << 24).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SliceKey(1, ~uint64_t{0}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PayloadKind, ConvertsBothWaysForEveryCodecKind) {
  for (CompressorKind k : {CompressorKind::kDense, CompressorKind::kAdaComp,
                           CompressorKind::kTopK, CompressorKind::kSign}) {
    EXPECT_EQ(*CompressorKindFor(PayloadKindFor(k)), k);
  }
  EXPECT_EQ(PayloadKindFor(CompressorKind::kAdaComp), msg::PayloadKind::AdaComp);
  EXPECT_EQ(CompressorKindFor(static_cast<msg::PayloadKind>(4)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace adaps
