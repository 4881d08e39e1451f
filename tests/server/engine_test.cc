// The server engine (server/engine.h): slices on several engine threads, fed in order by
// one producer as the server's I/O thread feeds them; answers recorded by a test sink. And
// one in-process server with two engine threads trained by two workers.
#include <array>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <future>
#include <map>
#include <thread>

#include "adaps/worker.h"
#include "common/wire_codec.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/checkpoint.h"
#include "server/engine.h"
#include "server/server.h"

namespace adaps {
namespace {

// Records every answer by the request it answers.
class RecordingSink final : public EngineSink {
 public:
  struct Answer {
    msg::Body type = msg::Body::NONE;
    absl::Status status;
    uint64_t version = 0;
    SharedBytes payload;
  };

  void Send(const std::string& route, int peer, OutMessage m) override {
    (void)route;
    (void)peer;
    const msg::Envelope* env = msg::GetEnvelope(m.header.data());
    Answer a;
    a.type = env->body_type();
    if (a.type == msg::Body::Error) a.status = StatusFromError(env->body_as_Error());
    if (a.type == msg::Body::PullResponse) a.version = env->body_as_PullResponse()->version();
    a.payload = m.payload;
    {
      std::lock_guard<std::mutex> lock(mu_);
      answers_[env->reply_to()] = std::move(a);
    }
    cv_.notify_all();
  }
  Sender self() const override { return Sender{msg::Role::Server, 0}; }

  // The answer to request `id`, waiting up to 10 s (type NONE when none came).
  Answer Wait(uint64_t id) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return answers_.count(id) > 0; })) {
      return Answer{};
    }
    return answers_[id];
  }
  bool Has(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return answers_.count(id) > 0;
  }

 private:
  // std::mutex, so that TSan sees the hand-over (server/engine_queue.h).
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Answer> answers_;  // guarded by mu_
};

SharedBytes DenseBytes(const std::vector<float>& values) {
  CompressedUpdate u;
  u.kind = CompressorKind::kDense;
  u.length = static_cast<uint32_t>(values.size());
  u.values = values;
  auto bytes = std::make_shared<Bytes>();
  EXPECT_TRUE(EncodeUpdate(u, IndexCoding::kRice, bytes.get()).ok());
  return bytes;
}

std::vector<float> Floats(const SharedBytes& bytes) {
  std::vector<float> v(bytes ? bytes->size() / sizeof(float) : 0);
  if (!v.empty()) std::memcpy(v.data(), bytes->data(), v.size() * sizeof(float));
  return v;
}

// Feeds an Engine the way Server's I/O thread does, from the test's thread.
class EngineHarness {
 public:
  explicit EngineHarness(int threads, OptimizerConfig optimizer = SumOnly(),
                         uint64_t checkpoint_every_steps = 0) {
    EngineOptions o;
    o.threads = threads;
    o.optimizer = optimizer;
    o.checkpoint_every_steps = checkpoint_every_steps;
    o.checkpoints = &writer;  // the server's CheckpointPolicy owns one
    writer.Start();
    engine = std::make_unique<Engine>(o, &sink);
    engine->Start();
  }
  ~EngineHarness() {
    engine->Stop();  // its threads may still hand snapshots on
    writer.Stop();
  }
  // What CheckpointPolicy::Write asks of the engine.
  void Checkpoint(std::string path, std::string job_id,
                  std::function<void(absl::Status, size_t)> done) {
    auto job = std::make_shared<CheckpointJob>();
    job->path = std::move(path);
    job->job_id = std::move(job_id);
    job->done = std::move(done);
    engine->Snapshot(std::move(job));
  }
  static OptimizerConfig SumOnly() {
    OptimizerConfig c;
    c.kind = OptimizerKind::kSumOnly;
    return c;
  }

