// In-process tests of the server over inproc://: a Scheduler, a Server and a Worker share a
// TransportContext; a raw client sends hostile messages and the state must not change.
#include <array>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <limits>
#include <thread>

#include "adaps/worker.h"
#include "common/transport.h"
#include "common/wire_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/server.h"

namespace adaps {
namespace {

constexpr size_t kLen = 100;
constexpr uint64_t kKey = 0;  // tensor 0, slice 0

class ServerInproc : public ::testing::Test {
 protected:
  void SetUp() override {
    context_ = std::make_shared<TransportContext>(1);
    SchedulerConfig sc;
    sc.bind = "inproc://scheduler";
    sc.heartbeat_interval = absl::Milliseconds(100);
    sc.dead_timeout = absl::Seconds(3);
    sc.log_level = "warn";
    scheduler_ = std::make_unique<Scheduler>(sc, context_);
    ASSERT_TRUE(scheduler_->Start().ok());
    ServerConfig vc;
    vc.scheduler = "inproc://scheduler";
    vc.bind = "inproc://server0";
    vc.optimizer.kind = OptimizerKind::kSumOnly;
    vc.log_level = "warn";
    server_ = std::make_unique<Server>(vc, context_);
    absl::Status server_status;
    std::thread start([&] { server_status = server_->Start(); });
    WorkerOptions wo;
    wo.scheduler = "inproc://scheduler";
    wo.context = context_;
    wo.request_timeout = absl::Seconds(2);
    wo.log_level = "warn";
    wo.fusion_threshold_bytes = 0;  // the tests send their own pushes to "t"'s plain slice
    auto worker = Worker::Create(wo);
    start.join();
    ASSERT_TRUE(server_status.ok()) << server_status;
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    std::vector<float> init(kLen);
    for (size_t i = 0; i < kLen; ++i) init[i] = static_cast<float>(i);
    ASSERT_TRUE(worker_->Declare({"t", {kLen}, 10, Compression::kAdaComp}, absl::MakeSpan(init))
                    .ok());

    TransportOptions to;
    to.self = Sender{msg::Role::Worker, 0};
    to.context = context_;
    client_ = std::make_unique<Transport>(to, nullptr);
    ASSERT_TRUE(client_->Start().ok());
    ASSERT_EQ(*client_->Connect("inproc://server0"), 0);
  }

  void TearDown() override {
    if (client_) client_->Stop();
    if (worker_) {
      EXPECT_TRUE(worker_->Stop().ok());
    }
    if (scheduler_) {
      EXPECT_TRUE(scheduler_->WaitForShutdown(absl::Seconds(5)));
    }
    if (server_) {
      EXPECT_TRUE(server_->WaitForShutdown(absl::Seconds(5)));
    }
  }

  absl::StatusOr<InMessage> Call(OutMessage m, uint64_t id,
                                 absl::Duration timeout = absl::Seconds(2)) {
    std::promise<absl::StatusOr<InMessage>> p;
    auto f = p.get_future();
    client_->Request(0, id, std::move(m), absl::Now() + timeout,
                     [&p](absl::StatusOr<InMessage> r) { p.set_value(std::move(r)); });
    return f.get();
  }

  absl::Status Push(uint64_t key, SharedBytes payload, uint64_t step = 0) {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = msg::CreatePush(fbb, key, step, msg::PayloadKind::Dense);
    const uint64_t id = client_->NewRequestId();
    return Call(FinishEnvelope(fbb, client_->self(), body, id, 0, std::move(payload)), id)
        .status();
  }

  SharedBytes DenseUpdate(size_t length, float value) {
    CompressedUpdate u;
    u.kind = CompressorKind::kDense;
    u.length = static_cast<uint32_t>(length);
    u.values.assign(length, value);
    auto bytes = std::make_shared<Bytes>();
    EXPECT_TRUE(EncodeUpdate(u, IndexCoding::kRice, bytes.get()).ok());
    return bytes;
  }

