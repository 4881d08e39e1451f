// Decompression into device memory (DecompressAddToDevice) and the dense baseline on the GPU,
// against the CPU. Every test skips with the reason without a GPU.
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "common/compressor.h"
#include "common/cuda/cuda_compressor.h"
#include "gtest/gtest.h"
#include "tests/common/compressor_conformance.h"

namespace adaps {
namespace cuda {
namespace {

using ::adaps::testing::SameFloats;

#define SKIP_WITHOUT_GPU()                                                  \
  do {                                                                      \
    const absl::Status gpu_status = CudaAvailable();                        \
    if (!gpu_status.ok()) GTEST_SKIP() << "no usable GPU: " << gpu_status;  \
  } while (0)

std::vector<float> Normal(size_t n, float sigma, uint32_t seed) {
  return ::adaps::testing::NormalVector(n, sigma, seed);
}

TEST(CudaDecompress, AddToDeviceEqualsTheCpuForEveryKind) {
  SKIP_WITHOUT_GPU();
  const size_t n = 3 * 4096 + 17;
  const std::vector<float> g = Normal(n, 1.0f, 17);
  const std::vector<float> base = Normal(n, 1.0f, 18);
  for (CompressorKind kind : {CompressorKind::kDense, CompressorKind::kAdaComp,
                              CompressorKind::kTopK, CompressorKind::kSign}) {
    SCOPED_TRACE(CompressorKindName(kind));
    CompressorOptions o;
    o.kind = kind;
    o.bin_size = 50;
    o.topk_fraction = 0.01;
    auto cpu = MakeCompressor(o);
    ASSERT_TRUE(cpu.ok());
    SliceState st(n);
    CompressedUpdate u;
    ASSERT_TRUE((*cpu)->Compress(g, st, u).ok());
    std::vector<float> want = base;
    ASSERT_TRUE(DecompressAdd(u, -0.75f, absl::MakeSpan(want)).ok());
    auto dst = DeviceBuffer::FromHost(base);
    ASSERT_TRUE(dst.ok());
    ASSERT_TRUE(DecompressAddToDevice(u, -0.75f, dst->floats(), n).ok());
    std::vector<float> got(n);
    ASSERT_TRUE(dst->Download(got.data(), n * sizeof(float)).ok());
    EXPECT_TRUE(SameFloats(want, got));
  }
}

TEST(CudaDecompress, MalformedUpdateIsRejectedAndTheBufferUnchanged) {
  SKIP_WITHOUT_GPU();
  const size_t n = 100;
  CompressedUpdate u;
  u.kind = CompressorKind::kAdaComp;
  u.length = n;
  u.scale = 1.0f;
  u.indices = {5, 3};
  u.negative = {0, 1};
  const std::vector<float> base(n, 2.0f);
  auto dst = DeviceBuffer::FromHost(base);
  ASSERT_TRUE(dst.ok());
  EXPECT_EQ(DecompressAddToDevice(u, 1.0f, dst->floats(), n).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecompressAddToDevice(u, 1.0f, dst->floats(), n + 1).code(),
            absl::StatusCode::kInvalidArgument);
  u.indices = {3, 100};
  EXPECT_EQ(DecompressAddToDevice(u, 1.0f, dst->floats(), n).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> got(n);
  ASSERT_TRUE(dst->Download(got.data(), n * sizeof(float)).ok());
  EXPECT_TRUE(SameFloats(base, got));
}

// ------------------------------------------------------------------------------------------
// The dense baseline.

TEST(CudaDense, MatchesTheCpuAndRejectsNonFinite) {
  SKIP_WITHOUT_GPU();
  const size_t n = 7777;
  CudaCompressorOptions o;
  o.base.kind = CompressorKind::kDense;
  auto gpu = MakeCudaCompressor(o);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = MakeCompressor(o.base);
  ASSERT_TRUE(cpu.ok());
  auto gst = CudaSliceState::Create(n);
  ASSERT_TRUE(gst.ok());
  SliceState cst(n);
  std::vector<float> g = Normal(n, 1.0f, 19);
  auto dev = DeviceBuffer::FromHost(g);
  ASSERT_TRUE(dev.ok());
  CompressedUpdate cu, gu;
  ASSERT_TRUE((*cpu)->Compress(g, cst, cu).ok());
  ASSERT_TRUE((*gpu)->Compress(dev->floats(), n, **gst, gu).ok());
  EXPECT_EQ(gu.kind, CompressorKind::kDense);
  EXPECT_TRUE(SameFloats(cu.values, gu.values));

  auto dst = DeviceBuffer::FromHost(std::vector<float>(n, 1.0f));
  ASSERT_TRUE(dst.ok());
  ASSERT_TRUE((*gpu)->DecompressAddLast(2.0f, dst->floats()).ok());
  std::vector<float> want(n, 1.0f), got(n);
  ASSERT_TRUE(DecompressAdd(cu, 2.0f, absl::MakeSpan(want)).ok());
  ASSERT_TRUE(dst->Download(got.data(), n * sizeof(float)).ok());
  EXPECT_TRUE(SameFloats(want, got));

  g[n / 3] = std::numeric_limits<float>::infinity();
  auto bad = DeviceBuffer::FromHost(g);
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ((*gpu)->Compress(bad->floats(), n, **gst, gu).code(),
            absl::StatusCode::kInvalidArgument);
}
}  // namespace
}  // namespace cuda
}  // namespace adaps
