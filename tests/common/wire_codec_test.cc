#include "common/wire_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/optimizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace adaps {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;

// An AdaComp update with about `density` of `n` elements sent, spread at random.
CompressedUpdate RandomAdaComp(std::mt19937& rng, uint32_t n, double density) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  CompressedUpdate up;
  up.kind = CompressorKind::kAdaComp;
  up.length = n;
  up.bin_size = 500;
  up.scale = 0.0123f;
  for (uint32_t i = 0; i < n; ++i) {
    if (u(rng) < density) {
      up.indices.push_back(i);
      up.negative.push_back(u(rng) < 0.5 ? 1 : 0);
    }
  }
  return up;
}

CompressedUpdate Compressed(CompressorKind kind, uint32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> g(n);
  for (float& v : g) v = normal(rng);
  CompressorOptions o;
  o.kind = kind;
  o.bin_size = 50;
  o.topk_fraction = 0.05;
  auto c = MakeCompressor(o);
  SliceState state(n);
  CompressedUpdate u;
  EXPECT_TRUE((*c)->Compress(g, state, u).ok());
  return u;
}

void ExpectSameUpdate(const CompressedUpdate& a, const CompressedUpdate& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.length, b.length);
  EXPECT_EQ(a.bin_size, b.bin_size);
  EXPECT_EQ(a.scale, b.scale);
  EXPECT_EQ(a.scale_neg, b.scale_neg);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.negative, b.negative);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.sign_bits, b.sign_bits);
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<CompressorKind, IndexCoding>> {};

TEST_P(RoundTrip, DecodeGivesBackWhatWasEncoded) {
  const auto [kind, coding] = GetParam();
  for (uint32_t n : {1u, 7u, 64u, 65u, 1000u, 100003u}) {
    const CompressedUpdate u = Compressed(kind, n, n);
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(EncodeUpdate(u, coding, &bytes).ok());
    CompressedUpdate back;
    ASSERT_TRUE(DecodeUpdate(bytes, &back).ok()) << "n=" << n;
    ExpectSameUpdate(u, back);
    // DecodeAdd agrees with DecompressAdd on the in-memory update.
    std::vector<float> a(n, 0.5f), b(n, 0.5f);
    ASSERT_TRUE(DecodeAdd(bytes, 0.5f, absl::MakeSpan(a)).ok());
    ASSERT_TRUE(DecompressAdd(u, 0.5f, absl::MakeSpan(b)).ok());
    EXPECT_EQ(a, b);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, RoundTrip,
    ::testing::Combine(::testing::Values(CompressorKind::kDense, CompressorKind::kAdaComp,
                                         CompressorKind::kTopK, CompressorKind::kSign),
                       ::testing::Values(IndexCoding::kRice, IndexCoding::kPlain32)),
    [](const ::testing::TestParamInfo<RoundTrip::ParamType>& info) {
      return std::string(CompressorKindName(std::get<0>(info.param))) +
             (std::get<1>(info.param) == IndexCoding::kRice ? "_rice" : "_plain32");
    });

TEST(WireCodec, DenseEncoderWritesWhatEncodeUpdateWrites) {
  for (size_t n : {0, 1, 127, 128, 20000}) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = 0.5f * static_cast<float>(i) - 3.0f;
    CompressedUpdate u;
    u.kind = CompressorKind::kDense;
    u.length = static_cast<uint32_t>(n);
    u.values = g;
    for (IndexCoding coding : {IndexCoding::kRice, IndexCoding::kPlain32}) {
      std::vector<uint8_t> expected, direct;
      ASSERT_TRUE(EncodeUpdate(u, coding, &expected).ok());
      ASSERT_TRUE(EncodeDense(g, coding, &direct).ok());
      EXPECT_EQ(direct, expected) << n;
    }
  }
}

TEST(WireCodec, DenseEncoderRejectsNanAndInfAnywhere) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (float b : bad) {
    for (size_t at : {size_t{0}, size_t{17}, size_t{999}}) {
      std::vector<float> g(1000, 1.0f);
      g[at] = b;
      std::vector<uint8_t> out = {1, 2, 3};
      const absl::Status s = EncodeDense(g, IndexCoding::kRice, &out);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << at;
      EXPECT_TRUE(out.empty());
    }
  }
}

TEST(WireCodec, RoundTripsExtremeGaps) {
  CompressedUpdate u;
  u.kind = CompressorKind::kAdaComp;
  u.length = std::numeric_limits<uint32_t>::max();
  u.bin_size = 7;
  u.scale = 1.0f;
  u.indices = {0, 1, 2, 1000, 1u << 31, std::numeric_limits<uint32_t>::max() - 1};
  u.negative = {1, 0, 1, 0, 1, 1};
  for (IndexCoding coding : {IndexCoding::kRice, IndexCoding::kPlain32}) {
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(EncodeUpdate(u, coding, &bytes).ok());
    CompressedUpdate back;
    ASSERT_TRUE(DecodeUpdate(bytes, &back).ok());
    ExpectSameUpdate(u, back);
  }
}

TEST(WireCodec, CompactEncodingIsUnder12BitsPerElementAtOnePercent) {
  std::mt19937 rng(5);
  size_t bytes_total = 0, sent = 0, plain_total = 0;
  for (int step = 0; step < 20; ++step) {
    const CompressedUpdate u = RandomAdaComp(rng, 200000, 0.01);
    std::vector<uint8_t> rice, plain;
    ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &rice).ok());
    ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kPlain32, &plain).ok());
    bytes_total += rice.size();
    plain_total += plain.size();
    sent += u.indices.size();
  }
  const double bits = 8.0 * bytes_total / sent;
  const double plain_bits = 8.0 * plain_total / sent;
  EXPECT_LE(bits, 12.0);
  EXPECT_GT(plain_bits, 32.0);  // the baseline really is the plain one
  RecordProperty("rice_bits_per_element", std::to_string(bits));
}

