#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/compressor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/reference_adacomp.h"

namespace adaps {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

CompressorOptions AdaCompOptions(uint32_t bin_size,
                                 NonFinitePolicy policy = NonFinitePolicy::kReject) {
  CompressorOptions o;
  o.kind = CompressorKind::kAdaComp;
  o.bin_size = bin_size;
  o.non_finite = policy;
  return o;
}

std::unique_ptr<Compressor> MakeAdaComp(uint32_t bin_size,
                                        NonFinitePolicy policy = NonFinitePolicy::kReject) {
  auto c = MakeCompressor(AdaCompOptions(bin_size, policy));
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

void SetResidue(SliceState& s, const std::vector<float>& v) {
  std::copy(v.begin(), v.end(), s.residue().begin());
}

std::vector<float> Residue(const SliceState& s) {
  return std::vector<float>(s.residue().begin(), s.residue().end());
}

// Gaussian background with a few large coordinates, like a real gradient.
std::vector<float> RandomGradient(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = normal(rng);
    if (u(rng) < 0.01f) g[i] *= 30.0f;
    if (u(rng) < 0.02f) g[i] = 0.0f;  // exact zeros occur (ReLU, embeddings)
  }
  return g;
}

// Worked by hand. N = 12, T = 4, so 3 bins.
//   G0 = [ .125 -.25   .5  .375 |  0 0 0 0 |  .5  -.125  .125  0 ]
//   g  = [ .25   .125 -.5 -.125 |  0 0 0 0 | -.25 -.5    .25   0 ]
// 2. G  = [ .375 -.125  0   .25  |  0 0 0 0 |  .25 -.625  .375  0 ]
// 3. H  = [ .625  0    -.5  .125 |  0 0 0 0 |  0   -1.125 .625  0 ]
// 4. gmax = [.375, 0, .625]
// 5. s = (.375 + 0 + .625) / 3 = 1/3
// 6. bin 0: i=0 |H|=.625>=.375 yes; i=1 0 no; i=2 |H|=.5>=.375 but G=0 so no; i=3 .125 no.
//    bin 1: gmax = 0, nothing.  bin 2: i=9 1.125 yes; i=10 .625>=.625 (a tie) yes; i=8 no.
// 7. sent: (0,+), (9,-), (10,+), each worth s.
// 8. G[0] = .375 - 1/3, G[9] = -.625 + 1/3, G[10] = .375 - 1/3; the rest keep G.
TEST(AdaComp, MatchesHandWorkedExample) {
  auto c = MakeAdaComp(4);
  SliceState state(12);
  SetResidue(state, {.125f, -.25f, .5f, .375f, 0, 0, 0, 0, .5f, -.125f, .125f, 0});
  const std::vector<float> g = {.25f, .125f, -.5f, -.125f, 0, 0, 0, 0, -.25f, -.5f, .25f, 0};
  CompressedUpdate u;
  ASSERT_TRUE(c->Compress(g, state, u).ok());

  const float s = static_cast<float>(1.0 / 3.0);
  EXPECT_EQ(u.kind, CompressorKind::kAdaComp);
  EXPECT_EQ(u.length, 12u);
  EXPECT_EQ(u.bin_size, 4u);
  EXPECT_FLOAT_EQ(u.scale, s);
  EXPECT_THAT(u.indices, ElementsAre(0u, 9u, 10u));
  EXPECT_THAT(u.negative, ElementsAre(0, 1, 0));
  const std::vector<float> expected = {.375f - s, -.125f, 0, .25f, 0, 0, 0, 0,
                                       .25f, -.625f + s, .375f - s, 0};
  const std::vector<float> got = Residue(state);
  for (size_t i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(got[i], expected[i]) << "i=" << i;
}

struct Shape {
  size_t length;
  uint32_t bin_size;
};

class AdaCompProperty : public ::testing::TestWithParam<Shape> {};

std::vector<Shape> Shapes() {
  std::vector<Shape> shapes;
  for (uint32_t t : {1u, 4u, 7u, 50u, 500u}) {
    for (size_t n : {size_t{1}, size_t{t > 1 ? t - 1 : 1}, size_t{t}, size_t{t} + 1,
                     size_t{3} * t + 5, size_t{10007}, size_t{131072}}) {
      bool seen = false;
      for (const Shape& s : shapes) seen |= s.length == n && s.bin_size == t;
      if (!seen) shapes.push_back({n, t});
    }
  }
  return shapes;
}

std::string ShapeName(const ::testing::TestParamInfo<Shape>& info) {
  return "N" + std::to_string(info.param.length) + "_T" + std::to_string(info.param.bin_size);
}

TEST_P(AdaCompProperty, FastPathEqualsReferenceBitForBit) {
  const auto [n, t] = GetParam();
  using internal::AdaCompIsa;
  using internal::AdaCompStores;
  for (AdaCompIsa isa : {AdaCompIsa::kPortable, AdaCompIsa::kAvx2, AdaCompIsa::kAvx512}) {
    if (!internal::AdaCompIsaSupported(isa)) {
      std::printf("  (%s path not run: this CPU lacks it)\n", internal::AdaCompIsaName(isa));
      continue;
    }
    for (AdaCompStores stores : {AdaCompStores::kRegular, AdaCompStores::kStreaming}) {
      std::mt19937 rng(static_cast<uint32_t>(n * 31 + t));
      // The kernel is out of place: ping-pong between two buffers as SliceState does. An
      // offset of one float makes the buffers unaligned, as a caller's vectors may be.
      std::vector<float> ref_residue(n, 0.0f), gmax;
      std::vector<float> buf_a(n + 1, 0.0f), buf_b(n + 1, 0.0f);
      const size_t off = (n % 2 == 0) ? 1 : 0;
      float* cur = buf_a.data() + off;
      float* nxt = buf_b.data() + off;
      CompressedUpdate u;
      for (int step = 0; step < 5; ++step) {
        const std::vector<float> g = RandomGradient(rng, n);
        const auto ref = testing::ReferenceAdaComp(g, ref_residue, t);
        ASSERT_TRUE(internal::AdaCompStep(g, absl::MakeConstSpan(cur, n), absl::MakeSpan(nxt, n),
                                          t, gmax, u, isa, stores));
        std::swap(cur, nxt);
        const std::string what = std::string(internal::AdaCompIsaName(isa)) + " stores " +
                                 std::to_string(static_cast<int>(stores)) + " step " +
                                 std::to_string(step);
        ASSERT_EQ(u.indices, ref.indices) << what;
        ASSERT_EQ(u.negative, ref.negative) << what;
        ASSERT_EQ(std::memcmp(&u.scale, &ref.scale, sizeof(float)), 0)
            << u.scale << " vs " << ref.scale << " " << what;
        ASSERT_EQ(std::memcmp(cur, ref_residue.data(), n * sizeof(float)), 0)
            << "residues differ: " << what;
      }
      // A NaN/Inf anywhere, or an overflow of residue + gradient: refused, input untouched.
      const std::vector<float> before(cur, cur + n);
      for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::max()}) {
        for (size_t pos : {size_t{0}, n / 2, n - 1}) {
          std::vector<float> g = RandomGradient(rng, n);
          g[pos] = bad;
          if (bad == std::numeric_limits<float>::max()) {
            // Overflows only where the residue already points the same way.
            if (!(cur[pos] > 0.0f)) continue;
            g[pos] = std::numeric_limits<float>::max();
            cur[pos] = std::numeric_limits<float>::max();
          }
          EXPECT_FALSE(internal::AdaCompStep(g, absl::MakeConstSpan(cur, n),
                                             absl::MakeSpan(nxt, n), t, gmax, u, isa, stores))
              << internal::AdaCompIsaName(isa) << " pos " << pos;
          EXPECT_THAT(u.indices, IsEmpty());
          std::copy(before.begin(), before.end(), cur);
        }
      }
    }
  }
}

