// The worker library's device path on a real GPU (label gpu; each test skips, saying why,
// where no GPU can be used): tensors declared on cuda:0 beside the same tensors in host
// memory in one in-process job, given the same gradients. bench/gpu-check.sh runs it.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "adaps/worker.h"
#include "common/cuda/cuda_compressor.h"
#include "gtest/gtest.h"
#include "tests/worker/host_and_device.h"
#include "tests/worker/inproc_cluster.h"

namespace adaps {
namespace {

class DeviceGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status s = cuda::CudaAvailable(); !s.ok()) GTEST_SKIP() << s;
    testing::InprocServersOptions o;
    o.servers = 2;
    ASSERT_TRUE(cluster_.Start(o).ok());
    WorkerOptions wo;
    wo.scheduler = testing::InprocServers::kScheduler;
    wo.context = cluster_.context();
    wo.request_timeout = absl::Seconds(60);
    wo.log_level = "warn";
    auto worker = Worker::Create(wo);
    ASSERT_TRUE(cluster_.JoinServers().ok());
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
  }
  void TearDown() override {
    if (worker_) {
      EXPECT_TRUE(worker_->Stop().ok());
    }
  }
  void DeclareBoth(size_t n, PullFormat pull) {
    testing::DeclareHostAndDevice(*worker_, std::vector<float>(n, 0.0f), 500,
                                  Compression::kAdaComp, pull);
  }
  static std::vector<float> Gradient(size_t n, int step) {
    return testing::VaryingGradient(n, step, 500);
  }

  testing::InprocServers cluster_;
  std::unique_ptr<Worker> worker_;
};

// Indices and signs are the CPU's bit for bit; the scale may differ by one ulp (docs/gpu.md),
// so the parameters agree to a few ulps and the bytes exactly.
TEST_F(DeviceGpu, PushPullOnTheGpuIsTheHostPath) {
  constexpr size_t kN = 300000;  // two slices, one per server
  DeclareBoth(kN, PullFormat::kRecompressed);
  auto g_dev = cuda::DeviceBuffer::Allocate(kN * sizeof(float));
  auto out_dev = cuda::DeviceBuffer::Allocate(kN * sizeof(float));
  ASSERT_TRUE(g_dev.ok() && out_dev.ok());
  std::vector<float> out_h(kN), out_d(kN), res_h(kN), res_d(kN);
  for (int step = 0; step < 5; ++step) {
    const std::vector<float> g = Gradient(kN, step);
    ASSERT_TRUE(g_dev->Upload(g.data(), kN * sizeof(float)).ok());
    ASSERT_TRUE(worker_->PushPull("h", g, absl::MakeSpan(out_h)).get().ok());
    const absl::Status st = worker_->PushPullOnDevice("d", g_dev->floats(), out_dev->floats()).get();
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_TRUE(out_dev->Download(out_d.data(), kN * sizeof(float)).ok());
    size_t differ = 0;
    for (size_t i = 0; i < kN; ++i) {
      if (out_h[i] != out_d[i]) {
        ++differ;
        ASSERT_NEAR(out_h[i], out_d[i], 1e-5f * (1.0f + std::fabs(out_h[i]))) << i;
      }
    }
    ASSERT_TRUE(worker_->Residue("h", absl::MakeSpan(res_h)).ok());
    ASSERT_TRUE(worker_->Residue("d", absl::MakeSpan(res_d)).ok());
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_NEAR(res_h[i], res_d[i], 1e-5f * (1.0f + std::fabs(res_h[i]))) << i;
    }
    std::printf("step %d: %zu of %zu parameters differ by ulps\n", step, differ, kN);
  }
  auto th = worker_->Traffic("h");
  auto td = worker_->Traffic("d");
  ASSERT_TRUE(th.ok() && td.ok());
  EXPECT_EQ(th->push_wire_bytes, td->push_wire_bytes);
  EXPECT_EQ(th->pull_wire_bytes, td->pull_wire_bytes);
}

// A figure, not a check: the worker's encode time of a 25M-parameter push (the library's
// compress_seconds) on the device path, against the host-staged path (the gradient copied to
// pinned host memory, then the CPU codec), as adaps.torch staged CUDA gradients before.
TEST_F(DeviceGpu, PushTimeAt25MAgainstTheHostStagedPath) {
  constexpr size_t kN = 25'000'000;
  constexpr int kSteps = 6;
  DeclareBoth(kN, PullFormat::kDense);
  auto g_dev = cuda::DeviceBuffer::Allocate(kN * sizeof(float));
  ASSERT_TRUE(g_dev.ok());
  cuda::PinnedBuffer staged;
  ASSERT_TRUE(staged.Reserve(kN * sizeof(float)).ok());
  float* host = static_cast<float*>(staged.data());
  double copy_s = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> g = Gradient(kN, step);
    ASSERT_TRUE(g_dev->Upload(g.data(), kN * sizeof(float)).ok());
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(cuda::CopyToHost(host, g_dev->data(), kN * sizeof(float), nullptr).ok());
    copy_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(worker_->Push("h", absl::MakeConstSpan(host, kN)).get().ok());
    ASSERT_TRUE(worker_->PushOnDevice("d", g_dev->floats()).get().ok());
  }
  auto th = worker_->Traffic("h");
  auto td = worker_->Traffic("d");
  ASSERT_TRUE(th.ok() && td.ok());
  const double host_ms = 1e3 * (copy_s + th->compress_seconds) / kSteps;
  const double dev_ms = 1e3 * td->compress_seconds / kSteps;
  std::printf("DEVICE-PUSH n=25M T=500: host-staged %.2f ms (copy %.2f + CPU codec %.2f), "
              "device path %.2f ms, ratio %.1fx (target >= 5x); wire bytes %llu vs %llu\n",
              host_ms, 1e3 * copy_s / kSteps, 1e3 * th->compress_seconds / kSteps, dev_ms,
              host_ms / dev_ms, static_cast<unsigned long long>(th->push_wire_bytes),
              static_cast<unsigned long long>(td->push_wire_bytes));
}

}  // namespace
}  // namespace adaps
