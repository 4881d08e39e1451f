// Tile layouts of the AdaComp pass (host code of adacomp_kernels.cu; runs without a GPU).
#include <cstdint>

#include "common/cuda/adacomp_kernels.h"
#include "gtest/gtest.h"

namespace adaps {
namespace cuda {
namespace {

TEST(CudaLayout, TilesKeepBlocksBusyForEveryBinSize) {
  for (uint32_t t = 1; t <= 2048; ++t) {
    const kernels::Layout l = kernels::MakeLayout(1u << 24, t);
    ASSERT_TRUE(l.fused) << t;
    ASSERT_EQ(l.tile_elems % t, 0u) << t;
    ASSERT_LE(l.tile_elems, l.rows * kernels::kBlock) << t;
    ASSERT_LE(l.bins_per_tile, static_cast<uint32_t>(kernels::kMaxBinsPerTile)) << t;
    if (t <= 1024) {
      ASSERT_EQ(l.rows, 8u) << t;
    } else {
      ASSERT_GE(4u * l.tile_elems, 3u * l.rows * kernels::kBlock) << "T " << t << " rows " << l.rows;
    }
  }
  EXPECT_FALSE(kernels::MakeLayout(100000, 2049).fused);
}

}  // namespace
}  // namespace cuda
}  // namespace adaps