  uint64_t Declare(uint64_t key, uint32_t length) {
    DeclareWork w = Work<DeclareWork>(key);
    w.length = length;
    w.bin_size = 10;
    w.name = "s" + std::to_string(key);
    const uint64_t id = w.request_id;
    EXPECT_TRUE(engine->Submit(engine->AssignOwner(key), std::move(w)));
    return id;
  }
  uint64_t Push(uint64_t key, int worker, uint64_t step, const std::vector<float>& g) {
    PushWork w = Work<PushWork>(key);
    w.worker = worker;
    w.step = step;
    w.bytes = DenseBytes(g);
    w.push = *ParseUpdate(*w.bytes);  // as Server::OnPush parses it
    const uint64_t id = w.request_id;
    EXPECT_TRUE(engine->Submit(engine->OwnerOf(key), std::move(w)));
    return id;
  }
  uint64_t Pull(uint64_t key, uint64_t min_version) {
    PullWork w = Work<PullWork>(key);
    w.min_version = min_version;
    const uint64_t id = w.request_id;
    EXPECT_TRUE(engine->Submit(engine->OwnerOf(key), std::move(w)));
    return id;
  }
  // A dense pull's answer: its version and values (empty when it failed).
  std::pair<uint64_t, std::vector<float>> Answer(uint64_t id) {
    RecordingSink::Answer a = sink.Wait(id);
    EXPECT_EQ(a.type, msg::Body::PullResponse) << a.status;
    return {a.version, Floats(a.payload)};
  }
  void ExpectAck(uint64_t id) {
    RecordingSink::Answer a = sink.Wait(id);
    EXPECT_EQ(a.type, msg::Body::Ack) << a.status;
  }

  RecordingSink sink;
  CheckpointWriter writer;
  std::unique_ptr<Engine> engine;

 private:
  template <typename T>
  T Work(uint64_t key) {
    T w;
    w.key = key;
    w.route = "worker";
    w.request_id = ++next_id_;
    return w;
  }
  uint64_t next_id_ = 0;
};

constexpr uint32_t kLen = 257;

std::vector<float> Gradient(int worker, int step, uint64_t key) {
  std::vector<float> g(kLen);
  for (uint32_t i = 0; i < kLen; ++i) {
    g[i] = static_cast<float>((worker + 1) * static_cast<int>(i % 7) + step) -
           static_cast<float>(key % 5);
  }
  return g;
}

TEST(Engine, SumsOfTwoWorkersAreExactOverManyStepsOnEverySliceOfTwoThreads) {
  EngineHarness h(2);
  const std::vector<uint64_t> keys = {0, 1, 2, 3, 4, 5, uint64_t{7} << 24};
  for (uint64_t key : keys) h.ExpectAck(h.Declare(key, kLen));
  EXPECT_EQ(h.engine->threads_running(), 2);
  h.engine->SetLiveWorkers({0, 1});
  std::map<uint64_t, std::vector<float>> want;
  for (uint64_t key : keys) want[key].assign(kLen, 0.0f);
  for (int step = 0; step < 40; ++step) {
    std::vector<uint64_t> pushes, pulls;
    for (uint64_t key : keys) {
      for (int w = 0; w < 2; ++w) pushes.push_back(h.Push(key, w, step, Gradient(w, step, key)));
      pulls.push_back(h.Pull(key, step + 1));  // held until the step completes
      for (int w = 0; w < 2; ++w) {
        const std::vector<float> g = Gradient(w, step, key);
        for (uint32_t i = 0; i < kLen; ++i) want[key][i] += g[i];
      }
    }
    for (uint64_t id : pushes) h.ExpectAck(id);
    for (size_t k = 0; k < keys.size(); ++k) {
      auto [version, values] = h.Answer(pulls[k]);
      ASSERT_EQ(version, static_cast<uint64_t>(step + 1));
      ASSERT_EQ(values, want[keys[k]]) << "slice " << keys[k] << " step " << step;
    }
  }
}

