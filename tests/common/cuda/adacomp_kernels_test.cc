// Host code of adacomp_kernels (runs without a GPU): the tile layouts of the AdaComp pass, the
// unrolled sum of the scale, and the slice control word's transitions (PublishPass,
// CommitStaged, DiscardStaged: the same inline functions the kernels run) against the CPU's
// SliceState as the model.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/compressor.h"
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

// The unrolled sum of the last block adds exactly what the plain strided loop it replaced added,
// in the same order: the scale does not change by a bit. Magnitudes spread over 2^-60..2^60
// make any other association round differently.
TEST(CudaScaleSum, UnrolledStridedSumIsBitForBitThePlainLoop) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> expo(-60, 60);
  std::vector<double> x(40000);
  for (double& v : x) v = std::ldexp(mant(rng), expo(rng));
  for (uint32_t n : {1u, 7u, 255u, 256u, 257u, 2047u, 2048u, 2049u, 12500u, 40000u}) {
    for (uint32_t t = 0; t < static_cast<uint32_t>(kernels::kBlock); ++t) {
      double plain = 0.0;
      for (uint32_t j = t; j < n; j += kernels::kBlock) plain += x[j];
      const double unrolled = kernels::StridedSum(t, n, [&](uint32_t j) { return x[j]; });
      ASSERT_EQ(std::memcmp(&plain, &unrolled, sizeof plain), 0)
          << "n " << n << " thread " << t << ": " << plain << " vs " << unrolled;
    }
  }
}

// The device slice (two residue sets and the control word) driven by the kernels' transitions
// and the CPU's SliceState driven by what its compressor does on each outcome (Discard, then
// swap_residue / set_pending on success; Commit, Discard), over random sequences of one- and
// two-phase steps that succeed or fail, commits and discards: after every operation the
// device's active set holds what the CPU's residue holds. A step writes a fresh value into the
// spare set of both, as the pass does.
TEST(CudaSliceControl, TransitionsFollowTheCpuSliceStateOverRandomSequences) {
  std::mt19937 rng(27);
  for (int seq = 0; seq < 1500; ++seq) {
    SliceState cpu(1);
    float dev[2] = {0.0f, 0.0f};
    kernels::SliceCtl ctl{};
    kernels::Header h{};
    std::string trace;
    float next = 1.0f;
    for (int op = 0; op < 24; ++op) {
      const int kind = static_cast<int>(rng() % 6);
      if (kind <= 3) {  // a step: one phase or two, succeeding or failing
        const bool two_phase = (kind & 1) != 0;
        const bool failed = (kind & 2) != 0 && rng() % 2 == 0;
        absl::StrAppend(&trace, two_phase ? "pending" : "step", failed ? "-failed " : " ");
        const unsigned a = ctl.active & 1u;
        dev[a ^ 1u] = next;
        kernels::PublishPass(&ctl, &h, a, failed, two_phase, 0.5f, 3u);
        EXPECT_EQ(h.ok, failed ? 0u : 1u) << trace;
        cpu.Discard();
        cpu.spare_residue()[0] = next;
        if (!failed) {
          if (two_phase) {
            cpu.set_pending();
          } else {
            cpu.swap_residue();
          }
        }
        next += 1.0f;
      } else if (kind == 4) {
        absl::StrAppend(&trace, "commit ");
        kernels::CommitStaged(&ctl);
        cpu.Commit();
      } else {
        absl::StrAppend(&trace, "discard ");
        kernels::DiscardStaged(&ctl);
        cpu.Discard();
      }
      ASSERT_EQ(dev[ctl.active & 1u], cpu.residue()[0]) << "sequence " << seq << ": " << trace;
      ASSERT_EQ(ctl.staged != 0u, cpu.pending()) << "sequence " << seq << ": " << trace;
    }
  }
}

// A successful two-phase pass records its fix-up scale for the staged set and leaves the
// active one's alone; a failed pass changes no scale and reports an empty step.
TEST(CudaSliceControl, AStagedPassKeepsTheActiveSetsFixup) {
  kernels::SliceCtl ctl{};
  ctl.pending_scale[0] = 0.25f;
  kernels::Header h{};
  kernels::PublishPass(&ctl, &h, 0u, false, true, 0.5f, 7u);
  EXPECT_EQ(ctl.active, 0u);
  EXPECT_EQ(ctl.pending_scale[0], 0.25f);
  EXPECT_EQ(ctl.pending_scale[1], 0.5f);
  EXPECT_EQ(h.count, 7u);
  EXPECT_EQ(h.scale, 0.5f);
  kernels::PublishPass(&ctl, &h, 0u, true, true, 9.0f, 9u);
  EXPECT_EQ(ctl.pending_scale[0], 0.25f);
  EXPECT_EQ(ctl.pending_scale[1], 0.5f);
  EXPECT_EQ(ctl.staged, 0u);
  EXPECT_EQ(h.count, 0u);
  EXPECT_EQ(h.scale, 0.0f);
  EXPECT_EQ(h.ok, 0u);
}

}  // namespace
}  // namespace cuda
}  // namespace adaps