TEST(WireCodec, ZeroLengthSlicesRoundTripForEveryKind) {
  // A zero-length dense update once passed a null pointer to memcpy (UBSan).
  for (CompressorKind kind : {CompressorKind::kDense, CompressorKind::kAdaComp,
                              CompressorKind::kTopK, CompressorKind::kSign}) {
    CompressedUpdate u;
    u.kind = kind;
    if (kind == CompressorKind::kAdaComp) u.bin_size = 50;  // only AdaComp carries one
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &bytes).ok()) << CompressorKindName(kind);
    CompressedUpdate back;
    ASSERT_TRUE(DecodeUpdate(bytes, &back).ok()) << CompressorKindName(kind);
    ExpectSameUpdate(u, back);
  }
}

TEST(WireCodec, EmptyUpdateIsAFewBytes) {
  CompressedUpdate u;
  u.kind = CompressorKind::kAdaComp;
  u.length = 1000000;
  u.bin_size = 500;
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &bytes).ok());
  EXPECT_LE(bytes.size(), 16u);
  CompressedUpdate back;
  ASSERT_TRUE(DecodeUpdate(bytes, &back).ok());
  EXPECT_TRUE(back.indices.empty());
}

TEST(WireCodec, EncodeRejectsInconsistentUpdates) {
  CompressedUpdate u;
  u.kind = CompressorKind::kAdaComp;
  u.length = 10;
  u.bin_size = 5;
  u.indices = {3, 2};
  u.negative = {0, 0};
  std::vector<uint8_t> bytes;
  EXPECT_EQ(EncodeUpdate(u, IndexCoding::kRice, &bytes).code(), absl::StatusCode::kInvalidArgument);
  u.indices = {3, 10};
  EXPECT_EQ(EncodeUpdate(u, IndexCoding::kRice, &bytes).code(), absl::StatusCode::kInvalidArgument);
  u.indices = {3};
  EXPECT_EQ(EncodeUpdate(u, IndexCoding::kRice, &bytes).code(), absl::StatusCode::kInvalidArgument);
}

// --- corrupt input ------------------------------------------------------------------------

std::vector<uint8_t> Encoded(IndexCoding coding) {
  std::mt19937 rng(9);
  std::vector<uint8_t> bytes;
  EXPECT_TRUE(EncodeUpdate(RandomAdaComp(rng, 5000, 0.02), coding, &bytes).ok());
  return bytes;
}

// Decoding must fail with `code` and write nothing.
void ExpectRejected(const std::vector<uint8_t>& bytes, uint32_t n, absl::StatusCode code) {
  std::vector<float> dst(n, 7.0f);
  const absl::Status st = DecodeAdd(bytes, 1.0f, absl::MakeSpan(dst));
  EXPECT_EQ(st.code(), code) << st;
  EXPECT_THAT(dst, Each(7.0f));
  CompressedUpdate u;
  EXPECT_FALSE(DecodeUpdate(bytes, &u).ok());
}

TEST(WireCodecCorrupt, EveryTruncationIsAnError) {
  for (IndexCoding coding : {IndexCoding::kRice, IndexCoding::kPlain32}) {
    const std::vector<uint8_t> bytes = Encoded(coding);
    for (size_t len = 0; len < bytes.size(); ++len) {
      std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + len);
      std::vector<float> dst(5000, 7.0f);
      EXPECT_FALSE(DecodeAdd(cut, 1.0f, absl::MakeSpan(dst)).ok()) << "len " << len;
      ASSERT_THAT(dst, Each(7.0f)) << "len " << len;
    }
  }
}

TEST(WireCodecCorrupt, TrailingBytesAreAnError) {
  std::vector<uint8_t> bytes = Encoded(IndexCoding::kRice);
  bytes.push_back(0);
  ExpectRejected(bytes, 5000, absl::StatusCode::kDataLoss);
}

TEST(WireCodecCorrupt, WrongVersionIsAnError) {
  std::vector<uint8_t> bytes = Encoded(IndexCoding::kRice);
  bytes[1] = kWireFormatVersion + 1;
  ExpectRejected(bytes, 5000, absl::StatusCode::kDataLoss);
  bytes = Encoded(IndexCoding::kRice);
  bytes[0] = 0;  // magic
  ExpectRejected(bytes, 5000, absl::StatusCode::kDataLoss);
}

TEST(WireCodecCorrupt, IndexPastTheEndIsAnError) {
  CompressedUpdate u;
  u.kind = CompressorKind::kAdaComp;
  u.length = 100;
  u.bin_size = 10;
  u.scale = 1.0f;
  u.indices = {5, 99};
  u.negative = {0, 1};
  for (IndexCoding coding : {IndexCoding::kRice, IndexCoding::kPlain32}) {
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(EncodeUpdate(u, coding, &bytes).ok());
    // Claim a shorter slice (length varint is byte 4, < 128 here): index 99 is past its end.
    bytes[4] = 60;
    ExpectRejected(bytes, 60, absl::StatusCode::kDataLoss);
  }
}

TEST(WireCodecCorrupt, CountPastTheDataIsAnError) {
  CompressedUpdate u;
  u.kind = CompressorKind::kAdaComp;
  u.length = 100;
  u.bin_size = 10;
  u.scale = 1.0f;
  u.indices = {5, 9};
  u.negative = {0, 1};
  for (IndexCoding coding : {IndexCoding::kRice, IndexCoding::kPlain32}) {
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(EncodeUpdate(u, coding, &bytes).ok());
    // header: magic, version, kind, coding, length(1), bin_size(1), count(1)
    bytes[6] = 90;  // claims 90 elements; the data holds 2
    ExpectRejected(bytes, 100, absl::StatusCode::kDataLoss);
    bytes[6] = 101;  // more elements than the slice has
    ExpectRejected(bytes, 100, absl::StatusCode::kDataLoss);
  }
}

