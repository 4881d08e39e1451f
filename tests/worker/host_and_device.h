// Test helpers for the device path against the host path in one job: the same tensor
// declared twice, "h" in host memory and "d" on device 0, given the same gradients.
#ifndef ADAPS_TESTS_WORKER_HOST_AND_DEVICE_H_
#define ADAPS_TESTS_WORKER_HOST_AND_DEVICE_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "adaps/worker.h"
#include "gtest/gtest.h"

namespace adaps {
namespace testing {

// Declares "h" (host) and "d" (device 0) with `init` as the starting values; both must come
// back as `init`.
inline void DeclareHostAndDevice(Worker& worker, const std::vector<float>& init, uint32_t bin,
                                 Compression c, PullFormat pull) {
  for (int device : {-1, 0}) {
    TensorSpec spec{device < 0 ? "h" : "d", {static_cast<int64_t>(init.size())}, bin, c, 0.25,
                    pull};
    spec.device = device;
    spec.fuse = false;  // (a bucket's pushes carry a table: other bytes)
    std::vector<float> values = init;
    ASSERT_TRUE(worker.Declare(spec, absl::MakeSpan(values)).ok());
    ASSERT_EQ(values, init);
  }
}

// Step `step`'s gradient: a sine whose frequency changes each step, its magnitude changing
// every `run` elements (so that bins differ).
inline std::vector<float> VaryingGradient(size_t n, int step, size_t run) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.37f * static_cast<float>((i % 100003) * (step + 1))) *
           (1.0f + static_cast<float>((i / run) % 5));
  }
  return g;
}

}  // namespace testing
}  // namespace adaps

#endif  // ADAPS_TESTS_WORKER_HOST_AND_DEVICE_H_