TEST(Engine, SetHyperReachesEveryThreadBeforeThePushesQueuedAfterIt) {
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.learning_rate = 1.0f;
  EngineHarness h(3, sgd);
  for (uint64_t key = 0; key < 6; ++key) h.ExpectAck(h.Declare(key, kLen));
  h.engine->SetLiveWorkers({0});
  const std::vector<float> ones(kLen, 1.0f);
  for (uint64_t key = 0; key < 6; ++key) h.Push(key, 0, 0, ones);
  sgd.learning_rate = 0.5f;
  h.engine->SetOptimizer(sgd);  // queued behind step 0, ahead of step 1 on every thread
  std::vector<uint64_t> pulls;
  for (uint64_t key = 0; key < 6; ++key) {
    h.Push(key, 0, 1, ones);
    pulls.push_back(h.Pull(key, 2));
  }
  for (uint64_t id : pulls) {
    auto [version, values] = h.Answer(id);
    EXPECT_EQ(version, 2u);
    EXPECT_EQ(values, std::vector<float>(kLen, -1.5f));  // -1 at rate 1, then -0.5
  }
}

TEST(Engine, CheckpointWhilePushingHoldsExactlyTheStepsQueuedBeforeIt) {
  const std::string path = ::testing::TempDir() + "/engine-test.ckpt";
  std::remove(path.c_str());
  EngineHarness h(2);
  for (uint64_t key = 0; key < 4; ++key) h.ExpectAck(h.Declare(key, 1 << 14));
  h.engine->SetLiveWorkers({0});
  const std::vector<float> ones(1 << 14, 1.0f);
  std::promise<std::pair<absl::Status, std::thread::id>> written;
  for (int step = 0; step < 12; ++step) {
    if (step == 5) {
      h.Checkpoint(path, "test-job", [&written](absl::Status st, size_t n) {
        EXPECT_EQ(n, 4u);
        written.set_value({st, std::this_thread::get_id()});
      });
    }
    for (uint64_t key = 0; key < 4; ++key) h.Push(key, 0, step, ones);
  }
  auto [status, writer] = written.get_future().get();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_NE(writer, std::this_thread::get_id()) << "the file must be written off the producer";
  auto records = ReadCheckpointFile(path);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ((*records)[k].key, k) << "records in key order";
    EXPECT_EQ((*records)[k].version, 5u);
    EXPECT_EQ((*records)[k].params, std::vector<float>(1 << 14, 5.0f));
  }
  for (uint64_t key = 0; key < 4; ++key) {
    auto [version, values] = h.Answer(h.Pull(key, 12));
    EXPECT_EQ(version, 12u);
    EXPECT_EQ(values[0], 12.0f);
  }
}

TEST(Engine, WorkerLostMidStepCompletesTheStepOnEveryThread) {
  EngineHarness h(2);
  for (uint64_t key = 0; key < 4; ++key) h.ExpectAck(h.Declare(key, kLen));
  h.engine->SetLiveWorkers({0, 1});
  std::vector<uint64_t> pulls;
  for (uint64_t key = 0; key < 4; ++key) {
    h.ExpectAck(h.Push(key, 0, 0, Gradient(0, 0, key)));
    pulls.push_back(h.Pull(key, 1));
  }
  absl::SleepFor(absl::Milliseconds(50));
  for (uint64_t id : pulls) EXPECT_FALSE(h.sink.Has(id)) << "worker 1 has not pushed yet";
  h.engine->SetLiveWorkers({0});  // worker 1 died
  for (uint64_t key = 0; key < 4; ++key) {
    auto [version, values] = h.Answer(pulls[key]);
    EXPECT_EQ(version, 1u);
    EXPECT_EQ(values, Gradient(0, 0, key));
  }
}

TEST(Engine, StopFinishesTheQueuedWorkAndRefusesMore) {
  EngineHarness h(2);
  constexpr uint32_t kBig = 1 << 16;
  for (uint64_t key = 0; key < 4; ++key) h.ExpectAck(h.Declare(key, kBig));
  h.engine->SetLiveWorkers({0});
  const std::vector<float> ones(kBig, 1.0f);
  std::vector<uint64_t> pushes;
  for (int step = 0; step < 30; ++step) {
    for (uint64_t key = 0; key < 4; ++key) pushes.push_back(h.Push(key, 0, step, ones));
  }
  h.engine->Stop();  // with most of that still queued
  for (uint64_t id : pushes) EXPECT_TRUE(h.sink.Has(id)) << "push " << id << " dropped";
  EXPECT_FALSE(h.engine->Submit(0, PullWork{}));
  absl::Status after;
  h.Checkpoint("/nonexistent/x.ckpt", "test-job", [&](absl::Status st, size_t) { after = st; });
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable) << after;
}