// The server's recompression: the gradient params - published - residue computed inside the
// pass gives the same update and residue, bit for bit, as the pass over the stored gradient.
TEST_P(AdaCompProperty, ChangeStepEqualsTheStepOverTheStoredChange) {
  const auto [n, t] = GetParam();
  using internal::AdaCompIsa;
  using internal::AdaCompStores;
  for (AdaCompIsa isa : {AdaCompIsa::kPortable, AdaCompIsa::kAvx2, AdaCompIsa::kAvx512}) {
    for (AdaCompStores stores : {AdaCompStores::kRegular, AdaCompStores::kStreaming}) {
      if (!internal::AdaCompIsaSupported(isa)) continue;
      std::mt19937 rng(static_cast<uint32_t>(n * 17 + t));
      std::vector<float> params = RandomGradient(rng, n), published(n, 0.0f);
      std::vector<float> residue(n, 0.0f), want_residue(n), got_residue(n), change(n);
      std::vector<float> gmax, scratch;
      CompressedUpdate want, got;
      for (int step = 0; step < 4; ++step) {
        for (size_t i = 0; i < n; ++i) change[i] = params[i] - published[i] - residue[i];
        ASSERT_TRUE(internal::AdaCompStep(change, residue, absl::MakeSpan(want_residue), t, gmax,
                                          want, isa));
        ASSERT_TRUE(internal::AdaCompChangeStep(params, published, residue,
                                                absl::MakeSpan(got_residue), t, gmax, scratch, got,
                                                isa, stores));
        const std::string what = std::string(internal::AdaCompIsaName(isa)) + " stores " +
                                 std::to_string(static_cast<int>(stores)) + " step " +
                                 std::to_string(step);
        ASSERT_EQ(got.indices, want.indices) << what;
        ASSERT_EQ(got.negative, want.negative) << what;
        ASSERT_EQ(std::memcmp(&got.scale, &want.scale, sizeof(float)), 0) << what;
        ASSERT_EQ(std::memcmp(got_residue.data(), want_residue.data(), n * sizeof(float)), 0)
            << what;
        ASSERT_TRUE(DecompressAdd(got, 1.0f, absl::MakeSpan(published)).ok());
        residue = got_residue;
        const std::vector<float> g = RandomGradient(rng, n);
        for (size_t i = 0; i < n; ++i) params[i] -= 0.1f * g[i];
      }
      params[n / 2] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_FALSE(internal::AdaCompChangeStep(params, published, residue,
                                               absl::MakeSpan(got_residue), t, gmax, scratch, got,
                                               isa, stores));
      EXPECT_THAT(got.indices, IsEmpty());
    }
  }
}

