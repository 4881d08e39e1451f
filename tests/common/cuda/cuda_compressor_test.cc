// The CUDA AdaComp compressor beyond the shared conformance suite (cuda_conformance_test.cc):
// the GPU-only interface (Enqueue/Wait/Fetch/DecompressAddLast, streams), bin-size changes on
// one slice, and hand-made inputs against the CPU compressor. Every test that needs a GPU skips
// with the reason when none is usable (the host-side logic is in cuda_host_logic_test.cc).
#include "common/cuda/cuda_compressor.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/compressor.h"
#include "gtest/gtest.h"

namespace adaps {
namespace cuda {
namespace {

#define SKIP_WITHOUT_GPU()                                                  \
  do {                                                                      \
    const absl::Status gpu_status = CudaAvailable();                        \
    if (!gpu_status.ok()) GTEST_SKIP() << "no usable GPU: " << gpu_status;  \
  } while (0)

CompressorOptions AdaCompOptions(uint32_t bin_size,
                                 NonFinitePolicy policy = NonFinitePolicy::kReject) {
  CompressorOptions o;
  o.kind = CompressorKind::kAdaComp;
  o.bin_size = bin_size;
  o.non_finite = policy;
  return o;
}

uint32_t FloatBits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Distance in units in the last place between two finite floats of the same sign.
int64_t UlpDistance(float a, float b) {
  return std::llabs(static_cast<int64_t>(FloatBits(a)) - static_cast<int64_t>(FloatBits(b)));
}

// Bitwise comparison of two float vectors; reports the first few differences.
::testing::AssertionResult SameFloats(const std::vector<float>& want,
                                      const std::vector<float>& got) {
  if (want.size() != got.size()) {
    return ::testing::AssertionFailure() << "sizes " << want.size() << " vs " << got.size();
  }
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < want.size(); ++i) {
    if (FloatBits(want[i]) != FloatBits(got[i]) && !(want[i] == 0.0f && got[i] == 0.0f)) {
      if (++bad <= 5) absl::StrAppend(&first, " [", i, "] cpu ", want[i], " gpu ", got[i], ";");
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << want.size() << " differ:" << first;
}

template <typename T>
::testing::AssertionResult SameVector(const char* what, const std::vector<T>& want,
                                      const std::vector<T>& got) {
  if (want == got) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  auto at = [](const std::vector<T>& v, size_t j) {
    return j < v.size() ? std::to_string(static_cast<int64_t>(v[j])) : std::string("(end)");
  };
  return ::testing::AssertionFailure()
         << what << ": cpu has " << want.size() << ", gpu " << got.size()
         << "; first difference at " << i << ": cpu " << at(want, i) << " gpu " << at(got, i);
}

// A CPU compressor and a GPU compressor fed the same gradients, compared after every step.
class Pair {
 public:
  Pair(size_t n, CompressorOptions options, bool defer = true) : n_(n), cpu_state_(n) {
    auto cpu = MakeCompressor(options);
    EXPECT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(cpu).value();
    auto gpu = MakeCudaAdaComp(options, defer);
    EXPECT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(gpu).value();
    auto st = CudaSliceState::Create(n);
    EXPECT_TRUE(st.ok()) << st.status();
    gpu_state_ = std::move(st).value();
  }

  // One step; returns the CPU's status after checking the GPU agrees on the update and, when
  // `compare_residue`, on the residue. Downloading the residue applies a deferred fix-up, so
  // steps that skip the comparison exercise the fix-up inside the next pass.
  absl::Status Step(const std::vector<float>& grad, const std::string& where,
                    bool compare_residue = true) {
    SCOPED_TRACE(where);
    auto dev = DeviceBuffer::FromHost(grad);
    EXPECT_TRUE(dev.ok()) << dev.status();
    const absl::Status cs = cpu_->Compress(grad, cpu_state_, cpu_out_);
    const absl::Status gs = gpu_->Compress(dev->floats(), grad.size(), *gpu_state_, gpu_out_);
    EXPECT_EQ(cs.code(), gs.code()) << "cpu: " << cs << " gpu: " << gs;
    if (cs.ok() || cs.code() == absl::StatusCode::kOutOfRange) {
      EXPECT_EQ(gpu_out_.kind, cpu_out_.kind);
      EXPECT_EQ(gpu_out_.length, cpu_out_.length);
      EXPECT_EQ(gpu_out_.bin_size, cpu_out_.bin_size);
      EXPECT_TRUE(SameVector("indices", cpu_out_.indices, gpu_out_.indices));
      EXPECT_TRUE(SameVector("negative", cpu_out_.negative, gpu_out_.negative));
    }
    const bool same_scale = FloatBits(cpu_out_.scale) == FloatBits(gpu_out_.scale);
    const std::vector<float> cpu_residue(cpu_state_.residue().begin(),
                                         cpu_state_.residue().end());
    if (cs.ok() && !same_scale) {
      // Documented: the deterministic tree sum may round to the neighbouring float.
      EXPECT_LE(UlpDistance(cpu_out_.scale, gpu_out_.scale), 1)
          << "cpu " << cpu_out_.scale << " gpu " << gpu_out_.scale;
      // Resynchronise so that later steps compare like with like.
      const absl::Status us = gpu_state_->UploadResidue(cpu_residue);
      EXPECT_TRUE(us.ok()) << us;
      return cs;
    }
    if (compare_residue) {
      std::vector<float> gpu_residue(n_);
      const absl::Status ds = gpu_state_->DownloadResidue(absl::MakeSpan(gpu_residue));
      EXPECT_TRUE(ds.ok()) << ds;
      EXPECT_TRUE(SameFloats(cpu_residue, gpu_residue));
    }
    return cs;
  }

  void SetResidue(const std::vector<float>& r) {
    std::copy(r.begin(), r.end(), cpu_state_.residue().begin());
    const absl::Status s = gpu_state_->UploadResidue(r);
    EXPECT_TRUE(s.ok()) << s;
  }

  const CompressedUpdate& cpu_out() const { return cpu_out_; }
  const CompressedUpdate& gpu_out() const { return gpu_out_; }
  CudaCompressor& gpu() { return *gpu_; }
  CudaSliceState& gpu_state() { return *gpu_state_; }
  SliceState& cpu_state() { return cpu_state_; }

 private:
  size_t n_;
  std::unique_ptr<Compressor> cpu_;
  std::unique_ptr<CudaCompressor> gpu_;
  SliceState cpu_state_;
  std::unique_ptr<CudaSliceState> gpu_state_;
  CompressedUpdate cpu_out_, gpu_out_;
};

std::vector<float> Normal(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// ------------------------------------------------------------------------------------------
// Without a GPU.

TEST(CudaAvailability, GivesAReasonWhenNoDeviceIsUsable) {
  const absl::Status s = CudaAvailable();
  const auto count = CudaDeviceCount();
  if (s.ok()) {
    ASSERT_TRUE(count.ok()) << count.status();
    EXPECT_GE(*count, 1);
    auto desc = CudaDeviceDescription();
    ASSERT_TRUE(desc.ok()) << desc.status();
    EXPECT_FALSE(desc->empty());
    std::printf("GPU: %s\n", desc->c_str());
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_FALSE(s.message().empty());
    std::printf("no GPU: %s\n", std::string(s.message()).c_str());
  }
}

TEST(CudaCompressorOptions, InvalidOptionsAreRejectedBeforeTheDeviceIsTouched) {
  CudaCompressorOptions o;
  o.base.kind = CompressorKind::kAdaComp;
  o.base.bin_size = 0;
  EXPECT_EQ(MakeCudaCompressor(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.base.bin_size = 50;
  o.base.kind = CompressorKind::kTopK;
  EXPECT_EQ(MakeCudaCompressor(o).status().code(), absl::StatusCode::kUnimplemented);
  o.base.kind = CompressorKind::kSign;
  EXPECT_EQ(MakeCudaCompressor(o).status().code(), absl::StatusCode::kUnimplemented);
}

// ------------------------------------------------------------------------------------------
// Hand-made inputs.

TEST(CudaAdaComp, AllZeroBinsSendNothing) {
  SKIP_WITHOUT_GPU();
  const uint32_t t = 50;
  const size_t n = 20 * t + 7;
  std::vector<float> g = Normal(n, 1.0f, 3);
  for (size_t b = 0; b < 20; b += 2) {
    for (size_t i = b * t; i < (b + 1) * t; ++i) g[i] = 0.0f;
  }
  // Bins 0, 2, ..., 18 are zero; the odd ones and the short last bin (20, elements 1000-1006)
  // are not. (The first run on a GPU, 2026-12-04, failed here on indices 1001 and 1004 of that
  // last bin: the test took every even bin for a zero one.)
  const auto zero_bin = [&](uint32_t i) { return i / t < 20 && (i / t) % 2 == 0; };
  Pair pair(n, AdaCompOptions(t));
  ASSERT_TRUE(pair.Step(g, "one step").ok());
  EXPECT_FALSE(pair.gpu_out().indices.empty());  // the non-zero bins send something
  for (uint32_t i : pair.gpu_out().indices) EXPECT_FALSE(zero_bin(i)) << "index " << i;
  // The same bins zero again: the residue there is still zero, so still nothing is sent.
  ASSERT_TRUE(pair.Step(g, "second step").ok());
  for (uint32_t i : pair.gpu_out().indices) EXPECT_FALSE(zero_bin(i)) << "index " << i;
}

TEST(CudaAdaComp, SignsFollowTheResidue) {
  SKIP_WITHOUT_GPU();
  const size_t n = 4;
  Pair pair(n, AdaCompOptions(4));
  ASSERT_TRUE(pair.Step({1.0f, -3.0f, 0.5f, 3.0f}, "step").ok());
  // Bin max 3: |2g| >= 3 for -3, 3 (and 1 -> |2| < 3 no).
  EXPECT_EQ(pair.gpu_out().indices, (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(pair.gpu_out().negative, (std::vector<uint8_t>{1, 0}));
}

TEST(CudaAdaComp, UnalignedGradientPointerIsHandled) {
  SKIP_WITHOUT_GPU();
  const size_t n = 1001;
  for (size_t offset = 0; offset < 4; ++offset) {
    SCOPED_TRACE(absl::StrCat("offset ", offset));
    std::vector<float> host(n + 4, 0.0f);
    const std::vector<float> g = Normal(n, 1.0f, 11);
    std::copy(g.begin(), g.end(), host.begin() + offset);
    host[offset + n - 1] = std::numeric_limits<float>::quiet_NaN();  // last element only
    auto dev = DeviceBuffer::FromHost(host);
    ASSERT_TRUE(dev.ok()) << dev.status();
    auto gpu = MakeCudaAdaComp(AdaCompOptions(50));
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    auto st = CudaSliceState::Create(n);
    ASSERT_TRUE(st.ok()) << st.status();
    CompressedUpdate out;
    EXPECT_EQ((*gpu)->Compress(dev->floats() + offset, n, **st, out).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(CudaAdaComp, ChangingTheBinSizeOnOneSliceMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const size_t n = 100003;
  SliceState cpu_state(n);
  auto gpu_state = CudaSliceState::Create(n);
  ASSERT_TRUE(gpu_state.ok()) << gpu_state.status();
  uint32_t step = 0;
  for (uint32_t t : {50u, 5000u, 500u, 500u, 1500u, 1500u, 1u, 1025u, 50u}) {
    SCOPED_TRACE(absl::StrCat("T ", t));
    auto cpu = MakeCompressor(AdaCompOptions(t));
    auto gpu = MakeCudaAdaComp(AdaCompOptions(t));
    ASSERT_TRUE(cpu.ok() && gpu.ok());
    const std::vector<float> g = Normal(n, 1.0f, 500 + step++);
    auto dev = DeviceBuffer::FromHost(g);
    ASSERT_TRUE(dev.ok());
    CompressedUpdate cu, gu;
    ASSERT_TRUE((*cpu)->Compress(g, cpu_state, cu).ok());
    ASSERT_TRUE((*gpu)->Compress(dev->floats(), n, **gpu_state, gu).ok());
    EXPECT_TRUE(SameVector("indices", cu.indices, gu.indices));
    EXPECT_TRUE(SameVector("negative", cu.negative, gu.negative));
    // The residue is downloaded (materialized) after every other step only, so the next bin
    // size meets a pending fix-up of another tile layout half of the time.
    if (FloatBits(cu.scale) == FloatBits(gu.scale)) {
      if (step % 2 == 1) continue;
      std::vector<float> r(n);
      ASSERT_TRUE((*gpu_state)->DownloadResidue(absl::MakeSpan(r)).ok());
      EXPECT_TRUE(SameFloats(std::vector<float>(cpu_state.residue().begin(),
                                                cpu_state.residue().end()),
                             r));
    } else {
      ASSERT_TRUE((*gpu_state)
                      ->UploadResidue(std::vector<float>(cpu_state.residue().begin(),
                                                         cpu_state.residue().end()))
                      .ok());
    }
  }
}

// A failed pass leaves selection bits in the spare set; after bin-size changes (other bitmask
// layouts) no stale bit may be applied as a fix-up, in either fix-up mode.
TEST(CudaAdaComp, BinSizeChangesAfterAFailedStepMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const size_t n = 100003;
  for (bool defer : {false, true}) {
    SCOPED_TRACE(defer ? "deferred" : "eager");
    SliceState cpu_state(n);
    auto gpu_state = CudaSliceState::Create(n);
    ASSERT_TRUE(gpu_state.ok()) << gpu_state.status();
    std::vector<float> r = Normal(n, 1.0f, 80);
    r[777] = 3e38f;
    std::copy(r.begin(), r.end(), cpu_state.residue().begin());
    ASSERT_TRUE((*gpu_state)->UploadResidue(r).ok());
    struct Step { uint32_t t; bool overflow; };
    uint32_t seed = 81;
    for (const Step& step : {Step{50, false}, Step{50, true}, Step{1, false}, Step{50, false},
                             Step{5000, false}, Step{1500, false}, Step{50, false}}) {
      SCOPED_TRACE(absl::StrCat("T ", step.t, step.overflow ? " overflow" : ""));
      auto cpu = MakeCompressor(AdaCompOptions(step.t));
      auto gpu = MakeCudaAdaComp(AdaCompOptions(step.t), defer);
      ASSERT_TRUE(cpu.ok() && gpu.ok());
      std::vector<float> g = Normal(n, 1.0f, seed++);
      if (step.overflow) g[777] = 3e38f;
      auto dev = DeviceBuffer::FromHost(g);
      ASSERT_TRUE(dev.ok());
      CompressedUpdate cu, gu;
      const absl::Status cs = (*cpu)->Compress(g, cpu_state, cu);
      const absl::Status gs = (*gpu)->Compress(dev->floats(), n, **gpu_state, gu);
      ASSERT_EQ(cs.code(), step.overflow ? absl::StatusCode::kOutOfRange : absl::StatusCode::kOk);
      ASSERT_EQ(gs.code(), cs.code()) << gs;
      EXPECT_TRUE(SameVector("indices", cu.indices, gu.indices));
      EXPECT_TRUE(SameVector("negative", cu.negative, gu.negative));
      const std::vector<float> want(cpu_state.residue().begin(), cpu_state.residue().end());
      if (FloatBits(cu.scale) != FloatBits(gu.scale)) {
        ASSERT_LE(UlpDistance(cu.scale, gu.scale), 1);
        ASSERT_TRUE((*gpu_state)->UploadResidue(want).ok());  // resynchronise
      } else if (!defer || step.overflow) {  // deferred: leave the fix-up pending mostly
        std::vector<float> got(n);
        ASSERT_TRUE((*gpu_state)->DownloadResidue(absl::MakeSpan(got)).ok());
        EXPECT_TRUE(SameFloats(want, got));
      }
    }
  }
}

TEST(CudaAdaComp, WrongLengthIsInvalidArgumentAndFetchNeedsEnqueue) {
  SKIP_WITHOUT_GPU();
  auto gpu = MakeCudaAdaComp(AdaCompOptions(50));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto st = CudaSliceState::Create(100);
  ASSERT_TRUE(st.ok());
  auto dev = DeviceBuffer::FromHost(std::vector<float>(101, 1.0f));
  ASSERT_TRUE(dev.ok());
  CompressedUpdate out;
  EXPECT_EQ((*gpu)->Fetch(out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*gpu)->Compress(dev->floats(), 101, **st, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*gpu)->Compress(nullptr, 100, **st, out).code(), absl::StatusCode::kInvalidArgument);
}

// ------------------------------------------------------------------------------------------
// Decompression and the invariant G_before + g == G_after + decompress(msg).

TEST(CudaAdaComp, DecompressAddLastEqualsTheCpuDecompressionAndConservesMass) {
  SKIP_WITHOUT_GPU();
  const uint32_t t = 500;
  const size_t n = 200 * t + 99;
  Pair pair(n, AdaCompOptions(t));
  ASSERT_TRUE(pair.Step(Normal(n, 1.0f, 14), "warm-up").ok());
  std::vector<float> before(n);
  ASSERT_TRUE(pair.gpu_state().DownloadResidue(absl::MakeSpan(before)).ok());
  const std::vector<float> g = Normal(n, 0.5f, 15);
  ASSERT_TRUE(pair.Step(g, "step").ok());
  std::vector<float> after(n);
  ASSERT_TRUE(pair.gpu_state().DownloadResidue(absl::MakeSpan(after)).ok());

  const std::vector<float> base = Normal(n, 1.0f, 16);
  auto dst = DeviceBuffer::FromHost(base);
  ASSERT_TRUE(dst.ok());
  ASSERT_TRUE(pair.gpu().DecompressAddLast(0.5f, dst->floats()).ok());
  std::vector<float> got(n);
  ASSERT_TRUE(dst->Download(got.data(), n * sizeof(float)).ok());
  std::vector<float> want = base;
  ASSERT_TRUE(DecompressAdd(pair.gpu_out(), 0.5f, absl::MakeSpan(want)).ok());
  EXPECT_TRUE(SameFloats(want, got));

  std::vector<float> dec(n, 0.0f);
  ASSERT_TRUE(DecompressAdd(pair.gpu_out(), 1.0f, absl::MakeSpan(dec)).ok());
  for (size_t i = 0; i < n; ++i) {
    const float lhs = before[i] + g[i], rhs = after[i] + dec[i];
    ASSERT_NEAR(lhs, rhs, 1e-6f * (1.0f + std::fabs(lhs)) + 2e-7f * pair.gpu_out().scale)
        << "element " << i;
  }
}

// ------------------------------------------------------------------------------------------
// The device-resident path after failed and rejected steps, streams, scratch.

TEST(CudaAdaComp, DecompressAddLastAfterAnOverflowAddsNothingAndWaitReportsIt) {
  SKIP_WITHOUT_GPU();
  const size_t n = 1000;
  auto gpu = MakeCudaAdaComp(AdaCompOptions(10));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto st = CudaSliceState::Create(n);
  ASSERT_TRUE(st.ok());
  std::vector<float> r = Normal(n, 1.0f, 30);
  r[15] = 3e38f;
  ASSERT_TRUE((*st)->UploadResidue(r).ok());
  std::vector<float> g = Normal(n, 1.0f, 31);
  g[15] = 3e38f;
  auto dev = DeviceBuffer::FromHost(g);
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE((*gpu)->Enqueue(dev->floats(), n, **st).ok());
  const std::vector<float> base(n, 1.0f);
  auto dst = DeviceBuffer::FromHost(base);
  ASSERT_TRUE(dst.ok());
  ASSERT_TRUE((*gpu)->DecompressAddLast(1.0f, dst->floats()).ok());
  EXPECT_EQ((*gpu)->Wait().code(), absl::StatusCode::kOutOfRange);
  std::vector<float> got(n);
  ASSERT_TRUE(dst->Download(got.data(), n * sizeof(float)).ok());
  EXPECT_TRUE(SameFloats(base, got));
  std::vector<float> after(n);
  ASSERT_TRUE((*st)->DownloadResidue(absl::MakeSpan(after)).ok());
  EXPECT_TRUE(SameFloats(r, after));
}

TEST(CudaAdaComp, FetchAndDecompressAddLastAfterARejectedEnqueueAreFailedPrecondition) {
  SKIP_WITHOUT_GPU();
  const size_t n = 5000;
  auto gpu = MakeCudaAdaComp(AdaCompOptions(50));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto st = CudaSliceState::Create(n);
  ASSERT_TRUE(st.ok());
  auto dev = DeviceBuffer::FromHost(Normal(n, 1.0f, 32));
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE((*gpu)->Enqueue(dev->floats(), n, **st).ok());
  EXPECT_EQ((*gpu)->Enqueue(dev->floats(), n + 1, **st).code(),
            absl::StatusCode::kInvalidArgument);
  CompressedUpdate out;
  EXPECT_EQ((*gpu)->Fetch(out).code(), absl::StatusCode::kFailedPrecondition);
  auto dst = DeviceBuffer::FromHost(std::vector<float>(n, 0.0f));
  ASSERT_TRUE(dst.ok());
  EXPECT_EQ((*gpu)->DecompressAddLast(1.0f, dst->floats()).code(),
            absl::StatusCode::kFailedPrecondition);
}

// All work on a caller-given non-blocking stream (a result read or a buffer reused on another
// stream would race): the same updates as the CPU, and DecompressAddToDevice on that stream.
TEST(CudaAdaComp, WorksOnACallerGivenStream) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const size_t n = 300007;
  {
    CudaCompressorOptions o;
    o.base = AdaCompOptions(500);
    o.stream = stream;
    auto gpu = MakeCudaCompressor(o);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    auto st = CudaSliceState::Create(n, stream);
    ASSERT_TRUE(st.ok());
    auto cpu = MakeCompressor(o.base);
    ASSERT_TRUE(cpu.ok());
    SliceState cst(n);
    for (uint32_t step = 0; step < 3; ++step) {
      const std::vector<float> g = Normal(n, 1.0f, 33 + step);
      auto dev = DeviceBuffer::FromHost(g);
      ASSERT_TRUE(dev.ok());
      auto dst = DeviceBuffer::FromHost(std::vector<float>(n, 0.0f));
      ASSERT_TRUE(dst.ok());
      // The uploads ran on the legacy stream, which a non-blocking stream is not ordered with.
      ASSERT_TRUE(CudaSynchronize().ok());
      CompressedUpdate cu, gu;
      ASSERT_TRUE((*cpu)->Compress(g, cst, cu).ok());
      ASSERT_TRUE((*gpu)->Compress(dev->floats(), n, **st, gu).ok());
      EXPECT_TRUE(SameVector("indices", cu.indices, gu.indices));
      EXPECT_TRUE(SameVector("negative", cu.negative, gu.negative));
      ASSERT_TRUE((*gpu)->DecompressAddToDevice(cu, 1.0f, dst->floats(), n).ok());
      std::vector<float> got(n), want(n, 0.0f);
      ASSERT_TRUE(dst->Download(got.data(), n * sizeof(float)).ok());
      ASSERT_TRUE(DecompressAdd(cu, 1.0f, absl::MakeSpan(want)).ok());
      EXPECT_TRUE(SameFloats(want, got));
      if (FloatBits(cu.scale) != FloatBits(gu.scale)) {
        ASSERT_TRUE((*st)->UploadResidue(std::vector<float>(cst.residue().begin(),
                                                            cst.residue().end()))
                        .ok());
      }
    }
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace cuda
}  // namespace adaps