// `bytes` with the header's count field (adacomp, topk) raised by `by`; the varint may grow.
std::vector<uint8_t> WithCountRaised(const std::vector<uint8_t>& bytes, uint32_t by) {
  size_t pos = 4;
  auto skip_varint = [&] {
    while (bytes[pos] & 0x80) ++pos;
    ++pos;
  };
  skip_varint();  // length
  if (bytes[2] == static_cast<uint8_t>(CompressorKind::kAdaComp)) skip_varint();  // bin size
  const size_t at = pos;
  uint64_t count = 0;
  for (int shift = 0;; shift += 7) {
    count |= uint64_t{bytes[pos] & 0x7fu} << shift;
    if (!(bytes[pos++] & 0x80)) break;
  }
  std::vector<uint8_t> out(bytes.begin(), bytes.begin() + at);
  for (uint64_t v = count + by; ; v >>= 7) {
    if (v < 0x80) {
      out.push_back(static_cast<uint8_t>(v));
      break;
    }
    out.push_back(static_cast<uint8_t>(v | 0x80));
  }
  out.insert(out.end(), bytes.begin() + pos, bytes.end());
  return out;
}

// Dense index sets (small Rice parameter, so that a whole element fits in the padding of the
// last byte) and sparse ones, AdaComp and Top-k, small and large.
std::vector<CompressedUpdate> UpdatesForCountTests() {
  std::vector<CompressedUpdate> out;
  for (uint32_t n : {1u, 2u, 3u, 5u, 6u, 7u, 9u, 13u, 40u}) {
    CompressedUpdate a;
    a.kind = CompressorKind::kAdaComp;
    a.length = n + 3;
    a.bin_size = 4;
    a.scale = 0.5f;
    for (uint32_t i = 0; i < n; ++i) {
      a.indices.push_back(i);
      a.negative.push_back(0);
    }
    out.push_back(a);
    CompressedUpdate t;
    t.kind = CompressorKind::kTopK;
    t.length = n + 3;
    t.indices = a.indices;
    t.values.assign(n, 0.0f);
    out.push_back(t);
  }
  std::mt19937 rng(3);
  for (double density : {0.9, 0.5, 0.2, 0.02}) {
    for (int rep = 0; rep < 8; ++rep) out.push_back(RandomAdaComp(rng, 100 + 37 * rep, density));
  }
  out.push_back(Compressed(CompressorKind::kAdaComp, 3000, 4));
  out.push_back(Compressed(CompressorKind::kTopK, 3000, 4));
  return out;
}

TEST(WireCodecCorrupt, CountRaisedOverARealEncodingNeverDecodes) {
  // The stream is padded with zero bits to a byte; a count raised by 1..3 must not turn that
  // padding into extra elements.
  int checked = 0;
  for (const CompressedUpdate& u : UpdatesForCountTests()) {
    for (IndexCoding coding : {IndexCoding::kRice, IndexCoding::kPlain32}) {
      std::vector<uint8_t> bytes;
      ASSERT_TRUE(EncodeUpdate(u, coding, &bytes).ok());
      for (uint32_t by = 1; by <= 3; ++by) {
        if (u.indices.size() + by > u.length) continue;  // "count > length" is checked anyway
        const std::vector<uint8_t> raised = WithCountRaised(bytes, by);
        std::vector<float> dst(u.length, 7.0f);
        const absl::Status st = DecodeAdd(raised, 1.0f, absl::MakeSpan(dst));
        EXPECT_TRUE(st.code() == absl::StatusCode::kDataLoss ||
                    st.code() == absl::StatusCode::kInvalidArgument)
            << CompressorKindName(u.kind) << " n=" << u.indices.size() << " length=" << u.length
            << " +" << by << (coding == IndexCoding::kRice ? " rice: " : " plain32: ") << st;
        EXPECT_THAT(dst, Each(7.0f));
        CompressedUpdate back;
        EXPECT_FALSE(DecodeUpdate(raised, &back).ok());
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(WireCodecCorrupt, SixtyFourOneBitsInARowAreAnError) {
  // The unary run is counted on a 64-bit window; a window of only one-bits once reached
  // __builtin_ctzll(0), which is undefined (UBSan). Here: an escape whose raw gap is all ones.
  for (CompressorKind kind : {CompressorKind::kAdaComp, CompressorKind::kTopK}) {
    std::vector<uint8_t> bytes = {kWireMagic, kWireFormatVersion, static_cast<uint8_t>(kind),
                                  static_cast<uint8_t>(IndexCoding::kRice), 100};
    if (kind == CompressorKind::kAdaComp) {
      bytes.insert(bytes.end(), {10, 1, 0, 0, 0x80, 0x3f});  // bin 10, count 1, scale 1.0
    } else {
      bytes.push_back(1);  // count 1
    }
    bytes.push_back(0);  // Rice parameter 0
    bytes.insert(bytes.end(), 12, 0xff);
    if (kind == CompressorKind::kTopK) bytes.insert(bytes.end(), {0, 0, 0x80, 0x3f});
    ExpectRejected(bytes, 100, absl::StatusCode::kDataLoss);
  }
}

TEST(WireCodecCorrupt, HugeClaimedLengthDoesNotAllocate) {
  // A dense update claiming 2^32-1 floats with 3 bytes of data: must fail fast.
  std::vector<uint8_t> bytes = {kWireMagic, kWireFormatVersion, 0, 1, 0xff, 0xff, 0xff, 0xff,
                                0x0f, 1, 2, 3};
  CompressedUpdate u;
  EXPECT_EQ(DecodeUpdate(bytes, &u).code(), absl::StatusCode::kDataLoss);
}

TEST(WireCodecCorrupt, WrongDestinationSizeIsInvalidArgument) {
  const std::vector<uint8_t> bytes = Encoded(IndexCoding::kRice);
  std::vector<float> dst(4999, 7.0f);
  EXPECT_EQ(DecodeAdd(bytes, 1.0f, absl::MakeSpan(dst)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dst, Each(7.0f));
}

TEST(WireCodecCorrupt, NonFiniteValuesAreRejected) {
  CompressedUpdate u;
  u.kind = CompressorKind::kDense;
  u.length = 3;
  u.values = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &bytes).ok());
  ExpectRejected(bytes, 3, absl::StatusCode::kInvalidArgument);
  u.kind = CompressorKind::kAdaComp;
  u.bin_size = 3;
  u.values.clear();
  u.indices = {1};
  u.negative = {0};
  u.scale = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &bytes).ok());
  ExpectRejected(bytes, 3, absl::StatusCode::kInvalidArgument);
}

TEST(WireCodecCorrupt, RandomByteFlipsNeverWriteOutOfBounds) {
  // Under ASan this also proves no out-of-bounds read; here it proves no crash and that an
  // accepted buffer only ever writes inside the destination.
  std::mt19937 rng(1);
  const std::vector<uint8_t> good = Encoded(IndexCoding::kRice);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> bytes = good;
    const int flips = 1 + trial % 4;
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] ^= 1u << (rng() % 8);
    std::vector<float> dst(5002, 0.0f);
    const absl::Status st = DecodeAdd(bytes, 1.0f, absl::MakeSpan(dst.data() + 1, 5000));
    EXPECT_EQ(dst.front(), 0.0f);
    EXPECT_EQ(dst.back(), 0.0f);
    if (!st.ok()) {
      for (float v : dst) ASSERT_EQ(v, 0.0f);
    }
  }
}

}  // namespace
}  // namespace adaps