TEST(Engine, PushToAKeyTheThreadDoesNotHoldIsRefused) {
  EngineHarness h(2);
  h.ExpectAck(h.Declare(0, kLen));
  const int owner = h.engine->AssignOwner(99);  // assigned, but the declare never came
  PushWork w;
  w.key = 99;
  w.request_id = 1000;
  w.bytes = DenseBytes(std::vector<float>(kLen, 1.0f));
  w.push = *ParseUpdate(*w.bytes);
  ASSERT_TRUE(h.engine->Submit(owner, std::move(w)));
  RecordingSink::Answer a = h.sink.Wait(1000);
  EXPECT_EQ(a.status.code(), absl::StatusCode::kInvalidArgument) << a.status;
}

// A scheduler, a server with 2 engine threads and 2 workers over inproc://, several tensors.
TEST(ServerEngine, TwoWorkersTrainSeveralTensorsOnTwoEngineThreadsExactly) {
  auto context = std::make_shared<TransportContext>(1);
  SchedulerConfig sc;
  sc.bind = "inproc://engine-scheduler";
  sc.num_workers = 2;
  sc.log_level = "warn";
  Scheduler scheduler(sc, context);
  ASSERT_TRUE(scheduler.Start().ok());
  ServerConfig vc;
  vc.scheduler = sc.bind;
  vc.bind = "inproc://engine-server";
  vc.optimizer.kind = OptimizerKind::kSumOnly;
  vc.engine_threads = 2;
  vc.log_level = "warn";
  Server server(vc, context);
  absl::Status server_status;
  std::thread start([&] { server_status = server.Start(); });
  constexpr int kTensors = 5, kSteps = 15;
  constexpr size_t kN = 300;
  std::array<std::vector<std::vector<float>>, 2> pulled;
  std::vector<std::thread> workers;
  for (int i = 0; i < 2; ++i) {
    workers.emplace_back([&, i] {
      WorkerOptions wo;
      wo.scheduler = sc.bind;
      wo.context = context;
      wo.log_level = "warn";
      auto w = Worker::Create(wo);
      ASSERT_TRUE(w.ok()) << w.status();
      std::vector<std::vector<float>> v(kTensors, std::vector<float>(kN, 0.0f));
      for (int t = 0; t < kTensors; ++t) {
        ASSERT_TRUE((*w)->Declare({"t" + std::to_string(t), {kN}, 10, Compression::kDense},
                                  absl::MakeSpan(v[t]))
                        .ok());
      }
      const int rank = (*w)->rank();
      for (int step = 0; step < kSteps; ++step) {
        std::vector<std::future<absl::Status>> done;
        std::vector<std::vector<float>> g(kTensors, std::vector<float>(kN));
        for (int t = 0; t < kTensors; ++t) {
          for (size_t k = 0; k < kN; ++k) g[t][k] = static_cast<float>((rank + 1) * (t + 1));
          done.push_back((*w)->PushPull("t" + std::to_string(t), g[t], absl::MakeSpan(v[t])));
        }
        for (auto& d : done) ASSERT_TRUE(d.get().ok());
      }
      pulled[i] = v;
      (*w)->Stop().IgnoreError();
    });
  }
  for (auto& t : workers) t.join();
  start.join();
  ASSERT_TRUE(server_status.ok()) << server_status;
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(pulled[i].size(), static_cast<size_t>(kTensors));
    for (int t = 0; t < kTensors; ++t) {
      // Each step adds 1*(t+1) + 2*(t+1).
      EXPECT_EQ(pulled[i][t], std::vector<float>(kN, static_cast<float>(3 * (t + 1) * kSteps)))
          << "worker " << i << " tensor " << t;
    }
  }
  EXPECT_TRUE(scheduler.WaitForShutdown(absl::Seconds(5)));
  EXPECT_TRUE(server.WaitForShutdown(absl::Seconds(5)));
}

}  // namespace
}  // namespace adaps