  void ExpectUnchanged() {
    std::vector<float> out(kLen, -1.0f);
    ASSERT_TRUE(worker_->Pull("t", absl::MakeSpan(out)).get().ok());
    for (size_t i = 0; i < kLen; ++i) ASSERT_EQ(out[i], static_cast<float>(i)) << i;
  }

  std::shared_ptr<TransportContext> context_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<Transport> client_;
};

// Initial values are checked by the engine thread that owns the slice (not the I/O thread):
// a NaN is refused with the element's index, and the key still takes a good declaration.
TEST_F(ServerInproc, NonFiniteInitialValuesAreRefusedAndTheKeyStaysUsable) {
  std::vector<float> init(kLen, 1.0f);
  init[37] = std::numeric_limits<float>::quiet_NaN();
  absl::Status st = worker_->Declare({"u", {kLen}, 10, Compression::kAdaComp}, absl::MakeSpan(init));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("37"));
  init[37] = 2.0f;
  ASSERT_TRUE(worker_->Declare({"u", {kLen}, 10, Compression::kAdaComp}, absl::MakeSpan(init)).ok());
  std::vector<float> out(kLen, 0.0f);
  ASSERT_TRUE(worker_->Pull("u", absl::MakeSpan(out)).get().ok());
  EXPECT_EQ(out, init);
}

TEST_F(ServerInproc, WrongLengthPushIsRejectedAndChangesNothing) {
  absl::Status s = Push(kKey, DenseUpdate(kLen - 1, 1.0f));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("99 elements"));
  ExpectUnchanged();
}

TEST_F(ServerInproc, PushToUndeclaredSliceIsRejected) {
  absl::Status s = Push(12345, DenseUpdate(kLen, 1.0f));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("undeclared"));
  ExpectUnchanged();
}

TEST_F(ServerInproc, CorruptPayloadIsDataLossAndChangesNothing) {
  auto bytes = std::make_shared<Bytes>(*DenseUpdate(kLen, 1.0f));
  bytes->resize(bytes->size() - 5);  // truncated body
  absl::Status s = Push(kKey, bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  ExpectUnchanged();
}

TEST_F(ServerInproc, PayloadOfAnotherKindThanTheHeaderSaysIsRejected) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = msg::CreatePush(fbb, kKey, 0, msg::PayloadKind::AdaComp);
  const uint64_t id = client_->NewRequestId();
  absl::Status s =
      Call(FinishEnvelope(fbb, client_->self(), body, id, 0, DenseUpdate(kLen, 1.0f)), id)
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  ExpectUnchanged();
}

TEST_F(ServerInproc, PushForAnotherStepIsAFailedPrecondition) {
  absl::Status s = Push(kKey, DenseUpdate(kLen, 1.0f), /*step=*/5);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  ExpectUnchanged();
}

TEST_F(ServerInproc, OtherProtocolVersionGetsAClearError) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = msg::CreatePullRequest(fbb, kKey, 0, 0, msg::PullFormat::Dense);
  msg::EnvelopeBuilder eb(fbb);
  const uint64_t id = client_->NewRequestId();
  eb.add_version(kProtocolVersion + 7);
  eb.add_request_id(id);
  eb.add_body_type(msg::Body::PullRequest);
  eb.add_body(body.Union());
  fbb.Finish(eb.Finish());
  absl::Status s = Call(OutMessage{fbb.Release(), nullptr}, id).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("protocol version"));
}

