// The worker library against an in-process cluster (a Scheduler, two Servers with the
// sum-only optimizer, one Worker) over inproc:// with a shared TransportContext: declare,
// exact push-pull, recompressed pulls, and the two-phase push (a failed push changes no
// residue of any slice). Each test runs twice: with the tensors in host memory, and on a
// device (TensorSpec::device, emulated in host memory: WorkerOptions::emulate_devices), whose
// pushes and pulls take the device path (PushPullOnDevice); then the device tests: the
// device path against the host's in one job, bit for bit, and what it refuses.
#include <cmath>
#include <limits>
#include <string>
#include <memory>
#include <thread>
#include <vector>

#include "adaps/worker.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "tests/worker/host_and_device.h"
#include "tests/worker/inproc_cluster.h"

namespace adaps {
namespace {

constexpr int kServers = 2;

// The parameter: tensors on an (emulated) device.
class WorkerInproc : public ::testing::TestWithParam<bool> {
 protected:
  bool on_device() const { return GetParam(); }

  void SetUp() override {
    testing::InprocServersOptions o;
    o.servers = kServers;
    o.split_threshold = 16;  // every tensor of 16 elements or more gets a slice per server
    ASSERT_TRUE(cluster_.Start(o).ok());
    WorkerOptions wo;
    wo.scheduler = testing::InprocServers::kScheduler;
    wo.context = cluster_.context();
    wo.request_timeout = absl::Seconds(5);
    wo.log_level = "warn";
    wo.emulate_devices = true;
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

  // Declares `name` with `n` elements of initial value 0 and checks it has two slices of
  // whole bins of `bin`.
  std::vector<SliceInfo> DeclareTwoSlices(const std::string& name, size_t n, uint32_t bin,
                                          Compression c, PullFormat pull = PullFormat::kDense) {
    std::vector<float> init(n, 0.0f);
    TensorSpec spec{name, {static_cast<int64_t>(n)}, bin, c, 0.25, pull};
    spec.device = on_device() ? 0 : -1;
    EXPECT_TRUE(worker_->Declare(spec, absl::MakeSpan(init)).ok());
    auto slices = worker_->Slices(name);
    EXPECT_TRUE(slices.ok());
    EXPECT_EQ(slices->size(), 2u);
    for (const SliceInfo& s : *slices) EXPECT_EQ(s.length % bin, 0u);
    return *slices;
  }

  // The tensor's calls, host or device ("device" memory is host memory when emulated).
  absl::Status PushPull(const std::string& name, const std::vector<float>& g,
                        std::vector<float>& out) {
    if (on_device()) return worker_->PushPullOnDevice(name, g.data(), out.data()).get();
    return worker_->PushPull(name, g, absl::MakeSpan(out)).get();
  }
  absl::Status Push(const std::string& name, const std::vector<float>& g) {
    if (on_device()) return worker_->PushOnDevice(name, g.data()).get();
    return worker_->Push(name, g).get();
  }

  testing::InprocServers cluster_;  // waits for the scheduler and servers to end last
  std::unique_ptr<Worker> worker_;
};

TEST_P(WorkerInproc, DeclareLaysOutSlicesThatCoverTheTensor) {
  const auto slices = DeclareTwoSlices("t", 32, 4, Compression::kAdaComp);
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[0].offset, 0u);
  EXPECT_EQ(slices[0].length + slices[1].length, 32u);
  EXPECT_EQ(slices[1].offset, slices[0].length);
  EXPECT_NE(slices[0].server, slices[1].server);
  EXPECT_EQ(worker_->TensorNames(), std::vector<std::string>{"t"});
}

TEST_P(WorkerInproc, DeclaringTwiceOrWithWrongSizesIsInvalid) {
  DeclareTwoSlices("t", 32, 4, Compression::kDense);
  std::vector<float> v(32), w(31);
  EXPECT_EQ(worker_->Declare({"t", {32}, 4, Compression::kDense}, absl::MakeSpan(v)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(worker_->Declare({"u", {32}, 4, Compression::kDense}, absl::MakeSpan(w)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Push("nope", v).code(), absl::StatusCode::kInvalidArgument);
  // (A device pointer carries no length: the host calls check it.)
  if (!on_device()) {
    EXPECT_EQ(Push("t", w).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST_P(WorkerInproc, DensePushPullIsExactOverBothSlices) {
  DeclareTwoSlices("t", 64, 4, Compression::kDense);
  std::vector<float> expect(64, 0.0f), out(64);
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g(64);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.25f * static_cast<float>(i) - step;
    ASSERT_TRUE(PushPull("t", g, out).ok());
    for (size_t i = 0; i < g.size(); ++i) expect[i] += g[i];
    EXPECT_EQ(out, expect) << step;
  }
  auto traffic = worker_->Traffic("t");
  ASSERT_TRUE(traffic.ok());
  EXPECT_EQ(traffic->pushes, 3u);
  EXPECT_EQ(traffic->push_dense_bytes, 3u * 64 * 4);
}

TEST_P(WorkerInproc, RecompressedPullsFollowTheParameters) {
  // A dense push of one value per step moves every parameter alike, which AdaComp's
  // recompression carries exactly (one scale, every element selected).
  DeclareTwoSlices("t", 64, 8, Compression::kDense, PullFormat::kRecompressed);
  std::vector<float> out(64);
  for (int step = 1; step <= 4; ++step) {
    ASSERT_TRUE(PushPull("t", std::vector<float>(64, 0.5f), out).ok());
    EXPECT_EQ(out, std::vector<float>(64, 0.5f * step)) << step;
  }
  auto traffic = worker_->Traffic("t");
  ASSERT_TRUE(traffic.ok());
  EXPECT_EQ(traffic->pulls, 4u);
}

// The servers' engine work reaches the worker in the pull answers: nonzero for 1M
// parameters a step, and no more than the wall time of the steps for each slice (the sum is
// over the two slices, whose servers work at the same time: under ASan it was seen at 1.04x
// the wall time).
TEST_P(WorkerInproc, PullAnswersCarryTheServersWorkPerStep) {
  constexpr size_t kN = 1 << 20;
  const size_t slices = DeclareTwoSlices("big", kN, 1024, Compression::kDense).size();
  std::vector<float> g(kN, 0.5f), out(kN);
  const absl::Time start = absl::Now();
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(PushPull("big", g, out).ok());
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  auto traffic = worker_->Traffic("big");
  ASSERT_TRUE(traffic.ok());
  EXPECT_GT(traffic->server_seconds, 0.0);
  EXPECT_LE(traffic->server_seconds, static_cast<double>(slices) * wall);
}

// AdaComp, bins of 4. In slice 0, bins of [4, 1, 1, 1]: the scale is 4, only the 4 is sent,
// each bin keeps [0, 1, 1, 1] in the residue. In slice 1 one element of 3e38 keeps about
// 2.25e38 in the residue, so the same value again overflows that slice's residue.
class AdaCompTwoSlices : public WorkerInproc {
 protected:
  void SetUp() override {
    WorkerInproc::SetUp();
    if (HasFatalFailure()) return;
    slices_ = DeclareTwoSlices("t", 32, 4, Compression::kAdaComp);
  }
  std::vector<float> Gradient(float slice0_big, float slice0_small, float slice1_first) const {
    std::vector<float> g(32, 0.0f);
    for (uint32_t i = 0; i < slices_[0].length; ++i) g[i] = i % 4 == 0 ? slice0_big : slice0_small;
    g[slices_[1].offset] = slice1_first;
    return g;
  }
  // What slice 0 holds once its residue [0, 1, 1, 1] per bin was delivered too.
  void ExpectSlice0HoldsAllItsMass(const std::vector<float>& out) const {
    for (uint32_t i = 0; i < slices_[0].length; ++i) {
      EXPECT_EQ(out[i], i % 4 == 0 ? 4.0f : 1.0f) << "element " << i;
    }
  }
  std::vector<SliceInfo> slices_;
};

TEST_P(AdaCompTwoSlices, PushFailingInTheSecondSliceKeepsTheFirstSlicesResidue) {
  std::vector<float> out(32);
  ASSERT_TRUE(PushPull("t", Gradient(4, 1, 3e38f), out).ok());
  for (uint32_t i = 0; i < slices_[0].length; ++i) ASSERT_EQ(out[i], i % 4 == 0 ? 4.0f : 0.0f);
  // Slice 1 overflows: the push fails as a whole and must not consume slice 0's residue.
  const absl::Status failed = Push("t", Gradient(0, 0, 3e38f));
  EXPECT_EQ(failed.code(), absl::StatusCode::kOutOfRange) << failed;
  // The next successful push carries slice 0's residue: every bin's [0, 1, 1, 1].
  ASSERT_TRUE(PushPull("t", Gradient(0, 0, 0), out).ok());
  ExpectSlice0HoldsAllItsMass(out);
}

TEST_P(AdaCompTwoSlices, NanInAnySliceIsInvalidAndChangesNoResidue) {
  std::vector<float> out(32);
  ASSERT_TRUE(PushPull("t", Gradient(4, 1, 1), out).ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Push("t", Gradient(0, 0, nan)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Push("t", Gradient(nan, 0, 0)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PushPull("t", Gradient(0, 0, 0), out).ok());
  ExpectSlice0HoldsAllItsMass(out);
}

TEST_P(WorkerInproc, DenseNanIsInvalidAndSendsNothing) {
  DeclareTwoSlices("t", 32, 4, Compression::kDense);
  std::vector<float> g(32, 1.0f), out(32);
  g[31] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Push("t", g).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PushPull("t", std::vector<float>(32, 2.0f), out).ok());
  EXPECT_EQ(out, std::vector<float>(32, 2.0f));
}

INSTANTIATE_TEST_SUITE_P(HostAndDevice, WorkerInproc, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "OnDevice" : "OnHost";
                         });
INSTANTIATE_TEST_SUITE_P(HostAndDevice, AdaCompTwoSlices, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "OnDevice" : "OnHost";
                         });

// The device path against the host's in one job: the same tensor twice, "h" in host memory
// and "d" on the device, given the same gradients.
class DevicePath : public WorkerInproc {
 protected:
  void DeclareBoth(size_t n, uint32_t bin, Compression c, PullFormat pull) {
    std::vector<float> init(n);
    for (size_t i = 0; i < n; ++i) init[i] = 0.01f * static_cast<float>(i % 17);
    testing::DeclareHostAndDevice(*worker_, init, bin, c, pull);
  }
  // Steps both with a gradient stream of bins that differ, and expects the same parameters,
  // residues and sent elements each step.
  void StepBoth(size_t n, int steps) {
    std::vector<float> out_h(n), out_d(n), res_h(n), res_d(n);
    for (int step = 0; step < steps; ++step) {
      const std::vector<float> g = testing::VaryingGradient(n, step, 8);
      ASSERT_TRUE(worker_->PushPull("h", g, absl::MakeSpan(out_h)).get().ok());
      ASSERT_TRUE(worker_->PushPullOnDevice("d", g.data(), out_d.data()).get().ok());
      ASSERT_EQ(out_h, out_d) << "step " << step;
      ASSERT_TRUE(worker_->Residue("h", absl::MakeSpan(res_h)).ok());
      ASSERT_TRUE(worker_->Residue("d", absl::MakeSpan(res_d)).ok());
      ASSERT_EQ(res_h, res_d) << "step " << step;
      auto sent_h = worker_->LastSent("h");
      auto sent_d = worker_->LastSent("d");
      ASSERT_TRUE(sent_h.ok() && sent_d.ok());
      ASSERT_EQ(*sent_h, *sent_d) << "step " << step;
    }
    // (The wire bytes differ by the envelopes: FlatBuffers leaves out a key of 0.)
    auto th = worker_->Traffic("h");
    auto td = worker_->Traffic("d");
    ASSERT_TRUE(th.ok() && td.ok());
    EXPECT_EQ(th->pushes, td->pushes);
    EXPECT_EQ(th->pulls, td->pulls);
  }
};

TEST_P(DevicePath, AdaCompWithRecompressedPullsIsTheHostPathBitForBit) {
  DeclareBoth(96, 8, Compression::kAdaComp, PullFormat::kRecompressed);
  StepBoth(96, 6);
  // And with another bin size from the next push on.
  ASSERT_TRUE(worker_->SetBinSize("h", 4).ok());
  ASSERT_TRUE(worker_->SetBinSize("d", 4).ok());
  StepBoth(96, 3);
}

TEST_P(DevicePath, AdaCompWithDensePullsIsTheHostPathBitForBit) {
  DeclareBoth(96, 8, Compression::kAdaComp, PullFormat::kDense);
  StepBoth(96, 5);
}

TEST_P(DevicePath, AdaCompWithSparsePullsIsTheHostPathBitForBit) {
  DeclareBoth(96, 8, Compression::kAdaComp, PullFormat::kSparse);
  StepBoth(96, 5);
  auto td = worker_->Traffic("d");
  ASSERT_TRUE(td.ok());
  EXPECT_GT(td->pulls_answered_sparse + td->pulls_answered_forwarded, 0u);
}

TEST_P(DevicePath, DenseWithRecompressedPullsIsTheHostPathBitForBit) {
  DeclareBoth(64, 8, Compression::kDense, PullFormat::kRecompressed);
  StepBoth(64, 4);
}

TEST_P(DevicePath, ResiduesGoThroughTheHostBothWays) {
  DeclareBoth(96, 8, Compression::kAdaComp, PullFormat::kDense);
  StepBoth(96, 2);
  std::vector<float> set(96);
  for (size_t i = 0; i < set.size(); ++i) set[i] = 0.5f - 0.01f * static_cast<float>(i);
  ASSERT_TRUE(worker_->SetResidue("d", set).ok());
  std::vector<float> got(96);
  ASSERT_TRUE(worker_->Residue("d", absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, set);
  ASSERT_TRUE(worker_->SetResidue("h", set).ok());
  const std::string path = ::testing::TempDir() + "/device_path.residues";
  ASSERT_TRUE(worker_->SaveResidues(path).ok());
  ASSERT_TRUE(worker_->SetResidue("d", std::vector<float>(96, 0.0f)).ok());
  ASSERT_TRUE(worker_->LoadResidues(path).ok());
  ASSERT_TRUE(worker_->Residue("d", absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, set);
  StepBoth(96, 2);  // and the next pushes carry it alike
}

TEST_P(DevicePath, EachPathRefusesTheOthersCallsAndWhatADeviceDoesNotDo) {
  DeclareBoth(32, 4, Compression::kAdaComp, PullFormat::kDense);
  std::vector<float> g(32, 1.0f), out(32);
  const absl::Status host_call = worker_->PushPull("d", g, absl::MakeSpan(out)).get();
  EXPECT_EQ(host_call.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(host_call.message().find("PushPullOnDevice"), std::string::npos) << host_call;
  EXPECT_EQ(worker_->PushPullOnDevice("h", g.data(), out.data()).get().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(worker_->PushPullOnDevice("d", nullptr, out.data()).get().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> v(32);
  TensorSpec in_place{"s", {32}, 4, Compression::kAdaComp, 0.25, PullFormat::kSparse};
  in_place.device = 0;
  in_place.pull_in_place = true;
  const absl::Status st = worker_->Declare(in_place, absl::MakeSpan(v));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("pull_in_place"), std::string::npos) << st;
  TensorSpec topk{"k", {32}, 4, Compression::kTopK, 0.25};
  topk.device = 0;
  EXPECT_EQ(worker_->Declare(topk, absl::MakeSpan(v)).code(), absl::StatusCode::kInvalidArgument);
  TensorSpec bad{"b", {32}, 4, Compression::kAdaComp};
  bad.device = -2;
  EXPECT_EQ(worker_->Declare(bad, absl::MakeSpan(v)).code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Emulated, DevicePath, ::testing::Values(true),
                         [](const ::testing::TestParamInfo<bool>&) { return "OnDevice"; });

}  // namespace
}  // namespace adaps
