// The synthetic mode's realistic gradient stream (worker/app/gradient_stream.h): deterministic,
// workers of one model (same seed, own noise_seed) share which coordinates are large, and
// AdaComp at bin 500 sends about 1% of it, as the header says.
#include "worker/app/gradient_stream.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/compressor.h"
#include "gtest/gtest.h"

namespace adaps {
namespace {

using bench::GradientStream;
using bench::GradientStreamOptions;

constexpr size_t kLength = 200000;

std::vector<float> Steps(GradientStreamOptions o, int steps) {
  GradientStream stream(o);
  std::vector<float> g(o.length), last;
  for (int s = 0; s < steps; ++s) stream.Next(absl::MakeSpan(g));
  return g;
}

// The coordinates of the `k` largest mean magnitudes over `steps` steps.
std::vector<size_t> Largest(const GradientStreamOptions& o, int steps, size_t k) {
  GradientStream stream(o);
  std::vector<float> g(o.length);
  std::vector<double> mean(o.length, 0.0);
  for (int s = 0; s < steps; ++s) {
    stream.Next(absl::MakeSpan(g));
    for (size_t i = 0; i < g.size(); ++i) mean[i] += std::fabs(g[i]);
  }
  std::vector<size_t> order(o.length);
  std::iota(order.begin(), order.end(), size_t{0});
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](size_t a, size_t b) { return mean[a] > mean[b]; });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

size_t Common(const std::vector<size_t>& a, const std::vector<size_t>& b) {
  std::vector<size_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return both.size();
}

TEST(GradientStream, IsDeterministicAndEachNoiseSeedGivesOtherValues) {
  GradientStreamOptions a = GradientStream::Tuned1Percent(kLength, 3);
  a.noise_seed = 11;
  GradientStreamOptions b = a;
  b.noise_seed = 12;
  EXPECT_EQ(Steps(a, 3), Steps(a, 3));
  EXPECT_NE(Steps(a, 3), Steps(b, 3));
}

TEST(GradientStream, WorkersOfOneModelShareTheirLargeCoordinates) {
  const size_t k = kLength / 500;  // the heavy fraction's order
  GradientStreamOptions w0 = GradientStream::Tuned1Percent(kLength, 3);
  w0.noise_seed = 11;
  GradientStreamOptions w1 = w0;
  w1.noise_seed = 12;
  GradientStreamOptions other_model = GradientStream::Tuned1Percent(kLength, 4);
  other_model.noise_seed = 12;
  const std::vector<size_t> l0 = Largest(w0, 4, k), l1 = Largest(w1, 4, k);
  const std::vector<size_t> lo = Largest(other_model, 4, k);
  EXPECT_GT(Common(l0, l1), k / 2);   // the same model's heavy coordinates (59% here)
  EXPECT_LT(Common(l0, lo), k / 10);  // chance overlap only
}

TEST(GradientStream, AdaCompAtBin500SendsAboutOnePercent) {
  GradientStream stream(GradientStream::Tuned1Percent(kLength, 5));
  CompressorOptions o;
  o.kind = CompressorKind::kAdaComp;
  o.bin_size = 500;
  auto compressor = MakeCompressor(o);
  ASSERT_TRUE(compressor.ok());
  SliceState residue(kLength);
  std::vector<float> g(kLength);
  CompressedUpdate u;
  for (int s = 0; s < 8; ++s) {
    stream.Next(absl::MakeSpan(g));
    ASSERT_TRUE((*compressor)->Compress(g, residue, u).ok());
  }
  const double density = static_cast<double>(u.indices.size()) / kLength;
  EXPECT_GT(density, 0.003);
  EXPECT_LT(density, 0.03);
}

}  // namespace
}  // namespace adaps