TEST_F(ServerInproc, PayloadSizeOtherThanTheHeaderSaysIsDropped) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = msg::CreatePush(fbb, kKey, 0, msg::PayloadKind::Dense);
  msg::EnvelopeBuilder eb(fbb);
  const uint64_t id = client_->NewRequestId();
  eb.add_version(kProtocolVersion);
  eb.add_sender_role(msg::Role::Worker);
  eb.add_sender_rank(0);
  eb.add_request_id(id);
  eb.add_payload_size(4000);  // but the frame is shorter
  eb.add_body_type(msg::Body::Push);
  eb.add_body(body.Union());
  fbb.Finish(eb.Finish());
  absl::Status s = Call(OutMessage{fbb.Release(), DenseUpdate(kLen, 1.0f)}, id,
                        absl::Milliseconds(300))
                       .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;  // dropped, no answer
  ExpectUnchanged();
}

TEST_F(ServerInproc, GarbageFramesAreDroppedAndTheServerKeepsAnswering) {
  zmq::socket_t raw(context_->get(), zmq::socket_type::dealer);
  raw.connect("inproc://server0");
  const char junk[] = "definitely not a flatbuffer";
  for (int i = 0; i < 10; ++i) (void)raw.send(zmq::buffer(junk, sizeof(junk)));
  zmq::message_t a("x", 1), b("y", 1), c("z", 1);
  (void)raw.send(a, zmq::send_flags::sndmore);
  (void)raw.send(b, zmq::send_flags::sndmore);
  (void)raw.send(c, zmq::send_flags::none);
  raw.set(zmq::sockopt::linger, 0);
  raw.close();
  ExpectUnchanged();
  // A well-formed push still works afterwards (sum-only: params += 1).
  ASSERT_TRUE(Push(kKey, DenseUpdate(kLen, 1.0f)).ok());
  std::vector<float> out(kLen);
  ASSERT_TRUE(worker_->Pull("t", absl::MakeSpan(out)).get().ok());
  EXPECT_EQ(out[3], 4.0f);
}

// One scheduler, one server (sum-only, checkpoints in `dir`) and one worker, in process.
struct MiniCluster {
  explicit MiniCluster(const std::string& dir) {
    SchedulerConfig sc;
    sc.log_level = "warn";
    sc.job_id = "inproc-checkpoint";  // the same job when the whole cluster restarts
    scheduler = std::make_unique<Scheduler>(sc);
    EXPECT_TRUE(scheduler->Start().ok());
    ServerConfig vc;
    vc.scheduler = scheduler->endpoint();
    vc.optimizer.kind = OptimizerKind::kSumOnly;
    vc.checkpoint_dir = dir;
    vc.log_level = "warn";
    server = std::make_unique<Server>(vc);
    absl::Status status;
    std::thread start([&] { status = server->Start(); });
    WorkerOptions wo;
    wo.scheduler = scheduler->endpoint();
    wo.log_level = "warn";
    auto w = Worker::Create(wo);
    start.join();
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_TRUE(w.ok()) << w.status();
    if (w.ok()) worker = *std::move(w);
  }
  ~MiniCluster() {
    if (worker) worker->Stop().IgnoreError();
    scheduler->WaitForShutdown(absl::Seconds(5));
    server->WaitForShutdown(absl::Seconds(5));
  }
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Server> server;
  std::unique_ptr<Worker> worker;
};

TEST(Checkpoint, RestartedServerResumesFromItsCheckpoint) {
  // A directory of its own: other runs (or tests) may leave checkpoints in the temp root.
  std::string tmpl = ::testing::TempDir() + "/adaps-restart-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  std::vector<float> g = {1, 2, 3, 4};
  {
    MiniCluster c(dir);
    ASSERT_TRUE(c.worker);
    std::vector<float> v = {10, 20, 30, 40};
    ASSERT_TRUE(c.worker->Declare({"t", {4}, 2, Compression::kDense}, absl::MakeSpan(v)).ok());
    ASSERT_TRUE(c.worker->PushPull("t", g, absl::MakeSpan(v)).get().ok());
    EXPECT_EQ(v, (std::vector<float>{11, 22, 33, 44}));
    ASSERT_TRUE(c.worker->Checkpoint("").ok());
  }
  MiniCluster c(dir);
  ASSERT_TRUE(c.worker);
  std::vector<float> v = {0, 0, 0, 0};
  ASSERT_TRUE(c.worker->Declare({"t", {4}, 2, Compression::kDense}, absl::MakeSpan(v)).ok());
  EXPECT_EQ(v, (std::vector<float>{11, 22, 33, 44}));  // not the new initial values
  ASSERT_TRUE(c.worker->PushPull("t", g, absl::MakeSpan(v)).get().ok());  // step 1 goes on
  EXPECT_EQ(v, (std::vector<float>{12, 24, 36, 48}));
}

