// Access: with CURVE keys configured the scheduler and servers serve only listed client
// keys, traffic is encrypted, and plaintext or unlisted clients get nowhere. The roles run
// in process over tcp://127.0.0.1 (CURVE applies to tcp); keys come from adaps-keygen.
#include <zmq.h>

#include <fstream>
#include <thread>

#include "adaps/worker.h"
#include "common/config.h"
#include "common/transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "tests/integration/cluster_harness.h"

namespace adaps {
namespace {

struct Pair {
  std::string pub, sec;
};

// Runs adaps-keygen and reads the pair back through the same loader the executables use.
Pair Keygen(const std::string& dir, const std::string& name) {
  testing::Process p(ADAPS_KEYGEN_BIN, {dir + "/" + name}, dir + "/keygen.log");
  EXPECT_EQ(p.WaitExit(absl::Seconds(10)), 0);
  auto keys = LoadCurveKeys(dir + "/" + name + ".key", dir + "/" + name + ".key", "", false);
  EXPECT_TRUE(keys.ok()) << keys.status();
  return keys.ok() ? Pair{keys->server_public_key, keys->server_secret_key} : Pair{};
}

class Curve : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(zmq_has("curve")) << "libzmq without CURVE";
    dir_ = testing::MakeTempDir();
    cluster_ = Keygen(dir_, "cluster");
    server_client_ = Keygen(dir_, "server0");
    worker_ = Keygen(dir_, "worker0");
    intruder_ = Keygen(dir_, "intruder");
    // The allowed list is the concatenation of the .pub files of the server and the worker.
    std::ofstream allowed(dir_ + "/allowed");
    for (const char* n : {"server0", "worker0"}) {
      std::ifstream pub(dir_ + "/" + n + ".pub");
      allowed << pub.rdbuf();
    }
    allowed.close();
    auto serving = LoadCurveKeys(dir_ + "/cluster.key", dir_ + "/server0.key", dir_ + "/allowed",
                                 /*serving=*/true);
    ASSERT_TRUE(serving.ok()) << serving.status();
    ASSERT_EQ(serving->allowed_clients.size(), 2u);

    SchedulerConfig sc;
    sc.log_level = "off";
    sc.curve = *serving;
    scheduler_ = std::make_unique<Scheduler>(sc);
    ASSERT_TRUE(scheduler_->Start().ok());
    ServerConfig vc;
    vc.scheduler = scheduler_->endpoint();
    vc.optimizer.kind = OptimizerKind::kSumOnly;
    vc.log_level = "off";
    vc.curve = *serving;
    server_ = std::make_unique<Server>(vc);
    std::thread start([&] { server_status_ = server_->Start(); });
    WorkerOptions wo = Options(worker_);
    auto w = Worker::Create(wo);
    start.join();
    ASSERT_TRUE(server_status_.ok()) << server_status_;
    ASSERT_TRUE(w.ok()) << w.status();
    w_ = *std::move(w);
    std::vector<float> v(10, 1.0f);
    ASSERT_TRUE(w_->Declare({"t", {10}, 5, Compression::kDense}, absl::MakeSpan(v)).ok());
  }

  WorkerOptions Options(const Pair& me) {
    WorkerOptions wo;
    wo.scheduler = scheduler_ ? scheduler_->endpoint() : "";
    wo.log_level = "off";
    wo.register_timeout = absl::Seconds(10);
    wo.request_timeout = absl::Seconds(3);
    wo.curve_server_public_key = cluster_.pub;
    wo.curve_public_key = me.pub;
    wo.curve_secret_key = me.sec;
    return wo;
  }

  // A raw request to the scheduler from a client with `keys` (plaintext when disabled):
  // the status of the answer, or the transport's error when none came.
  absl::Status Probe(const CurveKeys& keys) {
    TransportOptions to;
    to.self = Sender{msg::Role::Worker, 0};
    to.curve = keys;
    Transport t(to, nullptr);
    EXPECT_TRUE(t.Start().ok());
    EXPECT_TRUE(t.Connect(scheduler_->endpoint()).ok());
    flatbuffers::FlatBufferBuilder fbb;
    auto body = msg::CreateHeartbeat(fbb, 0);
    const uint64_t id = t.NewRequestId();
    std::promise<absl::Status> p;
    t.Request(0, id, FinishEnvelope(fbb, t.self(), body, id, 0),
              absl::Now() + absl::Milliseconds(1500),
              [&p](absl::StatusOr<InMessage> r) { p.set_value(r.status()); });
    absl::Status s = p.get_future().get();
    t.Stop();
    return s;
  }

  void TearDown() override {
    if (w_) {
      EXPECT_TRUE(w_->Stop().ok());
    }
    if (scheduler_) scheduler_->WaitForShutdown(absl::Seconds(5));
    if (server_) server_->WaitForShutdown(absl::Seconds(5));
  }

  std::string dir_;
  Pair cluster_, server_client_, worker_, intruder_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Server> server_;
  absl::Status server_status_;
  std::unique_ptr<Worker> w_;
};

TEST_F(Curve, ListedClientIsServed) {
  std::vector<float> g(10, 2.0f), out(10);
  ASSERT_TRUE(w_->PushPull("t", g, absl::MakeSpan(out)).get().ok());
  EXPECT_EQ(out[0], 3.0f);
  CurveKeys listed;
  listed.server_public_key = cluster_.pub;
  listed.client_public_key = worker_.pub;
  listed.client_secret_key = worker_.sec;
  // The scheduler answers a raw client with a listed key. It claims to be worker 0 from
  // another connection than the real worker 0, so the answer is a refusal: but an answer,
  // which an unlisted client never gets (it cannot connect).
  absl::Status s = Probe(listed);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
}

TEST_F(Curve, UnlistedClientIsRefused) {
  CurveKeys unlisted;
  unlisted.server_public_key = cluster_.pub;
  unlisted.client_public_key = intruder_.pub;
  unlisted.client_secret_key = intruder_.sec;
  absl::Status s = Probe(unlisted);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;  // never connected
  // A whole worker with an unlisted key cannot join either.
  WorkerOptions wo = Options(intruder_);
  wo.register_timeout = absl::Seconds(1);
  auto w = Worker::Create(wo);
  EXPECT_FALSE(w.ok());
}

TEST_F(Curve, PlaintextClientCannotTalkToACurveCluster) {
  absl::Status s = Probe(CurveKeys{});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  std::vector<float> out(10);
  EXPECT_TRUE(w_->Pull("t", absl::MakeSpan(out)).get().ok());  // the cluster is unaffected
}

TEST(CurveKeys, MalformedKeyFilesAreInvalidArgument) {
  const std::string dir = testing::MakeTempDir();
  std::ofstream(dir + "/bad.key") << "public = short\n";
  EXPECT_EQ(LoadCurveKeys(dir + "/bad.key", "", "", false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadCurveKeys(dir + "/none.key", "", "", false).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace adaps