namespace adaps {
namespace {

// A fusion bucket's declaration as the I/O thread routes it (server/engine_thread.cc).
uint64_t DeclareBucket(EngineHarness& h, uint64_t id, std::vector<WireSegment> table,
                       std::vector<float> init, uint32_t capacity = 100) {
  DeclareWork w;
  w.key = 9;
  w.route = "worker";
  w.request_id = id;
  w.name = "adaps.fusion/0";
  w.length = capacity;
  w.bin_size = 1;
  w.segments = std::move(table);
  w.has_init = !init.empty();
  if (w.has_init) {
    auto bytes = std::make_shared<Bytes>(init.size() * sizeof(float));
    std::memcpy(bytes->data(), init.data(), bytes->size());
    w.bytes = bytes;
  }
  EXPECT_TRUE(h.engine->Submit(h.engine->AssignOwner(9), std::move(w)));
  return id;
}

TEST(Engine, ABucketGrowsMemberByMemberAndRefusesBadTables) {
  EngineHarness h(1);
  const std::vector<float> a(10, 1.5f), b(6, -2.0f);
  h.ExpectAck(DeclareBucket(h, 1001, {{10, 5}}, a));
  h.ExpectAck(DeclareBucket(h, 1002, {{10, 5}, {6, 50}}, {}));  // another worker, first
  h.ExpectAck(DeclareBucket(h, 1003, {{10, 5}, {6, 50}}, b));   // rank 0
  EXPECT_EQ(h.sink.Wait(DeclareBucket(h, 1004, {{10, 5}, {6, 50}, {90, 5}}, {})).status.code(),
            absl::StatusCode::kInvalidArgument);  // past its capacity
  EXPECT_EQ(h.sink.Wait(DeclareBucket(h, 1005, {{10, 6}}, {})).status.code(),
            absl::StatusCode::kInvalidArgument);  // contradicts the table
  EXPECT_EQ(h.sink.Wait(DeclareBucket(h, 1006, {{10, 5}, {6, 50}, {3, 5}}, {1.0f})).status.code(),
            absl::StatusCode::kInvalidArgument);  // values of another length than the last
  std::vector<float> want = a;
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(h.Answer(h.Pull(9, 0)).second, want);
}

// A new bucket whose segments exceed its length is refused by its owner and gets no shard;
// the step checkpoints, which wait for a record of every slice, must not wait for it.
TEST(Engine, RefusedNewBucketLeavesStepCheckpointsWaitingForNoSlice) {
  // One engine thread: the refusal is done before the push is taken (one queue, in order).
  EngineHarness h(1, EngineHarness::SumOnly(), /*checkpoint_every_steps=*/1);
  const std::string path = ::testing::TempDir() + "/adaps-refused-bucket.step-1.ckpt";
  std::promise<std::pair<absl::Status, size_t>> written;
  h.writer.SetStepCheckpoints([path](uint64_t) { return path; }, "job",
                               [&](uint64_t step, absl::Status st, size_t n) {
                                 if (step == 1) written.set_value({std::move(st), n});
                               });
  h.ExpectAck(h.Declare(1, kLen));
  RecordingSink::Answer refused = h.sink.Wait(DeclareBucket(h, 1001, {{60, 5}, {60, 5}}, {}));
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
  EXPECT_NE(refused.status.message().find("more than its 100"), std::string::npos);
  h.engine->SetLiveWorkers({0});
  h.ExpectAck(h.Push(1, 0, 0, Gradient(0, 0, 1)));
  auto done = written.get_future();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "the step-1 checkpoint waits for the refused bucket";
  const auto [status, slices] = done.get();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(slices, 1u);
  // Nothing of the refused declaration is left: a push to it is refused as undeclared.
  EXPECT_EQ(h.sink.Wait(h.Push(9, 0, 0, std::vector<float>(100, 1.0f))).status.code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace adaps