TEST_P(AdaCompProperty, ResidueKeepsWhatWasNotSent) {
  const auto [n, t] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(n * 17 + t));
  auto c = MakeAdaComp(t);
  SliceState state(n);
  CompressedUpdate u;
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> before = Residue(state);
    const std::vector<float> g = RandomGradient(rng, n);
    ASSERT_TRUE(c->Compress(g, state, u).ok());
    std::vector<float> decoded(n, 0.0f);
    ASSERT_TRUE(DecompressAdd(u, 1.0f, absl::MakeSpan(decoded)).ok());
    const std::vector<float> after = Residue(state);
    for (size_t i = 0; i < n; ++i) {
      const float lhs = before[i] + g[i];
      const float rhs = after[i] + decoded[i];
      // One rounding in G+g and one in the fix-up: a few ulps of the larger operand.
      const float tol = 4 * std::numeric_limits<float>::epsilon() *
                        std::max({std::fabs(lhs), std::fabs(u.scale), 1e-30f});
      ASSERT_NEAR(lhs, rhs, tol) << "i=" << i << " step=" << step;
    }
  }
}

TEST_P(AdaCompProperty, AllZeroBinsSendNothing) {
  const auto [n, t] = GetParam();
  auto c = MakeAdaComp(t);
  SliceState state(n);
  std::vector<float> g(n, 0.0f);
  // Every other bin carries a value; the zero bins must contribute no element.
  for (size_t i = 0; i < n; i += 2 * static_cast<size_t>(t)) g[i] = 1.0f;
  CompressedUpdate u;
  ASSERT_TRUE(c->Compress(g, state, u).ok());
  for (uint32_t i : u.indices) EXPECT_EQ((i / t) % 2, 0u) << "index " << i << " in a zero bin";
  std::vector<float> zero(n, 0.0f);
  SliceState fresh(n);
  ASSERT_TRUE(c->Compress(zero, fresh, u).ok());
  EXPECT_THAT(u.indices, IsEmpty());
}

TEST_P(AdaCompProperty, NonFiniteGradientLeavesResidueUntouched) {
  const auto [n, t] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(n + t));
  auto reject = MakeAdaComp(t, NonFinitePolicy::kReject);
  auto skip = MakeAdaComp(t, NonFinitePolicy::kSendNothing);
  SliceState state(n);
  CompressedUpdate u;
  ASSERT_TRUE(reject->Compress(RandomGradient(rng, n), state, u).ok());
  const std::vector<float> before = Residue(state);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (size_t pos : {size_t{0}, n / 2, n - 1}) {
      std::vector<float> g = RandomGradient(rng, n);
      g[pos] = bad;
      absl::Status st = reject->Compress(g, state, u);
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      ASSERT_EQ(std::memcmp(Residue(state).data(), before.data(), n * sizeof(float)), 0);
      st = skip->Compress(g, state, u);
      EXPECT_TRUE(st.ok()) << st;
      EXPECT_THAT(u.indices, IsEmpty());
      ASSERT_EQ(std::memcmp(Residue(state).data(), before.data(), n * sizeof(float)), 0);
    }
  }
}