// Two workers training against one 'mean' server over inproc://, in one process.
struct MeanCluster {
  explicit MeanCluster(PullFormat pull) {
    context = std::make_shared<TransportContext>(1);
    SchedulerConfig sc;
    sc.bind = "inproc://mean-scheduler";
    sc.num_workers = 2;
    sc.log_level = "warn";
    scheduler = std::make_unique<Scheduler>(sc, context);
    EXPECT_TRUE(scheduler->Start().ok());
    ServerConfig vc;
    vc.scheduler = sc.bind;
    vc.bind = "inproc://mean-server";
    vc.optimizer.kind = OptimizerKind::kMean;
    vc.log_level = "warn";
    server = std::make_unique<Server>(vc, context);
    absl::Status status;
    std::thread start([&] { status = server->Start(); });
    std::vector<std::thread> joins;
    for (int i = 0; i < 2; ++i) {
      joins.emplace_back([&, i] {
        WorkerOptions wo;
        wo.scheduler = sc.bind;
        wo.context = context;
        wo.log_level = "warn";
        auto w = Worker::Create(wo);
        EXPECT_TRUE(w.ok()) << w.status();
        if (!w.ok()) return;
        std::vector<float> init = {1, 2, 3, 4, 5};
        EXPECT_TRUE((*w)->Declare({"t", {5}, 2, Compression::kDense, 0.001, pull},
                                  absl::MakeSpan(init)).ok());
        workers[i] = *std::move(w);
      });
    }
    for (auto& t : joins) t.join();
    start.join();
    EXPECT_TRUE(status.ok()) << status;
  }
  ~MeanCluster() {
    for (auto& w : workers) {
      if (w) w->Stop().IgnoreError();
    }
    scheduler->WaitForShutdown(absl::Seconds(5));
    server->WaitForShutdown(absl::Seconds(5));
  }
  // Both workers push their gradient for one step and pull; returns what each pulled.
  std::array<std::vector<float>, 2> Step(const std::array<std::vector<float>, 2>& grads) {
    std::array<std::vector<float>, 2> out = {std::vector<float>(5), std::vector<float>(5)};
    std::array<std::future<absl::Status>, 2> done;
    for (int i = 0; i < 2; ++i) {
      done[i] = workers[workers[0]->rank() == i ? 0 : 1]->PushPull("t", grads[i],
                                                                    absl::MakeSpan(out[i]));
    }
    for (auto& d : done) EXPECT_TRUE(d.get().ok());
    return out;
  }
  std::shared_ptr<TransportContext> context;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Server> server;
  std::array<std::unique_ptr<Worker>, 2> workers;
};

std::array<std::vector<float>, 2> MeanStepGrads(int step) {
  const float s = static_cast<float>(step);
  return {std::vector<float>{0.1f * s, -1.0f, 3.0f + s, 1e-3f, -7.0f * s},
          std::vector<float>{0.3f, 2.0f * s, -0.5f, 1e3f, 0.7f + s}};
}

TEST(MeanOptimizer, EveryStepPullsExactlyTheMeanOfThatStepsGradients) {
  MeanCluster c(PullFormat::kDense);
  ASSERT_TRUE(c.workers[0] && c.workers[1]);
  for (int step = 0; step < 4; ++step) {
    const auto g = MeanStepGrads(step);
    const auto pulled = c.Step(g);
    for (int w = 0; w < 2; ++w) {
      for (size_t i = 0; i < 5; ++i) {
        EXPECT_EQ(pulled[w][i], (g[0][i] + g[1][i]) * 0.5f) << "step " << step << " i " << i;
      }
    }
  }
}

