// The Rice index stream, byte for byte: EncodeUpdate's fast writer (one pass pricing the Rice
// parameters, a 64-bit window) must write exactly the stream of the format's definition,
// here a plain bit-at-a-time reference, for every gap size (short codes, codes longer than
// the window, escapes) with and without signs; and the decoder must give every case back.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/wire_codec.h"
#include "gtest/gtest.h"

namespace adaps {
namespace {

constexpr uint32_t kEscape = 32;

// The format (common/wire_codec.h): per element, with gap = index - previous index - 1 and
// q = gap >> k: q ones, a zero and the k low bits of the gap (LSB first) when q < 32, else
// 32 ones and the gap's 32 bits; then the sign bit (AdaComp). k is the cheapest of the four
// parameters around log2 of the mean gap (the lowest on a tie). The parameter byte holds k
// and the padding bits of the last byte.
struct RefBits {
  std::vector<uint8_t> bytes;
  uint64_t n = 0;
  void Put(uint64_t v, unsigned count) {
    for (unsigned b = 0; b < count; ++b) {
      if (n % 8 == 0) bytes.push_back(0);
      if ((v >> b) & 1) bytes.back() |= static_cast<uint8_t>(1u << (n % 8));
      ++n;
    }
  }
};

uint64_t RefCost(const std::vector<uint32_t>& idx, unsigned k) {
  uint64_t bits = 0;
  int64_t prev = -1;
  for (uint32_t i : idx) {
    const uint64_t q = static_cast<uint64_t>(i - prev - 1) >> k;
    bits += q >= kEscape ? kEscape + 32 : q + 1 + k;
    prev = i;
  }
  return bits;
}

// The index stream as EncodeUpdate appends it after the count (and scale).
std::vector<uint8_t> RefStream(const CompressedUpdate& u, bool with_signs) {
  unsigned k = 0;
  if (!u.indices.empty()) {
    const double mean = double(u.length - u.indices.size()) / double(u.indices.size());
    const int center = mean > 1.0 ? static_cast<int>(std::log2(mean)) : 0;
    uint64_t best = std::numeric_limits<uint64_t>::max();
    for (int c = std::max(0, center - 2); c <= std::min(31, center + 1); ++c) {
      const uint64_t cost = RefCost(u.indices, c);
      if (cost < best) best = cost, k = c;
    }
  }
  RefBits w;
  int64_t prev = -1;
  for (size_t j = 0; j < u.indices.size(); ++j) {
    const uint64_t gap = u.indices[j] - prev - 1;
    const uint64_t q = gap >> k;
    if (q >= kEscape) {
      w.Put(0xffffffffu, 32);
      w.Put(gap, 32);
    } else {
      w.Put((uint64_t{1} << q) - 1, static_cast<unsigned>(q));
      w.Put(0, 1);
      w.Put(gap, k);
    }
    if (with_signs) w.Put(u.negative[j], 1);
    prev = u.indices[j];
  }
  const unsigned pad = w.n % 8 ? 8 - w.n % 8 : 0;
  std::vector<uint8_t> out{static_cast<uint8_t>(k | (pad << 5))};
  out.insert(out.end(), w.bytes.begin(), w.bytes.end());
  return out;
}

// Indices with gaps drawn from `gap` (ascending, below `length`).
template <typename Dist>
CompressedUpdate Update(CompressorKind kind, uint32_t length, Dist gap, std::mt19937& rng) {
  CompressedUpdate u;
  u.kind = kind;
  u.length = length;
  u.bin_size = 50;
  u.scale = 0.5f;
  uint64_t i = gap(rng);
  while (i < length) {
    u.indices.push_back(static_cast<uint32_t>(i));
    u.negative.push_back(rng() & 1);
    if (kind == CompressorKind::kTopK) u.values.push_back(1.0f);
    i += 1 + gap(rng);
  }
  if (kind == CompressorKind::kTopK) u.negative.clear();
  return u;
}

void ExpectReferenceStream(const CompressedUpdate& u) {
  const bool signs = u.kind == CompressorKind::kAdaComp;
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(EncodeUpdate(u, IndexCoding::kRice, &bytes).ok());
  const std::vector<uint8_t> ref = RefStream(u, signs);
  const size_t trailing = u.kind == CompressorKind::kTopK ? 4 * u.values.size() : 0;
  ASSERT_GE(bytes.size(), ref.size() + trailing);
  const std::vector<uint8_t> stream(bytes.end() - trailing - ref.size(), bytes.end() - trailing);
  ASSERT_EQ(stream, ref) << u.indices.size() << " indices over " << u.length;
  CompressedUpdate back;
  ASSERT_TRUE(DecodeUpdate(bytes, &back).ok());
  EXPECT_EQ(back.indices, u.indices);
  EXPECT_EQ(back.negative, u.negative);
}

TEST(WireRice, StreamIsTheReferenceForEveryGapDistribution) {
  std::mt19937 rng(11);
  for (CompressorKind kind : {CompressorKind::kAdaComp, CompressorKind::kTopK}) {
    for (double mean : {0.2, 1.0, 3.0, 25.0, 100.0, 3000.0}) {
      std::geometric_distribution<uint32_t> geo(1.0 / (1.0 + mean));
      ExpectReferenceStream(Update(kind, 200000, geo, rng));
    }
    // Mostly short gaps with rare huge ones: escapes beside a small k.
    auto bursty = [](std::mt19937& r) -> uint32_t { return r() % 50 == 0 ? 1u << 24 : r() % 8; };
    ExpectReferenceStream(Update(kind, 1u << 30, bursty, rng));
    // Gaps of 16 to 80 times the mean beside it: codes just under and just over the escape
    // (q of 32 and more is priced and written as an escape).
    auto near_escape = [](std::mt19937& r) -> uint32_t {
      return r() % 20 == 0 ? 128 + r() % 512 : r() % 16;
    };
    ExpectReferenceStream(Update(kind, 1u << 20, near_escape, rng));
    // 15 gaps of 0 and one of 64, over and over: k = 2 is the cheapest only because q = 32
    // at k = 1 costs an escape's 64 bits.
    int n = 0;
    auto escape_decides = [&n](std::mt19937&) -> uint32_t { return ++n % 16 == 0 ? 64 : 0; };
    ExpectReferenceStream(Update(kind, 80000, escape_decides, rng));
    // A few indices over the whole 32-bit range: k near 30, codes longer than the window.
    std::uniform_int_distribution<uint32_t> wide(0, 1u << 30);
    ExpectReferenceStream(Update(kind, std::numeric_limits<uint32_t>::max(), wide, rng));
    std::uniform_int_distribution<uint32_t> q31(15u << 25, 31u << 25);  // q up to 31 at k 25
    ExpectReferenceStream(Update(kind, std::numeric_limits<uint32_t>::max(), q31, rng));
  }
}

// Whole codes longer than the writer's 56-bit fast path (q + 1 + k + sign > 56): groups of 17
// gaps of 2^24 make k = 25 the cheapest, and each group's one gap of ~31 x 2^25 then takes
// q = 31 at k = 25.
TEST(WireRice, CodesLongerThanTheWindowAreTheReference) {
  for (CompressorKind kind : {CompressorKind::kAdaComp, CompressorKind::kTopK}) {
   for (uint32_t prefix = 0; prefix < 8; ++prefix) {  // shifts the long codes' bit positions
    CompressedUpdate u;
    u.kind = kind;
    u.length = std::numeric_limits<uint32_t>::max();
    u.bin_size = 50;
    u.scale = 1.0f;
    for (uint32_t j = 0; j < prefix; ++j) u.indices.push_back(j);
    uint64_t i = prefix;
    for (int group = 0; group < 3; ++group) {
      for (int j = 0; j < 17; ++j) {
        i += (1u << 24) + 1;  // gap 2^24
        u.indices.push_back(static_cast<uint32_t>(i));
      }
      i += (31u << 25) + 5;
      u.indices.push_back(static_cast<uint32_t>(i));
    }
    for (size_t j = 0; j < u.indices.size(); ++j) {
      if (kind == CompressorKind::kAdaComp) u.negative.push_back(j % 2);
      if (kind == CompressorKind::kTopK) u.values.push_back(2.0f);
    }
    ASSERT_EQ(RefStream(u, false)[0] & 0x1f, 25);  // the case is what it says
    ExpectReferenceStream(u);
   }
  }
}

TEST(WireRice, EveryLengthOfStreamEndsOnTheRightByte) {
  // 1..64 elements of one gap: every padding 0..7 and window position at the end.
  for (uint32_t gap : {0u, 1u, 6u, 1000u}) {
    for (int n = 1; n <= 64; ++n) {
      CompressedUpdate u;
      u.kind = CompressorKind::kAdaComp;
      u.bin_size = 50;
      u.scale = 1.0f;
      for (int j = 0; j < n; ++j) {
        u.indices.push_back(j * (gap + 1) + gap);
        u.negative.push_back(j % 3 == 0);
      }
      u.length = u.indices.back() + 1 + gap;
      ExpectReferenceStream(u);
    }
  }
}

}  // namespace
}  // namespace adaps
