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

OutMessage Register(msg::Role role, int rank, uint32_t epoch, const std::string& address,
                    const std::string& identity, uint64_t id) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = msg::CreateRegister(fbb, role, fbb.CreateString(address),
                                  fbb.CreateString(identity), rank, epoch, 0,
                                  fbb.CreateString(role == msg::Role::Server ? "sum" : ""));
  return FinishEnvelope(fbb, Sender{role, rank}, body, id, 0);
}

// A server and the scheduler killed together: the restarted scheduler first hears from the
// restarted server (no rank: a fresh process) and gives it rank 0, which the surviving
// server still holds. Until the job forms no node has been told its rank, so the survivor's
// claim wins: its heartbeat is told to register again (not refused as a takeover, which
// left the job unable to re-form), it gets rank 0 back and the fresh server the free rank.
TEST_F(Authorization, ARankClaimedAfterASchedulerRestartWinsOverAFreshNodesBeforeTheJobForms) {
  ClusterOptions o;
  o.num_servers = 0;  // the nodes are raw clients below
  o.num_workers = 0;
  o.scheduler_args = {"--num_servers=2", "--num_workers=1"};
  LocalCluster cluster(o);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  RawClient fresh(ctx_, cluster.scheduler_address()), survivor(ctx_, cluster.scheduler_address()),
      worker(ctx_, cluster.scheduler_address());
  fresh.Send(Register(msg::Role::Server, -1, 0, "tcp://127.0.0.1:9001", "s0", 1));
  absl::SleepFor(absl::Milliseconds(200));  // (registered first; no answer until formed)
  absl::Status beat = survivor.Call(Heartbeat({msg::Role::Server, 0}, 2), 2, nullptr,
                                    absl::Seconds(30));
  EXPECT_EQ(beat.code(), absl::StatusCode::kFailedPrecondition) << beat;
  survivor.Send(Register(msg::Role::Server, 0, 7, "tcp://127.0.0.1:9002", "s1", 3));
  absl::SleepFor(absl::Milliseconds(200));
  worker.Send(Register(msg::Role::Worker, -1, 0, "", "w0", 4));
  auto rank_in_view = [](RawClient& c, uint64_t id) {
    testing::RawAnswer a = c.Wait(id, absl::Seconds(60));
    if (!a.answered || a.body != msg::Body::ClusterView) return -100;
    return flatbuffers::GetRoot<msg::Envelope>(a.header.data())->body_as_ClusterView()->your_rank();
  };
  EXPECT_EQ(rank_in_view(survivor, 3), 0);
  EXPECT_EQ(rank_in_view(fresh, 1), 1);
  EXPECT_EQ(rank_in_view(worker, 4), 0);
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
