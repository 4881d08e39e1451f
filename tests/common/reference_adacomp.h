// A plain, obviously correct AdaComp (docs/algorithm.md, steps 1-9), written straight from
// the contract with no attention to speed. The fast path in common/ must agree with it bit
// for bit. The scale is the bin maxima summed in bin order in double, divided by the number
// of bins, rounded to float -- the definition the fast path also uses.
#ifndef ADAPS_TESTS_COMMON_REFERENCE_ADACOMP_H_
#define ADAPS_TESTS_COMMON_REFERENCE_ADACOMP_H_

#include <cmath>
#include <cstdint>
#include <vector>

namespace adaps::testing {

struct ReferenceResult {
  bool rejected = false;  // step 1: a NaN or Inf in g
  float scale = 0.0f;
  std::vector<uint32_t> indices;
  std::vector<uint8_t> negative;
};

inline ReferenceResult ReferenceAdaComp(const std::vector<float>& g, std::vector<float>& G,
                                        uint32_t T) {
  ReferenceResult res;
  const size_t N = g.size();
  // 1. A bad gradient changes nothing.
  for (float v : g) {
    if (std::isnan(v) || std::isinf(v)) {
      res.rejected = true;
      return res;
    }
  }
  // 2. G += g
  for (size_t i = 0; i < N; ++i) G[i] = G[i] + g[i];
  // 3. H = G + g
  std::vector<float> H(N);
  for (size_t i = 0; i < N; ++i) H[i] = G[i] + g[i];
  // 4. bins and their maxima
  const size_t nb = N == 0 ? 0 : (N + T - 1) / T;
  std::vector<float> gmax(nb, 0.0f);
  for (size_t i = 0; i < N; ++i) {
    const size_t b = i / T;
    if (std::fabs(G[i]) > gmax[b]) gmax[b] = std::fabs(G[i]);
  }
  if (nb == 0) return res;
  // 5. scale
  double sum = 0.0;
  for (size_t b = 0; b < nb; ++b) sum += gmax[b];
  res.scale = static_cast<float>(sum / static_cast<double>(nb));
  // 6-7. selection
  for (size_t i = 0; i < N; ++i) {
    const size_t b = i / T;
    if (gmax[b] > 0.0f && G[i] != 0.0f && std::fabs(H[i]) >= gmax[b]) {
      res.indices.push_back(static_cast<uint32_t>(i));
      res.negative.push_back(G[i] < 0.0f ? 1 : 0);
    }
  }
  // 8. residue of the selected elements only
  for (size_t j = 0; j < res.indices.size(); ++j) {
    const uint32_t i = res.indices[j];
    G[i] = res.negative[j] ? G[i] + res.scale : G[i] - res.scale;
  }
  return res;
}

}  // namespace adaps::testing

#endif  // ADAPS_TESTS_COMMON_REFERENCE_ADACOMP_H_
