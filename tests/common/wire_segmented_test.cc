// Segmented containers of the wire codec (common/wire_codec.h): a fusion bucket's payload.
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "common/wire_internal.h"
#include "gtest/gtest.h"

namespace adaps {
namespace {

std::vector<float> Gradient(uint32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> g(n);
  for (float& v : g) v = normal(rng);
  return g;
}

std::vector<uint8_t> Encoded(CompressorKind kind, uint32_t n, uint32_t bin, uint32_t seed) {
  const std::vector<float> g = Gradient(n, seed);
  std::vector<uint8_t> out;
  if (kind == CompressorKind::kDense) {
    EXPECT_TRUE(EncodeDense(g, IndexCoding::kRice, &out).ok());
    return out;
  }
  CompressorOptions o;
  o.kind = kind;
  o.bin_size = bin;
  o.topk_fraction = 0.1;
  auto c = MakeCompressor(o);
  SliceState state(n);
  CompressedUpdate u;
  EXPECT_TRUE((*c)->Compress(g, state, u).ok());
  EXPECT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &out).ok());
  return out;
}

struct Bucket {
  std::vector<WireSegment> table;
  std::vector<std::vector<uint8_t>> parts;
  std::vector<uint8_t> bytes;
  uint32_t total = 0;
};

// An AdaComp member (bin 50), a dense one, a Top-k one and a tiny AdaComp one (bin 500).
Bucket ThreeKinds() {
  Bucket b;
  b.table = {{120, 50}, {7, 1}, {40, 9}, {3, 500}};
  b.parts = {Encoded(CompressorKind::kAdaComp, 120, 50, 1), Encoded(CompressorKind::kDense, 7, 1, 2),
             Encoded(CompressorKind::kTopK, 40, 9, 3), Encoded(CompressorKind::kAdaComp, 3, 500, 4)};
  std::vector<absl::Span<const uint8_t>> spans(b.parts.begin(), b.parts.end());
  EXPECT_TRUE(EncodeSegmented(b.table, spans, &b.bytes).ok());
  for (const WireSegment& s : b.table) b.total += s.length;
  return b;
}