namespace adaps {
namespace {

// The worker's recompressed pull: DecodeAddCopy is DecodeAdd then a copy, float for float,
// for every kind and for lengths that end inside a block; a damaged buffer changes neither.
TEST(WireCodec, DecodeAddCopyIsDecodeAddThenCopy) {
  for (CompressorKind kind : {CompressorKind::kAdaComp, CompressorKind::kDense,
                              CompressorKind::kTopK, CompressorKind::kSign}) {
    for (uint32_t n : {1u, 1000u, 16384u, 50001u}) {
      const CompressedUpdate u = Compressed(kind, n, n + 7);
      std::vector<uint8_t> bytes;
      ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &bytes).ok());
      std::vector<float> base(n);
      for (uint32_t i = 0; i < n; ++i) base[i] = 0.25f * static_cast<float>(i % 13);
      std::vector<float> want = base, dst = base, copy(n, -1.0f);
      ASSERT_TRUE(DecodeAdd(bytes, 0.5f, absl::MakeSpan(want)).ok());
      ASSERT_TRUE(DecodeAddCopy(bytes, 0.5f, absl::MakeSpan(dst), absl::MakeSpan(copy)).ok());
      EXPECT_EQ(dst, want) << CompressorKindName(kind) << " " << n;
      EXPECT_EQ(copy, want) << CompressorKindName(kind) << " " << n;
      // In place (the copy is dst itself: TensorSpec::pull_in_place): the same values.
      std::vector<float> same = base;
      ASSERT_TRUE(DecodeAddCopy(bytes, 0.5f, absl::MakeSpan(same), absl::MakeSpan(same)).ok());
      EXPECT_EQ(same, want) << "in place: " << CompressorKindName(kind) << " " << n;
      // Damaged: the last byte cut off. Nothing changes.
      std::vector<float> dst2 = base, copy2(n, -1.0f);
      const std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 1);
      EXPECT_FALSE(DecodeAddCopy(cut, 0.5f, absl::MakeSpan(dst2), absl::MakeSpan(copy2)).ok());
      EXPECT_EQ(dst2, base);
      EXPECT_THAT(copy2, Each(-1.0f));
    }
  }
  // A copy that starts off a 16-byte boundary (1 to 3 floats in) and ends inside a vector:
  // the streamed copy's head and tail.
  {
    const uint32_t n = 50001;
    const CompressedUpdate u = Compressed(CompressorKind::kAdaComp, n, n + 7);
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &bytes).ok());
    for (size_t shift = 0; shift < 4; ++shift) {
      std::vector<float> want(n, 0.5f), dst(n, 0.5f), buffer(n + 4, -1.0f);
      ASSERT_TRUE(DecodeAdd(bytes, 1.0f, absl::MakeSpan(want)).ok());
      const absl::Span<float> copy = absl::MakeSpan(buffer).subspan(shift, n);
      ASSERT_TRUE(DecodeAddCopy(bytes, 1.0f, absl::MakeSpan(dst), copy).ok());
      EXPECT_EQ(std::vector<float>(copy.begin(), copy.end()), want) << shift;
      for (size_t i = 0; i < shift; ++i) EXPECT_EQ(buffer[i], -1.0f) << shift;
      for (size_t i = shift + n; i < buffer.size(); ++i) EXPECT_EQ(buffer[i], -1.0f) << shift;
    }
  }
  std::vector<float> a(10), b(9);
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(EncodeDense(a, IndexCoding::kRice, &bytes).ok());
  EXPECT_EQ(DecodeAddCopy(bytes, 1.0f, absl::MakeSpan(a), absl::MakeSpan(b)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace adaps

namespace adaps {
namespace {

// A sparse pull answer (DecodeAssignCopy): the listed values replace the buffer's, the rest
// stay (or become 0), the copy is the buffer; every damaged form changes neither.
CompressedUpdate SparseAnswer() {
  CompressedUpdate u;
  u.kind = CompressorKind::kTopK;
  u.length = 1000;
  for (uint32_t i = 3; i < 1000; i += 37) {
    u.indices.push_back(i);
    u.values.push_back(-0.5f * static_cast<float>(i));
  }
  return u;
}

TEST(WireCodecSparseAnswer, AssignsTheListedValuesAndKeepsOrZeroesTheRest) {
  const CompressedUpdate u = SparseAnswer();
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &bytes).ok());
  for (bool zero_rest : {false, true}) {
    std::vector<float> dst(1000, 2.0f), copy(1000, -1.0f);
    ASSERT_TRUE(DecodeAssignCopy(bytes, zero_rest, absl::MakeSpan(dst), absl::MakeSpan(copy)).ok());
    std::vector<float> want(1000, zero_rest ? 0.0f : 2.0f);
    for (size_t j = 0; j < u.indices.size(); ++j) want[u.indices[j]] = u.values[j];
    EXPECT_EQ(dst, want);
    EXPECT_EQ(copy, want);
  }
}

TEST(WireCodecSparseAnswer, ADamagedAnswerChangesNothing) {
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(EncodeUpdate(SparseAnswer(), IndexCoding::kRice, &bytes).ok());
  auto expect_rejected = [](const std::vector<uint8_t>& b, size_t n, absl::StatusCode code,
                            const std::string& what) {
    for (bool zero_rest : {false, true}) {
      std::vector<float> dst(n, 2.0f), copy(n, -1.0f);
      absl::Status st = DecodeAssignCopy(b, zero_rest, absl::MakeSpan(dst), absl::MakeSpan(copy));
      EXPECT_EQ(st.code(), code) << what << ": " << st;
      EXPECT_THAT(dst, Each(2.0f)) << what;
      EXPECT_THAT(copy, Each(-1.0f)) << what;
    }
  };
  for (size_t len = 0; len < bytes.size(); ++len) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + len);
    EXPECT_FALSE(DecodeAssignCopy(cut, true, {}, {}).ok());
    std::vector<float> dst(1000, 2.0f), copy(1000, -1.0f);
    EXPECT_FALSE(DecodeAssignCopy(cut, true, absl::MakeSpan(dst), absl::MakeSpan(copy)).ok())
        << "len " << len;
    ASSERT_THAT(dst, Each(2.0f)) << "len " << len;
    ASSERT_THAT(copy, Each(-1.0f)) << "len " << len;
  }
  std::vector<uint8_t> trailing = bytes;
  trailing.push_back(0);
  expect_rejected(trailing, 1000, absl::StatusCode::kDataLoss, "trailing byte");
  expect_rejected(bytes, 999, absl::StatusCode::kInvalidArgument, "another length");
  // Another kind (an AdaComp update) is not a sparse answer.
  std::vector<uint8_t> other;
  ASSERT_TRUE(
      EncodeUpdate(Compressed(CompressorKind::kAdaComp, 1000, 5), IndexCoding::kRice, &other).ok());
  expect_rejected(other, 1000, absl::StatusCode::kInvalidArgument, "AdaComp");
  // Random flips: never a write outside, and a failure writes nothing.
  std::mt19937 rng(9);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> b = bytes;
    b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    std::vector<float> dst(1002, 2.0f), copy(1002, -1.0f);
    absl::Status st = DecodeAssignCopy(b, false, absl::MakeSpan(dst).subspan(1, 1000),
                                       absl::MakeSpan(copy).subspan(1, 1000));
    EXPECT_EQ(dst.front(), 2.0f);
    EXPECT_EQ(dst.back(), 2.0f);
    EXPECT_EQ(copy.back(), -1.0f);
    if (!st.ok()) {
      ASSERT_THAT(dst, Each(2.0f)) << trial;
      ASSERT_THAT(copy, Each(-1.0f)) << trial;
    }
  }
}