TEST(MeanOptimizer, RecompressedPullsGiveBothWorkersTheSameReplica) {
  MeanCluster c(PullFormat::kRecompressed);
  ASSERT_TRUE(c.workers[0] && c.workers[1]);
  for (int step = 0; step < 4; ++step) {
    const auto pulled = c.Step(MeanStepGrads(step));
    EXPECT_EQ(pulled[0], pulled[1]) << "step " << step;
  }
}

// One worker against one SGD server (lr 1) whose recompressed pulls use --pull_bin_size.
// Declares 100 parameters of zeros with bin size 100, pushes a dense gradient of 0.01
// everywhere but 1 at element 0, and returns how many parameters its recompressed pull
// changed.
int ParametersChangedByOneRecompressedPull(uint32_t pull_bin_size) {
  auto context = std::make_shared<TransportContext>(1);
  SchedulerConfig sc;
  sc.bind = "inproc://pull-bin-scheduler";
  sc.num_workers = 1;
  sc.log_level = "warn";
  Scheduler scheduler(sc, context);
  EXPECT_TRUE(scheduler.Start().ok());
  ServerConfig vc;
  vc.scheduler = sc.bind;
  vc.bind = "inproc://pull-bin-server";
  vc.optimizer.kind = OptimizerKind::kSgd;
  vc.optimizer.learning_rate = 1.0f;
  vc.pull_bin_size = pull_bin_size;
  vc.log_level = "warn";
  Server server(vc, context);
  absl::Status status;
  std::thread start([&] { status = server.Start(); });
  WorkerOptions wo;
  wo.scheduler = sc.bind;
  wo.context = context;
  wo.log_level = "warn";
  auto worker = Worker::Create(wo);
  start.join();
  EXPECT_TRUE(status.ok()) << status;
  int changed = -1;
  if (worker.ok()) {
    std::vector<float> v(100, 0.0f), g(100, 0.01f);
    g[0] = 1.0f;
    EXPECT_TRUE((*worker)->Declare({"t", {100}, 100, Compression::kDense, 0.001,
                                    PullFormat::kRecompressed}, absl::MakeSpan(v)).ok());
    EXPECT_TRUE((*worker)->PushPull("t", g, absl::MakeSpan(v)).get().ok());
    changed = 0;
    for (float x : v) changed += x != 0.0f;
    EXPECT_TRUE((*worker)->Stop().ok());
  }
  EXPECT_TRUE(scheduler.WaitForShutdown(absl::Seconds(5)));
  EXPECT_TRUE(server.WaitForShutdown(absl::Seconds(5)));
  return changed;
}

TEST(PullBinSize, RecompressedPullsUseTheDeclaredBinSizeByDefault) {
  // One bin of 100: only the element that stands out (1 against 0.01) is sent.
  EXPECT_EQ(ParametersChangedByOneRecompressedPull(0), 1);
}

TEST(PullBinSize, SmallerPullBinSendsMoreOfTheChange) {
  // Ten bins of 10: bin 0 still sends only element 0; each of the nine others sends all of
  // its elements (each equal to its bin's maximum).
  EXPECT_EQ(ParametersChangedByOneRecompressedPull(10), 91);
}

TEST(PullBinSize, IsTheSmallerOfTheFlagAndTheDeclaredBinSize) {
  EXPECT_EQ(PullBinSize(500, 0), 500u);
  EXPECT_EQ(PullBinSize(500, 100), 100u);
  EXPECT_EQ(PullBinSize(50, 100), 50u);
  EXPECT_EQ(ParametersChangedByOneRecompressedPull(1000), 1);
}

}  // namespace
}  // namespace adaps
