// Authorisation on the server without CURVE, against real processes through a raw ZeroMQ
// client: SetHyper, Checkpoint and DeclareSlice are accepted only with the secret the
// scheduler gave a worker of the job (in that worker's own ClusterView; the servers get the
// set of them in theirs), and DeclareSlice is bounded by the server's --max_memory.
#include <string>
#include <vector>

#include "absl/strings/match.h"
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
using ::adaps::testing::RawAnswer;
using ::adaps::testing::RawClient;
using ::adaps::testing::Process;
using ::adaps::testing::WaitForPortFile;
using ::testing::HasSubstr;

constexpr Sender kWorker0{msg::Role::Worker, 0};

const msg::Envelope* EnvelopeOf(const std::vector<uint64_t>& header) {
  return flatbuffers::GetRoot<msg::Envelope>(header.data());
}

OutMessage SetHyper(double lr, const std::string& secret, uint64_t id) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<msg::HyperParam>> ps = {
      msg::CreateHyperParam(fbb, fbb.CreateString("learning_rate"), lr)};
  auto body = msg::CreateSetHyper(fbb, fbb.CreateVector(ps), fbb.CreateString(secret));
  return FinishEnvelope(fbb, kWorker0, body, id, 0);
}

OutMessage Checkpoint(const std::string& secret, uint64_t id) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = msg::CreateCheckpoint(fbb, fbb.CreateString(""), fbb.CreateString(secret));
  return FinishEnvelope(fbb, kWorker0, body, id, 0);
}

OutMessage DeclareSlice(uint64_t key, uint32_t length, const std::string& secret, uint64_t id) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = msg::CreateDeclareSlice(fbb, key, fbb.CreateString("big"), length, 100, false,
                                      fbb.CreateString(secret));
  return FinishEnvelope(fbb, kWorker0, body, id, 0);
}

// Today's forgery: `SetHyper lr=1e6` from anyone made the model NaN; a checkpoint or a
// slice could be requested by anyone too. Each is refused; the real worker's still work.
TEST(ServerAccess, SetHyperCheckpointAndDeclareSliceFromAStrangerAreRefused) {
  ClusterOptions options;
  options.num_servers = 0;  // started here, with a port file
  options.num_workers = 1;
  options.scheduler_args = {"--num_servers=1"};
  LocalCluster cluster(options);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  Process server(ADAPS_SERVER_BIN,
                 {"--scheduler=" + cluster.scheduler_address(), "--optimizer=sgd",
                  "--learning_rate=0.5", "--checkpoint_dir=" + cluster.dir(),
                  "--port_file=" + cluster.dir() + "/server.port", "--log_level=warn"},
                 cluster.dir() + "/server.log");
  WorkerOptions wo;
  wo.scheduler = cluster.scheduler_address();
  wo.log_level = "warn";
  auto w = Worker::Create(wo);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> p(8, 1.0f), g(8, 1.0f);
  ASSERT_TRUE((*w)->Declare({"t", {8}, 4, Compression::kDense}, absl::MakeSpan(p)).ok());
  const std::string port = WaitForPortFile(cluster.dir() + "/server.port", absl::Seconds(10));
  ASSERT_FALSE(port.empty());
  zmq::context_t ctx(1);
  RawClient raw(ctx, "tcp://127.0.0.1:" + port);
  const std::string wrong(32, '0');
  for (const std::string& secret : {std::string(), wrong}) {
    absl::Status s = raw.Call(SetHyper(1e6, secret, 1), 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    s = raw.Call(Checkpoint(secret, 2), 2);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    s = raw.Call(DeclareSlice(777, 1 << 20, secret, 3), 3);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("not from a worker of this job"));
  }
  // The learning rate is still 0.5: one step of gradient 1 takes 1 to 0.5.
  ASSERT_TRUE((*w)->PushPull("t", g, absl::MakeSpan(p)).get().ok());
  EXPECT_EQ(p[0], 0.5f);
  // The worker of the job may do all three.
  ASSERT_TRUE((*w)->SetHyper({{"learning_rate", 0.25}}).ok());
  ASSERT_TRUE((*w)->PushPull("t", g, absl::MakeSpan(p)).get().ok());
  EXPECT_EQ(p[0], 0.25f);
  EXPECT_TRUE((*w)->Checkpoint("").ok());
  EXPECT_TRUE((*w)->Stop().ok());
  EXPECT_EQ(server.WaitExit(absl::Seconds(10)), 0) << server.Log();
}

// A server that has not registered yet (a restarted one, before its first view) cannot
// check a secret: SetHyper and Checkpoint get kUnavailable, which a worker asks again, not
// kPermissionDenied, which ended the worker (adaps-worker exited 1 when a restarted server
// took a learning-rate change before its view).
TEST(ServerAccess, SetHyperAndCheckpointBeforeTheServersFirstViewAreUnavailable) {
  zmq::context_t ctx(1);
  auto free_port = [&ctx] {
    zmq::socket_t probe(ctx, zmq::socket_type::router);
    probe.bind("tcp://127.0.0.1:*");
    const std::string ep = probe.get(zmq::sockopt::last_endpoint);
    return ep.substr(ep.rfind(':') + 1);
  };
  // The scheduler's address reaches nobody: the server listens but never gets a view.
  const std::string nobody = free_port(), port = free_port();
  const std::string dir = ::testing::TempDir();
  Process server(ADAPS_SERVER_BIN,
                 {"--scheduler=tcp://127.0.0.1:" + nobody, "--port=" + port,
                  "--register_timeout_ms=600000", "--log_level=warn"},
                 dir + "/unregistered_server.log");
  RawClient raw(ctx, "tcp://127.0.0.1:" + port);
  const std::string secret(32, '7');
  // (Asked until the server has bound its port; a request before that is not answered.)
  RawAnswer a;
  for (uint64_t id = 1; id < 2000 && !a.answered; ++id) {
    raw.Send(SetHyper(0.1, secret, id));
    a = raw.Wait(id, absl::Milliseconds(200));
  }
  ASSERT_TRUE(a.answered) << server.Log();
  EXPECT_EQ(a.status.code(), absl::StatusCode::kUnavailable) << a.status;
  raw.Send(Checkpoint(secret, 5000));
  a = raw.Wait(5000, absl::Seconds(60));
  ASSERT_TRUE(a.answered);
  EXPECT_EQ(a.status.code(), absl::StatusCode::kUnavailable) << a.status;
}

