// Authorisation without CURVE, against real processes: a raw ZeroMQ client that reaches the
// scheduler's port forges control messages (Leave for other workers, Shutdown, heartbeats
// claiming a worker's rank). None of them may change the cluster: the workers still train
// together afterwards and the job ends cleanly when the real workers leave.
#include <thread>
#include <vector>

#include "adaps/worker.h"
#include "common/messages.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/raw_client.h"
#include "zmq.hpp"

namespace adaps {
namespace {

using ::adaps::testing::ClusterOptions;
using ::adaps::testing::LocalCluster;
using ::adaps::testing::RawClient;

OutMessage Leave(Sender as, uint64_t id) {
  flatbuffers::FlatBufferBuilder fbb;
  return FinishEnvelope(fbb, as, msg::CreateLeave(fbb), id, 0);
}

OutMessage Heartbeat(Sender as, uint64_t id) {
  flatbuffers::FlatBufferBuilder fbb;
  return FinishEnvelope(fbb, as, msg::CreateHeartbeat(fbb, 0), id, 0);
}

OutMessage Shutdown(Sender as, uint64_t id, const std::string& token) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = msg::CreateShutdown(fbb, fbb.CreateString("forged"), 0, fbb.CreateString(token));
  return FinishEnvelope(fbb, as, body, id, 0);
}

class Authorization : public ::testing::Test {
 protected:
  void StartCluster(std::vector<std::string> scheduler_args = {}) {
    ClusterOptions o;
    o.num_servers = 1;
    o.num_workers = 2;
    o.scheduler_args = std::move(scheduler_args);
    o.server_args = {"--optimizer=sum"};
    cluster_ = std::make_unique<LocalCluster>(o);
    ASSERT_FALSE(cluster_->scheduler_address().empty());
    WorkerOptions wo;
    wo.scheduler = cluster_->scheduler_address();
    wo.request_timeout = absl::Seconds(10);
    wo.log_level = "warn";
    absl::StatusOr<std::unique_ptr<Worker>> a, b;
    std::thread t([&] { a = Worker::Create(wo); });
    b = Worker::Create(wo);
    t.join();
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    workers_.push_back(*std::move(a));
    workers_.push_back(*std::move(b));
    std::vector<float> init(8, 1.0f);
    std::thread d([&] {
      std::vector<float> v = init;
      declare_[0] = workers_[0]->Declare({"t", {8}, 4, Compression::kDense}, absl::MakeSpan(v));
    });
    std::vector<float> v = init;
    declare_[1] = workers_[1]->Declare({"t", {8}, 4, Compression::kDense}, absl::MakeSpan(v));
    d.join();
    ASSERT_TRUE(declare_[0].ok()) << declare_[0];
    ASSERT_TRUE(declare_[1].ok()) << declare_[1];
  }

  // One sync step of both workers: each pushes 1, both pull 1 + 2 * step.
  void ExpectAStepStillWorks(int step) {
    std::vector<float> g(8, 1.0f), out0(8), out1(8);
    auto f0 = workers_[0]->PushPull("t", g, absl::MakeSpan(out0));
    auto f1 = workers_[1]->PushPull("t", g, absl::MakeSpan(out1));
    ASSERT_TRUE(f0.get().ok());
    ASSERT_TRUE(f1.get().ok());
    EXPECT_EQ(out0[3], 1.0f + 2.0f * static_cast<float>(step));
    EXPECT_EQ(out1[3], out0[3]);
  }

  void ExpectCleanEnd() {
    for (auto& w : workers_) EXPECT_TRUE(w->Stop().ok());
    std::string why;
    EXPECT_TRUE(cluster_->AllExitCleanly(absl::Seconds(10), &why)) << why;
  }

  zmq::context_t ctx_;
  std::unique_ptr<LocalCluster> cluster_;
  std::vector<std::unique_ptr<Worker>> workers_;
  absl::Status declare_[2];
};

TEST_F(Authorization, ForgedLeavesForEveryWorkerDoNotStopTheCluster) {
  StartCluster();
  RawClient raw(ctx_, cluster_->scheduler_address());
  for (int rank = 0; rank < 2; ++rank) {
    absl::Status s = raw.Call(Leave({msg::Role::Worker, rank}, 100 + rank), 100 + rank,
                              nullptr, absl::Seconds(3));
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  }
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(cluster_->scheduler().WaitExit(absl::ZeroDuration()), -1) << "scheduler stopped";
  ExpectAStepStillWorks(1);
  ExpectCleanEnd();
}

TEST_F(Authorization, HeartbeatClaimingAWorkersRankDoesNotTakeItsPlace) {
  StartCluster();
  RawClient raw(ctx_, cluster_->scheduler_address());
  EXPECT_FALSE(raw.Call(Heartbeat({msg::Role::Worker, 0}, 7), 7, nullptr, absl::Seconds(3)).ok());
  absl::Status s = raw.Call(Leave({msg::Role::Worker, 0}, 8), 8, nullptr, absl::Seconds(3));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  ExpectAStepStillWorks(1);
  ExpectCleanEnd();
}

TEST_F(Authorization, ShutdownIsRefusedWithoutTheOperatorToken) {
  StartCluster({"--admin_token=s3cret"});
  RawClient raw(ctx_, cluster_->scheduler_address());
  absl::Status s =
      raw.Call(Shutdown({msg::Role::Unknown, -1}, 5, ""), 5, nullptr, absl::Seconds(3));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  s = raw.Call(Shutdown({msg::Role::Unknown, -1}, 6, "wrong"), 6, nullptr, absl::Seconds(3));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  ExpectAStepStillWorks(1);
  // With the token, an operator may stop the job.
  s = raw.Call(Shutdown({msg::Role::Unknown, -1}, 9, "s3cret"), 9, nullptr, absl::Seconds(3));
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(cluster_->scheduler().WaitExit(absl::Seconds(10)), 0);
}

TEST_F(Authorization, WithoutATokenNoShutdownRequestIsAccepted) {
  StartCluster();
  RawClient raw(ctx_, cluster_->scheduler_address());
  absl::Status s = raw.Call(Shutdown({msg::Role::Worker, 0}, 5, ""), 5, nullptr, absl::Seconds(3));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  ExpectAStepStillWorks(1);
  ExpectCleanEnd();
}

}  // namespace
}  // namespace adaps