TEST_P(AdaCompProperty, OverflowIsReportedAndLeavesResidueUntouched) {
  const auto [n, t] = GetParam();
  auto c = MakeAdaComp(t);
  SliceState state(n);
  std::vector<float> g(n, 1.0f);
  CompressedUpdate u;
  ASSERT_TRUE(c->Compress(g, state, u).ok());
  state.residue()[n - 1] = std::numeric_limits<float>::max();
  const std::vector<float> before = Residue(state);
  g[n - 1] = std::numeric_limits<float>::max();
  EXPECT_EQ(c->Compress(g, state, u).code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(u.indices, IsEmpty());
  ASSERT_EQ(std::memcmp(Residue(state).data(), before.data(), n * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AdaCompProperty, ::testing::ValuesIn(Shapes()), ShapeName);

TEST(AdaComp, SliceShorterThanBinIsOneBin) {
  auto c = MakeAdaComp(500);
  SliceState state(3);
  // One bin: gmax = 4, scale = 4 / 1. H = 2G: |H| >= 4 for |G| >= 2, G != 0.
  const std::vector<float> g = {1.0f, -4.0f, 2.0f};
  CompressedUpdate u;
  ASSERT_TRUE(c->Compress(g, state, u).ok());
  EXPECT_FLOAT_EQ(u.scale, 4.0f);
  EXPECT_THAT(u.indices, ElementsAre(1u, 2u));
  EXPECT_THAT(u.negative, ElementsAre(1, 0));
  EXPECT_THAT(Residue(state), ElementsAre(1.0f, 0.0f, -2.0f));
}

TEST(AdaComp, SelectionIsDeterministic) {
  std::mt19937 rng(7);
  const std::vector<float> g = RandomGradient(rng, 50000);
  auto c = MakeAdaComp(50);
  SliceState a(g.size()), b(g.size());
  CompressedUpdate ua, ub;
  ASSERT_TRUE(c->Compress(g, a, ua).ok());
  ASSERT_TRUE(c->Compress(g, b, ub).ok());
  EXPECT_EQ(ua.indices, ub.indices);
  EXPECT_EQ(ua.negative, ub.negative);
  EXPECT_EQ(ua.scale, ub.scale);
}

TEST(AdaComp, WrongGradientLengthIsRejected) {
  auto c = MakeAdaComp(50);
  SliceState state(100);
  std::vector<float> g(99, 1.0f);
  CompressedUpdate u;
  EXPECT_EQ(c->Compress(g, state, u).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Residue(state), ::testing::Each(0.0f));
}

// Error feedback: over 1000 steps of a gradient with a drift, everything the decoder
// received plus what the residue still holds equals the sum of the gradients, and the
// residue stays bounded instead of growing with the number of steps.
TEST(AdaComp, ErrorFeedbackTracksGradientSumWithBoundedResidue) {
  constexpr size_t kN = 2000;
  constexpr uint32_t kT = 50;
  std::mt19937 rng(11);
  std::normal_distribution<float> noise(0.0f, 1e-3f);
  std::vector<float> drift(kN);
  for (size_t i = 0; i < kN; ++i) drift[i] = 2e-4f * static_cast<float>(static_cast<int>(i % 7) - 3);
  auto c = MakeAdaComp(kT);
  SliceState state(kN);
  std::vector<double> grad_sum(kN, 0.0), sent_sum(kN, 0.0);
  std::vector<float> decoded(kN);
  CompressedUpdate u;
  float max_residue_first_half = 0.0f, max_residue_second_half = 0.0f;
  for (int step = 0; step < 1000; ++step) {
    std::vector<float> g(kN);
    for (size_t i = 0; i < kN; ++i) g[i] = drift[i] + noise(rng);
    ASSERT_TRUE(c->Compress(g, state, u).ok());
    std::fill(decoded.begin(), decoded.end(), 0.0f);
    ASSERT_TRUE(DecompressAdd(u, 1.0f, absl::MakeSpan(decoded)).ok());
    float m = 0.0f;
    for (size_t i = 0; i < kN; ++i) {
      grad_sum[i] += g[i];
      sent_sum[i] += decoded[i];
      m = std::max(m, std::fabs(state.residue()[i]));
    }
    (step < 500 ? max_residue_first_half : max_residue_second_half) =
        std::max(step < 500 ? max_residue_first_half : max_residue_second_half, m);
  }
  double worst = 0.0;
  for (size_t i = 0; i < kN; ++i) {
    worst = std::max(worst, std::fabs(grad_sum[i] - sent_sum[i] - state.residue()[i]));
  }
  EXPECT_LT(worst, 1e-3) << "sent + residue drifted away from the sum of gradients";
  // Bounded: the second half of the run needs no larger residue than 2x the first half,
  // and the residue stays small next to the accumulated gradient (|drift| * 1000 = 0.6).
  EXPECT_LE(max_residue_second_half, 2.0f * max_residue_first_half);
  EXPECT_LT(max_residue_second_half, 0.05f);
}

}  // namespace
}  // namespace adaps
