// Host-side logic of the CUDA compressors, on any machine (no GPU needed): the result of a
// failed step, and a rejected Enqueue forgetting the last update (zero-length slices touch no
// device).
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/compressor.h"
#include "common/cuda/cuda_compressor.h"
#include "gtest/gtest.h"

namespace adaps {
namespace cuda {
namespace {

CompressorOptions AdaCompOptions(uint32_t bin_size,
                                 NonFinitePolicy policy = NonFinitePolicy::kReject) {
  CompressorOptions o;
  o.kind = CompressorKind::kAdaComp;
  o.bin_size = bin_size;
  o.non_finite = policy;
  return o;
}

TEST(CudaStepResult, AnOverflowGivesOutOfRangeAndTheCpusEmptyUpdate) {
  CompressedUpdate out;
  out.indices = {1, 2, 3};
  out.negative = {0, 1, 0};
  out.scale = std::numeric_limits<float>::infinity();
  bool failed = false;
  const absl::Status s =
      internal::ResolveStep(false, true, AdaCompOptions(50), 100, out, &failed);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_TRUE(failed);
  EXPECT_EQ(out.kind, CompressorKind::kAdaComp);
  EXPECT_EQ(out.length, 100u);
  EXPECT_EQ(out.bin_size, 50u);
  EXPECT_TRUE(out.indices.empty());
  EXPECT_TRUE(out.negative.empty());
  EXPECT_EQ(out.scale, 0.0f);
}

TEST(CudaStepResult, ANonFiniteGradientFollowsThePolicyAndASuccessLeavesTheUpdate) {
  CompressedUpdate out;
  bool failed = false;
  EXPECT_EQ(internal::ResolveStep(true, true, AdaCompOptions(50), 10, out, &failed).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(failed);
  EXPECT_TRUE(internal::ResolveStep(true, false,
                                    AdaCompOptions(50, NonFinitePolicy::kSendNothing), 10, out,
                                    &failed)
                  .ok());
  EXPECT_TRUE(failed);
  EXPECT_TRUE(out.indices.empty());
  out.indices = {4};
  EXPECT_TRUE(internal::ResolveStep(false, false, AdaCompOptions(50), 10, out, &failed).ok());
  EXPECT_FALSE(failed);
  EXPECT_EQ(out.indices, std::vector<uint32_t>{4});
}

// Zero-length slices touch no device, so this runs without a GPU.
TEST(CudaAdaComp, ARejectedEnqueueForgetsTheLastUpdate) {
  for (CompressorKind kind : {CompressorKind::kAdaComp, CompressorKind::kDense}) {
    SCOPED_TRACE(CompressorKindName(kind));
    CudaCompressorOptions o;
    o.base.kind = kind;
    auto gpu = internal::MakeCudaCompressorWithoutDeviceCheck(o);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    auto st = CudaSliceState::Create(0);
    ASSERT_TRUE(st.ok()) << st.status();
    CompressedUpdate out;
    ASSERT_TRUE((*gpu)->Enqueue(nullptr, 0, **st).ok());
    ASSERT_TRUE((*gpu)->Fetch(out).ok());
    EXPECT_EQ((*gpu)->Enqueue(nullptr, 5, **st).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*gpu)->Fetch(out).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*gpu)->Wait().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*gpu)->DecompressAddLast(1.0f, nullptr).code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

// 1024 < T <= 2048 must keep at least 3/4 of each block busy; every tile holds whole bins and
// fits its rows; T <= 1024 keeps the 8-row layout.

}  // namespace
}  // namespace cuda
}  // namespace adaps