// Each ~100-byte DeclareSlice used to make the server allocate up to 1 GiB: a worker of the
// job (here a raw client that registered as one) is held to --max_memory in all.
TEST(ServerAccess, DeclareSliceIsBoundedByTheServersMemoryBudget) {
  ClusterOptions options;
  options.num_servers = 1;
  options.num_workers = 1;
  options.server_args = {"--max_memory=67108864"};  // 64 MiB: two slices of 2^20 elements
  LocalCluster cluster(options);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  zmq::context_t ctx(1);
  RawClient sched(ctx, cluster.scheduler_address());
  flatbuffers::FlatBufferBuilder fbb;
  auto reg = msg::CreateRegister(fbb, msg::Role::Worker, fbb.CreateString(""),
                                 fbb.CreateString(""));
  std::vector<uint64_t> reply;
  ASSERT_TRUE(sched.Call(FinishEnvelope(fbb, Sender{msg::Role::Worker, -1}, reg, 1, 0), 1, &reply,
                         absl::Seconds(20))
                  .ok());
  const msg::ClusterView* view = EnvelopeOf(reply)->body_as_ClusterView();
  ASSERT_NE(view, nullptr);
  ASSERT_NE(view->secret(), nullptr);
  const std::string secret = view->secret()->str();
  EXPECT_EQ(secret.size(), 32u);
  std::string server;
  for (const auto* n : *view->nodes()) {
    if (n->role() == msg::Role::Server) server = n->address()->str();
  }
  ASSERT_FALSE(server.empty());
  RawClient raw(ctx, server);
  // The server may not have its own view yet (kUnavailable until then), as a real worker's
  // library retries.
  absl::Status first = raw.Call(DeclareSlice(1, 1 << 20, secret, 10), 10);
  for (int i = 0; i < 100 && first.code() == absl::StatusCode::kUnavailable; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    first = raw.Call(DeclareSlice(1, 1 << 20, secret, 30 + i), 30 + i);
  }
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_TRUE(raw.Call(DeclareSlice(2, 1 << 20, secret, 11), 11).ok());
  for (uint64_t key = 3; key < 6; ++key) {
    absl::Status s = raw.Call(DeclareSlice(key, 1 << 20, secret, 10 + key), 10 + key);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("--max_memory"));
  }
  // Declaring an existing slice again costs nothing more.
  EXPECT_TRUE(raw.Call(DeclareSlice(1, 1 << 20, secret, 20), 20).ok());
  EXPECT_EQ(cluster.server(0).WaitExit(absl::ZeroDuration()), -1) << "server stopped";
}

// A server's --optimizer goes into every cluster view (workers read from it what a pull
// answers): the scheduler takes a name the servers know, and the job's own, or refuses.
TEST(ServerAccess, TheSchedulerRefusesAServerOptimizerItDoesNotKnowOrThatDiffersFromTheJobs) {
  ClusterOptions options;
  options.num_servers = 1;  // one real server (--optimizer=sgd, the default) ...
  options.num_workers = 1;
  options.scheduler_args = {"--num_servers=2", "--log_level=info"};  // ... of the two
  LocalCluster cluster(options);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  zmq::context_t ctx(1);
  RawClient sched(ctx, cluster.scheduler_address());
  auto register_server = [&](const std::string& optimizer, uint64_t id) {
    flatbuffers::FlatBufferBuilder fbb;
    auto reg = msg::CreateRegister(fbb, msg::Role::Server, fbb.CreateString("tcp://127.0.0.1:1"),
                                   fbb.CreateString(""), -1, 0, 0, fbb.CreateString(optimizer));
    std::vector<uint64_t> reply;
    return sched.Call(FinishEnvelope(fbb, Sender{msg::Role::Server, -1}, reg, id, 0), id, &reply,
                      absl::Seconds(10));
  };
  absl::Status bogus = register_server("bogus", 1);
  EXPECT_EQ(bogus.code(), absl::StatusCode::kInvalidArgument) << bogus;
  EXPECT_THAT(std::string(bogus.message()), HasSubstr("'bogus'"));
  absl::Status huge = register_server(std::string(100000, 'x'), 2);
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument) << huge;
  EXPECT_LT(huge.message().size(), 300u);  // the name is cut, not echoed whole
  // Once the real server is in (the scheduler says so in its log), another optimizer is
  // refused and the job still waits for a server that runs sgd.
  for (int i = 0; i < 400 && !absl::StrContains(cluster.scheduler().Log(), "Server 0 registered");
       ++i) {
    absl::SleepFor(absl::Milliseconds(25));
  }
  ASSERT_THAT(cluster.scheduler().Log(), HasSubstr("Server 0 registered"));
  absl::Status other = register_server("mean", 3);
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument) << other;
  EXPECT_THAT(std::string(other.message()), HasSubstr("--optimizer=sgd"));
  EXPECT_THAT(std::string(other.message()), HasSubstr("same optimizer"));
  EXPECT_EQ(cluster.server(0).WaitExit(absl::ZeroDuration()), -1) << "server stopped";
}

}  // namespace
}  // namespace adaps