// A container written by hand: header, the given table (length, bin, bytes) and body.
std::vector<uint8_t> Handmade(uint32_t total, uint32_t n, const std::vector<uint32_t>& table,
                              const std::vector<uint8_t>& body) {
  std::vector<uint8_t> out = {kWireMagic, kWireFormatVersion, kSegmentedKind, 0};
  wire_internal::PutVarint(&out, total);
  wire_internal::PutVarint(&out, n);
  for (uint32_t v : table) wire_internal::PutVarint(&out, v);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

TEST(WireSegmented, AddsEachSegmentAtItsOffsetBitForBitAsSeparateUpdates) {
  const Bucket b = ThreeKinds();
  std::vector<float> fused = Gradient(b.total, 9), separate = fused;
  ASSERT_TRUE(DecodeAdd(b.bytes, 0.5f, absl::MakeSpan(fused)).ok());
  size_t at = 0;
  for (size_t i = 0; i < b.parts.size(); ++i) {
    ASSERT_TRUE(
        DecodeAdd(b.parts[i], 0.5f, absl::MakeSpan(separate.data() + at, b.table[i].length)).ok());
    at += b.table[i].length;
  }
  EXPECT_EQ(0, std::memcmp(fused.data(), separate.data(), fused.size() * sizeof(float)));
}

// DecodeAddTouched adds as DecodeAdd does and appends the elements each part holds at its
// offset: an AdaComp or Top-k part's indices (as DecodeUpdate gives them), every element of a
// dense one. Damaged bytes change neither the buffer nor the list.
TEST(WireSegmented, DecodeAddTouchedAddsAsDecodeAddAndListsEachPartsElements) {
  const Bucket b = ThreeKinds();
  std::vector<float> added = Gradient(b.total, 9), plain = added;
  std::vector<uint32_t> touched = {7};  // appended to, not replaced
  ASSERT_TRUE(DecodeAddTouched(b.bytes, 0.5f, absl::MakeSpan(added), &touched).ok());
  ASSERT_TRUE(DecodeAdd(b.bytes, 0.5f, absl::MakeSpan(plain)).ok());
  EXPECT_EQ(0, std::memcmp(added.data(), plain.data(), added.size() * sizeof(float)));
  std::vector<uint32_t> expected = {7};
  uint32_t at = 0;
  for (size_t i = 0; i < b.parts.size(); ++i) {
    auto header = PeekHeader(b.parts[i]);
    ASSERT_TRUE(header.ok());
    if (header->kind == CompressorKind::kDense) {
      for (uint32_t j = 0; j < b.table[i].length; ++j) expected.push_back(at + j);
    } else {
      CompressedUpdate u;
      ASSERT_TRUE(DecodeUpdate(b.parts[i], &u).ok());
      ASSERT_FALSE(u.indices.empty()) << "part " << i;
      for (uint32_t j : u.indices) expected.push_back(at + j);
    }
    at += b.table[i].length;
  }
  EXPECT_EQ(touched, expected);
  // One part alone: its own indices, from 0.
  std::vector<uint32_t> one;
  std::vector<float> dst(120, 0.0f);
  ASSERT_TRUE(DecodeAddTouched(b.parts[0], 1.0f, absl::MakeSpan(dst), &one).ok());
  CompressedUpdate u;
  ASSERT_TRUE(DecodeUpdate(b.parts[0], &u).ok());
  EXPECT_EQ(one, u.indices);
  // Damaged: nothing changes.
  for (size_t n = 0; n < b.bytes.size(); n += 7) {
    std::vector<uint8_t> cut(b.bytes.begin(), b.bytes.begin() + n);
    std::vector<float> d = Gradient(b.total, 5);
    const std::vector<float> before = d;
    std::vector<uint32_t> list = {1, 2};
    EXPECT_FALSE(DecodeAddTouched(cut, 1.0f, absl::MakeSpan(d), &list).ok()) << n;
    EXPECT_EQ(0, std::memcmp(d.data(), before.data(), d.size() * sizeof(float))) << n;
    EXPECT_EQ(list, (std::vector<uint32_t>{1, 2})) << n;
  }
}

TEST(WireSegmented, SplitReturnsTheTableAndEachSegmentsBytes) {
  const Bucket b = ThreeKinds();
  auto views = SplitSegmented(b.bytes);
  ASSERT_TRUE(views.ok()) << views.status();
  ASSERT_EQ(views->size(), b.parts.size());
  for (size_t i = 0; i < b.parts.size(); ++i) {
    EXPECT_EQ((*views)[i].segment, b.table[i]);
    EXPECT_EQ(std::vector<uint8_t>((*views)[i].bytes.begin(), (*views)[i].bytes.end()),
              b.parts[i]);
  }
  auto header = PeekHeader(b.bytes);
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(header->length, b.total);
  EXPECT_EQ(header->segments, b.parts.size());
}

TEST(WireSegmented, IsNotASingleUpdate) {
  const Bucket b = ThreeKinds();
  CompressedUpdate u;
  EXPECT_EQ(DecodeUpdate(b.bytes, &u).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitSegmented(b.parts[0]).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WireSegmented, EncoderRefusesPartsThatDoNotMatchTheTable) {
  const Bucket b = ThreeKinds();
  std::vector<absl::Span<const uint8_t>> spans(b.parts.begin(), b.parts.end());
  std::vector<uint8_t> out;
  std::vector<WireSegment> table = b.table;
  table[1].length = 8;  // the dense part holds 7
  EXPECT_EQ(EncodeSegmented(table, spans, &out).code(), absl::StatusCode::kInvalidArgument);
  table = b.table;
  table[0].bin_size = 51;  // the AdaComp part says 50
  EXPECT_EQ(EncodeSegmented(table, spans, &out).code(), absl::StatusCode::kInvalidArgument);
  spans[2] = b.bytes;  // nested
  EXPECT_EQ(EncodeSegmented(b.table, spans, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeSegmented({}, {}, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());
}

// Every hostile container is kDataLoss and leaves the destination as it was.
void ExpectRefused(const std::vector<uint8_t>& bytes, uint32_t total, const char* why) {
  std::vector<float> dst = Gradient(total, 5);
  const std::vector<float> before = dst;
  const absl::Status st = DecodeAdd(bytes, 1.0f, absl::MakeSpan(dst));
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << why << ": " << st;
  EXPECT_EQ(0, std::memcmp(dst.data(), before.data(), dst.size() * sizeof(float))) << why;
}

TEST(WireSegmented, HostileTablesAreDataLossAndChangeNothing) {
  const std::vector<uint8_t> a = Encoded(CompressorKind::kAdaComp, 10, 50, 1);
  const std::vector<uint8_t> d = Encoded(CompressorKind::kDense, 4, 1, 2);
  std::vector<uint8_t> both = a;
  both.insert(both.end(), d.begin(), d.end());
  const uint32_t na = a.size(), nd = d.size();
  // The well-formed one decodes.
  std::vector<float> dst(14);
  ASSERT_TRUE(DecodeAdd(Handmade(14, 2, {10, 50, na, 4, 1, nd}, both), 1.0f,
                        absl::MakeSpan(dst)).ok());
  ExpectRefused(Handmade(14, 0, {}, both), 14, "no segments");
  ExpectRefused(Handmade(14, 15, {10, 50, na, 4, 1, nd}, both), 14, "more segments than elements");
  ExpectRefused(Handmade(14, 1000000, {10, 50, na, 4, 1, nd}, both), 14, "huge count");
  ExpectRefused(Handmade(14, 2, {10, 50, na, 5, 1, nd}, both), 14, "lengths exceed the total");
  ExpectRefused(Handmade(14, 2, {9, 50, na, 5, 1, nd}, both), 14, "a part of another length");
  ExpectRefused(Handmade(14, 2, {10, 51, na, 4, 1, nd}, both), 14, "another bin size");
  ExpectRefused(Handmade(14, 2, {10, 0, na, 4, 1, nd}, both), 14, "bin size 0");
  ExpectRefused(Handmade(14, 2, {0, 50, na, 14, 1, nd}, both), 14, "an empty segment");
  ExpectRefused(Handmade(14, 2, {10, 50, na + 1, 4, 1, nd}, both), 14, "bytes past the end");
  ExpectRefused(Handmade(14, 2, {10, 50, na - 1, 4, 1, nd + 1}, both), 14, "a shifted boundary");
  ExpectRefused(Handmade(14, 2, {10, 50, na, 4, 1, nd - 1}, both), 14, "bytes left over");
  ExpectRefused(Handmade(14, 2, {10, 50, 0xffffffffu, 4, 1, nd}, both), 14, "a huge byte count");
  std::vector<uint8_t> nested = Handmade(4, 1, {4, 1, nd}, d);
  ExpectRefused(Handmade(14, 2, {10, 50, na, 4, 1, static_cast<uint32_t>(nested.size())},
                         [&] { auto v = a; v.insert(v.end(), nested.begin(), nested.end()); return v; }()),
                14, "a nested container");
  std::vector<uint8_t> bad_coding = Handmade(14, 2, {10, 50, na, 4, 1, nd}, both);
  bad_coding[3] = 1;
  ExpectRefused(bad_coding, 14, "a coding byte");
}

TEST(WireSegmented, EveryTruncationIsRefusedAndChangesNothing) {
  const Bucket b = ThreeKinds();
  for (size_t n = 0; n < b.bytes.size(); ++n) {
    std::vector<uint8_t> cut(b.bytes.begin(), b.bytes.begin() + n);
    std::vector<float> dst = Gradient(b.total, 5);
    const std::vector<float> before = dst;
    EXPECT_FALSE(DecodeAdd(cut, 1.0f, absl::MakeSpan(dst)).ok()) << n;
    EXPECT_EQ(0, std::memcmp(dst.data(), before.data(), dst.size() * sizeof(float))) << n;
  }
}

TEST(WireSegmented, RandomDamageNeverWritesOnError) {
  const Bucket b = ThreeKinds();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> bytes = b.bytes;
    const int flips = 1 + trial % 3;
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] ^= uint8_t(1u << (rng() % 8));
    std::vector<float> dst = Gradient(b.total, 5);
    const std::vector<float> before = dst;
    if (!DecodeAdd(bytes, 1.0f, absl::MakeSpan(dst)).ok()) {
      EXPECT_EQ(0, std::memcmp(dst.data(), before.data(), dst.size() * sizeof(float)));
    }
  }
}

TEST(WireParse, ParsesAContainersTableOnceAndDecodesAsTheBytesDo) {
  const Bucket b = ThreeKinds();
  auto parsed = ParseUpdate(b.bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->header.segments, b.table.size());
  EXPECT_EQ(parsed->header.length, b.total);
  ASSERT_EQ(parsed->segments.size(), b.table.size());
  for (size_t i = 0; i < b.table.size(); ++i) {
    EXPECT_EQ(parsed->segments[i].segment.length, b.table[i].length);
    EXPECT_TRUE(std::equal(parsed->segments[i].bytes.begin(), parsed->segments[i].bytes.end(),
                           b.parts[i].begin(), b.parts[i].end()));
  }
  std::vector<float> from_bytes(b.total, 1.0f), from_parse(b.total, 1.0f);
  ASSERT_TRUE(DecodeAdd(b.bytes, 0.5f, absl::MakeSpan(from_bytes)).ok());
  ASSERT_TRUE(DecodeAdd(*parsed, 0.5f, absl::MakeSpan(from_parse)).ok());
  EXPECT_EQ(std::memcmp(from_bytes.data(), from_parse.data(), 4 * b.total), 0);
}

TEST(WireParse, ASingleUpdatesBodyStartsAfterItsHeader) {
  const std::vector<uint8_t> a = Encoded(CompressorKind::kAdaComp, 120, 50, 1);
  auto parsed = ParseUpdate(a);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->header.kind, CompressorKind::kAdaComp);
  EXPECT_EQ(parsed->header.bin_size, 50u);
  EXPECT_TRUE(parsed->segments.empty());
  EXPECT_GT(parsed->body, 4u);
  EXPECT_LT(parsed->body, a.size());
  std::vector<float> from_bytes(120), from_parse(120);
  ASSERT_TRUE(DecodeAdd(a, 1.0f, absl::MakeSpan(from_bytes)).ok());
  ASSERT_TRUE(DecodeAdd(*parsed, 1.0f, absl::MakeSpan(from_parse)).ok());
  EXPECT_EQ(from_bytes, from_parse);
  std::vector<float> wrong(119);
  EXPECT_EQ(DecodeAdd(*parsed, 1.0f, absl::MakeSpan(wrong)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WireParse, DamagedTablesAreRefusedByTheParse) {
  const std::vector<uint8_t> a = Encoded(CompressorKind::kAdaComp, 10, 50, 1);
  const std::vector<uint8_t> d = Encoded(CompressorKind::kDense, 4, 1, 2);
  std::vector<uint8_t> both = a;
  both.insert(both.end(), d.begin(), d.end());
  const uint32_t na = a.size(), nd = d.size();
  EXPECT_TRUE(ParseUpdate(Handmade(14, 2, {10, 50, na, 4, 1, nd}, both)).ok());
  EXPECT_EQ(ParseUpdate(Handmade(14, 2, {10, 51, na, 4, 1, nd}, both)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseUpdate(Handmade(14, 2, {10, 50, na, 4, 1, nd - 1}, both)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseUpdate(std::vector<uint8_t>{kWireMagic}).status().code(),
            absl::StatusCode::kDataLoss);
}

// A small ZeroMQ message keeps its bytes inside itself: they move with it, and the parse
// made before the move is re-pointed at them.
TEST(WireParse, MoveToRepointsTheParseAtTheMovedBytes) {
  const Bucket b = ThreeKinds();
  auto parsed = ParseUpdate(b.bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const std::vector<uint8_t> moved = b.bytes;
  parsed->MoveTo(moved);
  EXPECT_EQ(parsed->bytes.data(), moved.data());
  for (const SegmentView& v : parsed->segments) {
    EXPECT_GE(v.bytes.data(), moved.data());
    EXPECT_LE(v.bytes.data() + v.bytes.size(), moved.data() + moved.size());
  }
  std::vector<float> from_bytes(b.total), from_parse(b.total);
  ASSERT_TRUE(DecodeAdd(moved, 1.0f, absl::MakeSpan(from_bytes)).ok());
  ASSERT_TRUE(DecodeAdd(*parsed, 1.0f, absl::MakeSpan(from_parse)).ok());
  EXPECT_EQ(std::memcmp(from_bytes.data(), from_parse.data(), 4 * b.total), 0);
}

}  // namespace
}  // namespace adaps