// A forwarded answer (DecodeForwardedCopy) is the mean server's own arithmetic replayed:
// agg = 0, agg += each push in order, mean = agg * scale; bit for bit, for plain and
// segmented pushes; every damaged form changes neither buffer.
std::vector<std::vector<uint8_t>> ForwardedPushes() {
  std::vector<std::vector<uint8_t>> pushes(3);
  EXPECT_TRUE(EncodeUpdate(Compressed(CompressorKind::kAdaComp, 1000, 1), IndexCoding::kRice,
                           &pushes[0]).ok());
  EXPECT_TRUE(EncodeUpdate(Compressed(CompressorKind::kTopK, 1000, 2), IndexCoding::kRice,
                           &pushes[1]).ok());
  EXPECT_TRUE(EncodeUpdate(Compressed(CompressorKind::kAdaComp, 1000, 3), IndexCoding::kRice,
                           &pushes[2]).ok());
  return pushes;
}

TEST(WireCodecForwarded, ReplaysTheServersMeanBitForBit) {
  const std::vector<std::vector<uint8_t>> pushes = ForwardedPushes();
  const float scale = 1.0f / 3.0f;
  std::vector<float> agg(1000, 0.0f);  // what server/shard.cc does
  for (const auto& p : pushes) ASSERT_TRUE(DecodeAdd(p, 1.0f, absl::MakeSpan(agg)).ok());
  std::vector<float> want(1000);
  for (size_t j = 0; j < agg.size(); ++j) want[j] = agg[j] * scale;
  std::vector<absl::Span<const uint8_t>> spans(pushes.begin(), pushes.end());
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(EncodeForwarded(scale, spans, &bytes).ok());
  EXPECT_EQ(bytes.size(), ForwardedSize({pushes[0].size(), pushes[1].size(), pushes[2].size()}));
  std::vector<float> dst(1000, 7.0f), copy(1000, -1.0f);  // whatever it held: replaced
  ASSERT_TRUE(DecodeForwardedCopy(bytes, absl::MakeSpan(dst), absl::MakeSpan(copy)).ok());
  EXPECT_EQ(0, std::memcmp(dst.data(), want.data(), want.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(copy.data(), want.data(), want.size() * sizeof(float)));
  // The order is the server's: another order is another answer (float addition).
  std::vector<absl::Span<const uint8_t>> reversed(spans.rbegin(), spans.rend());
  std::vector<uint8_t> other;
  ASSERT_TRUE(EncodeForwarded(scale, reversed, &other).ok());
  EXPECT_NE(other, bytes);
  // Segmented pushes (a fusion bucket) replay segment by segment.
  const std::vector<WireSegment> table = {{400, 50}, {600, 50}};
  std::vector<std::vector<uint8_t>> parts(2);
  ASSERT_TRUE(EncodeUpdate(Compressed(CompressorKind::kAdaComp, 400, 4), IndexCoding::kRice,
                           &parts[0]).ok());
  ASSERT_TRUE(EncodeUpdate(Compressed(CompressorKind::kAdaComp, 600, 5), IndexCoding::kRice,
                           &parts[1]).ok());
  std::vector<uint8_t> seg;
  ASSERT_TRUE(EncodeSegmented(table, {parts[0], parts[1]}, &seg).ok());
  std::vector<float> agg2(1000, 0.0f);
  ASSERT_TRUE(DecodeAdd(seg, 1.0f, absl::MakeSpan(agg2)).ok());
  ASSERT_TRUE(DecodeAdd(pushes[0], 1.0f, absl::MakeSpan(agg2)).ok());
  for (float& x : agg2) x *= 0.5f;
  ASSERT_TRUE(EncodeForwarded(0.5f, {seg, pushes[0]}, &bytes).ok());
  ASSERT_TRUE(DecodeForwardedCopy(bytes, absl::MakeSpan(dst), absl::MakeSpan(copy)).ok());
  EXPECT_EQ(0, std::memcmp(dst.data(), agg2.data(), agg2.size() * sizeof(float)));
}

// The answer to a worker whose own push is in the step leaves that push out (it holds it):
// the replay with its own bytes is the whole answer's, without them it is refused.
TEST(WireCodecForwarded, TheOwnPushLeftOutIsReplayedFromThePullersCopy) {
  const std::vector<std::vector<uint8_t>> pushes = ForwardedPushes();
  const std::vector<absl::Span<const uint8_t>> spans(pushes.begin(), pushes.end());
  std::vector<uint8_t> whole;
  ASSERT_TRUE(EncodeForwarded(0.25f, spans, &whole).ok());
  std::vector<float> want(1000), want_copy(1000);
  ASSERT_TRUE(DecodeForwardedCopy(whole, absl::MakeSpan(want), absl::MakeSpan(want_copy)).ok());
  for (int own = 0; own < 3; ++own) {
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(EncodeForwarded(0.25f, spans, &bytes, own).ok());
    EXPECT_EQ(bytes.size(), whole.size() - pushes[own].size()) << own;
    const absl::Span<const uint8_t> mine = pushes[own];
    std::vector<float> dst(1000, 3.0f), copy(1000, 3.0f);
    EXPECT_EQ(DecodeForwardedCopy(bytes, absl::MakeSpan(dst), absl::MakeSpan(copy)).code(),
              absl::StatusCode::kDataLoss);
    EXPECT_THAT(dst, Each(3.0f));
    EXPECT_THAT(copy, Each(3.0f));
    // Someone else's push in its place is another length here, so refused too.
    const std::vector<uint8_t> wrong(pushes[own].begin(), pushes[own].end() - 1);
    const absl::Span<const uint8_t> wrong_span = wrong;
    EXPECT_FALSE(
        DecodeForwardedCopy(bytes, absl::MakeSpan(dst), absl::MakeSpan(copy), &wrong_span).ok());
    EXPECT_THAT(dst, Each(3.0f));
    ASSERT_TRUE(
        DecodeForwardedCopy(bytes, absl::MakeSpan(dst), absl::MakeSpan(copy), &mine).ok());
    EXPECT_EQ(0, std::memcmp(dst.data(), want.data(), want.size() * sizeof(float))) << own;
    EXPECT_EQ(dst, copy);
  }
  // A whole answer ignores the puller's copy; two pushes left out is damage.
  const absl::Span<const uint8_t> mine = pushes[0];
  std::vector<float> dst(1000), copy(1000);
  ASSERT_TRUE(DecodeForwardedCopy(whole, absl::MakeSpan(dst), absl::MakeSpan(copy), &mine).ok());
  EXPECT_EQ(dst, want);
  std::vector<uint8_t> two;
  ASSERT_TRUE(EncodeForwarded(0.25f, {spans[0], spans[0]}, &two, 0).ok());
  std::fill(two.begin() + 12 + 4, two.begin() + 12 + 8, 0xff);  // the second's size too
  two.resize(12 + 8);
  EXPECT_EQ(DecodeForwardedCopy(two, absl::MakeSpan(dst), absl::MakeSpan(copy), &mine).code(),
            absl::StatusCode::kDataLoss);
}

// Slices longer than the decoder's block (16,384 floats), segmented pushes across block
// borders, and a dense member among them: still the server's arithmetic, bit for bit.
// Four pushes of a 100,000-element slice (longer than the decoders' 16,384-float block) from
// seeds first .. first + 3: AdaComp, Top-k, AdaComp, and a segmented push of an AdaComp
// member, a dense member and a Top-k member across block borders.
constexpr uint32_t kLongN = 100000;

std::vector<std::vector<uint8_t>> LongMixedPushes(uint32_t first) {
  const std::vector<WireSegment> table = {{30000, 50}, {3, 1}, {69997, 500}};
  std::vector<std::vector<uint8_t>> pushes(4);
  for (uint32_t k = 0; k < 4; ++k) {
    const uint32_t seed = first + k;
    if (k == 3) {
      std::vector<std::vector<uint8_t>> parts(3);
      EXPECT_TRUE(EncodeUpdate(Compressed(CompressorKind::kAdaComp, 30000, seed),
                               IndexCoding::kRice, &parts[0]).ok());
      EXPECT_TRUE(EncodeUpdate(Compressed(CompressorKind::kDense, 3, seed), IndexCoding::kRice,
                               &parts[1]).ok());
      EXPECT_TRUE(EncodeUpdate(Compressed(CompressorKind::kTopK, 69997, seed),
                               IndexCoding::kRice, &parts[2]).ok());
      EXPECT_TRUE(EncodeSegmented(table, {parts[0], parts[1], parts[2]}, &pushes[k]).ok());
    } else {
      EXPECT_TRUE(EncodeUpdate(Compressed(k == 1 ? CompressorKind::kTopK
                                                 : CompressorKind::kAdaComp,
                                          kLongN, seed),
                               IndexCoding::kRice, &pushes[k]).ok());
    }
  }
  return pushes;
}

TEST(WireCodecForwarded, LongSlicesAndMixedKindsReplayBitForBit) {
  constexpr uint32_t kN = kLongN;
  const std::vector<std::vector<uint8_t>> pushes = LongMixedPushes(11);
  for (size_t take : {size_t{3}, size_t{4}}) {  // without and with the dense member
    const float scale = 1.0f / static_cast<float>(take);
    std::vector<float> agg(kN, 0.0f);
    std::vector<absl::Span<const uint8_t>> spans;
    for (size_t k = 0; k < take; ++k) {
      ASSERT_TRUE(DecodeAdd(pushes[k], 1.0f, absl::MakeSpan(agg)).ok());
      spans.push_back(pushes[k]);
    }
    for (float& x : agg) x *= scale;
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(EncodeForwarded(scale, spans, &bytes, 1).ok());
    const absl::Span<const uint8_t> own = pushes[1];
    std::vector<float> dst(kN, 5.0f), copy(kN);
    ASSERT_TRUE(
        DecodeForwardedCopy(bytes, absl::MakeSpan(dst), absl::MakeSpan(copy), &own).ok());
    EXPECT_EQ(0, std::memcmp(dst.data(), agg.data(), kN * sizeof(float))) << take;
    EXPECT_EQ(0, std::memcmp(copy.data(), agg.data(), kN * sizeof(float))) << take;
    std::vector<float> same(kN, 5.0f);  // in place: the copy is dst itself
    ASSERT_TRUE(
        DecodeForwardedCopy(bytes, absl::MakeSpan(same), absl::MakeSpan(same), &own).ok());
    EXPECT_EQ(0, std::memcmp(same.data(), agg.data(), kN * sizeof(float))) << "in place " << take;
  }
}

TEST(WireCodecForwarded, EncodingRefusesWhatNoServerSends) {
  std::vector<uint8_t> out{1, 2};
  EXPECT_EQ(EncodeForwarded(0.5f, {}, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());
  const std::vector<uint8_t> p = ForwardedPushes()[0];
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_EQ(EncodeForwarded(bad, {p}, &out).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(WireCodecForwarded, ADamagedAnswerChangesNothing) {
  const std::vector<std::vector<uint8_t>> pushes = ForwardedPushes();
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(EncodeForwarded(0.25f, {pushes[0], pushes[1], pushes[2]}, &bytes).ok());
  auto expect_rejected = [](const std::vector<uint8_t>& b, size_t n, const std::string& what) {
    std::vector<float> dst(n, 2.0f), copy(n, -1.0f);
    absl::Status st = DecodeForwardedCopy(b, absl::MakeSpan(dst), absl::MakeSpan(copy));
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_THAT(dst, Each(2.0f)) << what;
    EXPECT_THAT(copy, Each(-1.0f)) << what;
  };
  for (size_t len = 0; len < bytes.size(); ++len) {
    expect_rejected(std::vector<uint8_t>(bytes.begin(), bytes.begin() + len), 1000,
                    absl::StrCat("cut at ", len));
  }
  std::vector<uint8_t> trailing = bytes;
  trailing.push_back(0);
  expect_rejected(trailing, 1000, "trailing byte");
  expect_rejected(bytes, 999, "another length");
  std::vector<float> dst(1000), short_copy(999);
  EXPECT_EQ(DecodeForwardedCopy(bytes, absl::MakeSpan(dst), absl::MakeSpan(short_copy)).code(),
            absl::StatusCode::kInvalidArgument);
  // A count of zero, a count larger than what follows, a scale of 0, of NaN.
  auto with = [&](size_t at, uint32_t word) {
    std::vector<uint8_t> b = bytes;
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(word >> (8 * i));
    return b;
  };
  expect_rejected(with(4, 0), 1000, "no pushes");
  expect_rejected(with(4, 4), 1000, "4 pushes, 3 there");
  expect_rejected(with(8, 0), 1000, "scale 0");
  expect_rejected(with(8, 0x7fc00000u), 1000, "scale NaN");
  expect_rejected(with(0, 0x12345678u), 1000, "another magic");
  // Another payload (a sparse answer) is not a forwarded one.
  std::vector<uint8_t> other;
  ASSERT_TRUE(EncodeUpdate(SparseAnswer(), IndexCoding::kRice, &other).ok());
  expect_rejected(other, 1000, "a Top-k encoding");
  // Random flips: a failure writes nothing.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> b = bytes;
    b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    std::vector<float> d(1000, 2.0f), c(1000, -1.0f);
    if (!DecodeForwardedCopy(b, absl::MakeSpan(d), absl::MakeSpan(c)).ok()) {
      ASSERT_THAT(d, Each(2.0f)) << trial;
      ASSERT_THAT(c, Each(-1.0f)) << trial;
    }
  }
}

// The servers' tracked SGD step written plainly, unblocked: each push in order, each
// element it carries stepped with the value DecodeAdd would add (factor 1) times `scale`.
void PlainSgdPushes(const std::vector<absl::Span<const uint8_t>>& pushes, float scale, float lr,
                    std::vector<float>& p) {
  for (absl::Span<const uint8_t> push : pushes) {
    std::vector<DecodedPart> parts;
    size_t used = 0;
    bool sparse = true;
    ASSERT_TRUE(DecodePushParts(push, p.size(), parts, &used, &sparse).ok());
    for (size_t k = 0; k < used; ++k) {
      const CompressedUpdate& u = parts[k].update;
      float* base = p.data() + parts[k].offset;
      switch (u.kind) {
        case CompressorKind::kAdaComp:
          for (size_t j = 0; j < u.indices.size(); ++j) {
            const float v = u.negative[j] ? -(1.0f * u.scale) : 1.0f * u.scale;
            SgdStep(lr, 0.0f, v * scale, base[u.indices[j]]);
          }
          break;
        case CompressorKind::kTopK:
          for (size_t j = 0; j < u.indices.size(); ++j) {
            SgdStep(lr, 0.0f, (1.0f * u.values[j]) * scale, base[u.indices[j]]);
          }
          break;
        case CompressorKind::kDense:
          for (uint32_t i = 0; i < u.length; ++i) {
            SgdStep(lr, 0.0f, (1.0f * u.values[i]) * scale, base[i]);
          }
          break;
        case CompressorKind::kSign:
          for (uint32_t i = 0; i < u.length; ++i) {
            const bool set = (u.sign_bits[i / 64] >> (i % 64)) & 1;
            SgdStep(lr, 0.0f, (set ? 1.0f * u.scale_neg : 1.0f * u.scale) * scale, base[i]);
          }
          break;
      }
    }
  }
}

// A forwarded SGD step (DecodeForwardedSgdCopy) is the server's tracked SGD step replayed
// on the replica at the version before: each push in order stepped at its elements,
// p -= lr * (value * scale) (ApplySgdParts, as server/shard.cc steps), bit for bit, for
// plain, segmented and dense members, across the decoder's blocks.
TEST(WireCodecForwarded, ReplaysTheServersSgdStepBitForBit) {
  constexpr uint32_t kN = kLongN;
  const std::vector<std::vector<uint8_t>> pushes = LongMixedPushes(21);
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> replica(kN);
  for (float& x : replica) x = normal(rng);
  replica[7] = -0.0f;  // signed zeros and a huge value stay as the server leaves them
  replica[8] = 3e38f;
  for (size_t take : {size_t{3}, size_t{4}}) {  // without and with the dense member
    for (float lr : {0.1f, 0.0371f, 0.0f}) {
      const float scale = 1.0f / static_cast<float>(take);
      // The server's step, written plainly.
      std::vector<float> want = replica;
      std::vector<absl::Span<const uint8_t>> spans;
      for (size_t k = 0; k < take; ++k) spans.push_back(pushes[k]);
      PlainSgdPushes(spans, scale, lr, want);
      std::vector<uint8_t> bytes;
      ASSERT_TRUE(EncodeForwardedSgd(scale, lr, spans, &bytes, 1).ok());
      const absl::Span<const uint8_t> own = pushes[1];
      std::vector<float> dst = replica, copy(kN, 9.0f);
      ASSERT_TRUE(
          DecodeForwardedSgdCopy(bytes, absl::MakeSpan(dst), absl::MakeSpan(copy), &own).ok());
      EXPECT_EQ(0, std::memcmp(dst.data(), want.data(), kN * sizeof(float))) << take << lr;
      EXPECT_EQ(0, std::memcmp(copy.data(), want.data(), kN * sizeof(float))) << take << lr;
      if (lr > 0.0f) EXPECT_NE(dst, replica);
      std::vector<float> same = replica;  // in place: the copy is dst itself
      ASSERT_TRUE(
          DecodeForwardedSgdCopy(bytes, absl::MakeSpan(same), absl::MakeSpan(same), &own).ok());
      EXPECT_EQ(0, std::memcmp(same.data(), want.data(), kN * sizeof(float)))
          << "in place " << take << lr;
      // Twice in a row from the same replica: the decoder's scratch is clean between calls.
      dst = replica;
      ASSERT_TRUE(
          DecodeForwardedSgdCopy(bytes, absl::MakeSpan(dst), absl::MakeSpan(copy), &own).ok());
      EXPECT_EQ(0, std::memcmp(dst.data(), want.data(), kN * sizeof(float))) << take << lr;
    }
  }
}

TEST(WireCodecForwarded, AnSgdAnswerAndAMeanAnswerAreNotTakenForEachOther) {
  const std::vector<std::vector<uint8_t>> pushes = ForwardedPushes();
  const std::vector<absl::Span<const uint8_t>> spans(pushes.begin(), pushes.end());
  std::vector<uint8_t> mean, sgd;
  ASSERT_TRUE(EncodeForwarded(0.25f, spans, &mean).ok());
  ASSERT_TRUE(EncodeForwardedSgd(0.25f, 0.5f, spans, &sgd).ok());
  EXPECT_EQ(sgd.size(), mean.size() + 4);  // the rate
  std::vector<float> dst(1000, 2.0f), copy(1000, -1.0f);
  absl::Status st = DecodeForwardedSgdCopy(mean, absl::MakeSpan(dst), absl::MakeSpan(copy));
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("mean step"));
  st = DecodeForwardedCopy(sgd, absl::MakeSpan(dst), absl::MakeSpan(copy));
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("SGD step"));
  EXPECT_THAT(dst, Each(2.0f));
  EXPECT_THAT(copy, Each(-1.0f));
  for (float bad : {-1.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<uint8_t> out;
    EXPECT_EQ(EncodeForwardedSgd(0.25f, bad, spans, &out).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(WireCodecForwarded, ADamagedSgdAnswerChangesNothing) {
  const std::vector<std::vector<uint8_t>> pushes = ForwardedPushes();
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(EncodeForwardedSgd(0.25f, 0.1f, {pushes[0], pushes[1], pushes[2]}, &bytes).ok());
  auto expect_rejected = [](const std::vector<uint8_t>& b, const std::string& what) {
    std::vector<float> dst(1000, 2.0f), copy(1000, -1.0f);
    absl::Status st = DecodeForwardedSgdCopy(b, absl::MakeSpan(dst), absl::MakeSpan(copy));
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_THAT(dst, Each(2.0f)) << what;
    EXPECT_THAT(copy, Each(-1.0f)) << what;
  };
  for (size_t len = 0; len < bytes.size(); ++len) {
    expect_rejected(std::vector<uint8_t>(bytes.begin(), bytes.begin() + len),
                    absl::StrCat("cut at ", len));
  }
  auto with = [&](size_t at, uint32_t word) {
    std::vector<uint8_t> b = bytes;
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(word >> (8 * i));
    return b;
  };
  expect_rejected(with(12, 0xbf800000u), "rate -1");
  expect_rejected(with(12, 0x7fc00000u), "rate NaN");
  expect_rejected(with(12, 0x7f800000u), "rate Inf");
  std::mt19937 rng(12);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> b = bytes;
    b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    std::vector<float> d(1000, 2.0f), c(1000, -1.0f);
    if (!DecodeForwardedSgdCopy(b, absl::MakeSpan(d), absl::MakeSpan(c)).ok()) {
      ASSERT_THAT(d, Each(2.0f)) << trial;
      ASSERT_THAT(c, Each(-1.0f)) << trial;
    }
  }
  // After all those, a good answer still replays from a clean scratch.
  std::vector<float> d1(1000, 1.0f), c1(1000), d2(1000, 1.0f), c2(1000);
  ASSERT_TRUE(DecodeForwardedSgdCopy(bytes, absl::MakeSpan(d1), absl::MakeSpan(c1)).ok());
  PlainSgdPushes({pushes[0], pushes[1], pushes[2]}, 0.25f, 0.1f, d2);
  for (size_t j = 0; j < 1000; ++j) ASSERT_EQ(d1[j], d2[j]) << j;
}

}  // namespace
}  // namespace adaps
