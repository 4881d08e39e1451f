// The worker library against an in-process cluster (a Scheduler, two Servers with the
// sum-only optimizer, one Worker) over inproc:// with a shared TransportContext: declare,
// exact push-pull, recompressed pulls, and the two-phase push (a failed push changes no
// residue of any slice).
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "adaps/worker.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "tests/worker/inproc_cluster.h"

namespace adaps {
namespace {

constexpr int kServers = 2;

class WorkerInproc : public ::testing::Test {
 protected:
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
    EXPECT_TRUE(worker_->Declare(spec, absl::MakeSpan(init)).ok());
    auto slices = worker_->Slices(name);
    EXPECT_TRUE(slices.ok());
    EXPECT_EQ(slices->size(), 2u);
    for (const SliceInfo& s : *slices) EXPECT_EQ(s.length % bin, 0u);
    return *slices;
  }

  absl::Status PushPull(const std::string& name, const std::vector<float>& g,
                        std::vector<float>& out) {
    return worker_->PushPull(name, g, absl::MakeSpan(out)).get();
  }

  testing::InprocServers cluster_;  // waits for the scheduler and servers to end last
  std::unique_ptr<Worker> worker_;
};

TEST_F(WorkerInproc, DeclareLaysOutSlicesThatCoverTheTensor) {
  const auto slices = DeclareTwoSlices("t", 32, 4, Compression::kAdaComp);
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[0].offset, 0u);
  EXPECT_EQ(slices[0].length + slices[1].length, 32u);
  EXPECT_EQ(slices[1].offset, slices[0].length);
  EXPECT_NE(slices[0].server, slices[1].server);
  EXPECT_EQ(worker_->TensorNames(), std::vector<std::string>{"t"});
}

TEST_F(WorkerInproc, DeclaringTwiceOrWithWrongSizesIsInvalid) {
  DeclareTwoSlices("t", 32, 4, Compression::kDense);
  std::vector<float> v(32), w(31);
  EXPECT_EQ(worker_->Declare({"t", {32}, 4, Compression::kDense}, absl::MakeSpan(v)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(worker_->Declare({"u", {32}, 4, Compression::kDense}, absl::MakeSpan(w)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(worker_->Push("nope", v).get().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(worker_->Push("t", w).get().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkerInproc, DensePushPullIsExactOverBothSlices) {
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

TEST_F(WorkerInproc, RecompressedPullsFollowTheParameters) {
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
TEST_F(WorkerInproc, PullAnswersCarryTheServersWorkPerStep) {
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

TEST_F(AdaCompTwoSlices, PushFailingInTheSecondSliceKeepsTheFirstSlicesResidue) {
  std::vector<float> out(32);
  ASSERT_TRUE(PushPull("t", Gradient(4, 1, 3e38f), out).ok());
  for (uint32_t i = 0; i < slices_[0].length; ++i) ASSERT_EQ(out[i], i % 4 == 0 ? 4.0f : 0.0f);
  // Slice 1 overflows: the push fails as a whole and must not consume slice 0's residue.
  const absl::Status failed = worker_->Push("t", Gradient(0, 0, 3e38f)).get();
  EXPECT_EQ(failed.code(), absl::StatusCode::kOutOfRange) << failed;
  // The next successful push carries slice 0's residue: every bin's [0, 1, 1, 1].
  ASSERT_TRUE(PushPull("t", Gradient(0, 0, 0), out).ok());
  ExpectSlice0HoldsAllItsMass(out);
}

TEST_F(AdaCompTwoSlices, NanInAnySliceIsInvalidAndChangesNoResidue) {
  std::vector<float> out(32);
  ASSERT_TRUE(PushPull("t", Gradient(4, 1, 1), out).ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(worker_->Push("t", Gradient(0, 0, nan)).get().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(worker_->Push("t", Gradient(nan, 0, 0)).get().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PushPull("t", Gradient(0, 0, 0), out).ok());
  ExpectSlice0HoldsAllItsMass(out);
}

TEST_F(WorkerInproc, DenseNanIsInvalidAndSendsNothing) {
  DeclareTwoSlices("t", 32, 4, Compression::kDense);
  std::vector<float> g(32, 1.0f), out(32);
  g[31] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(worker_->Push("t", g).get().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PushPull("t", std::vector<float>(32, 2.0f), out).ok());
  EXPECT_EQ(out, std::vector<float>(32, 2.0f));
}

}  // namespace
}  // namespace adaps
