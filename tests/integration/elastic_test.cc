// Elastic membership with real processes: workers that join a running job
// (adaps-scheduler --max_workers) and workers that leave with nothing lost (Worker::Leave).
//
// The servers run the sum-only optimizer, so their parameters are the sum of every push
// they applied: with a known gradient stream the test checks, element by element, that the
// sum of every gradient any worker was given equals the servers' parameters plus the
// residues the workers still hold (nothing lost, nothing applied twice), and, from a dense
// tensor of all-ones pushes, how many workers each step counted.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "adaps/local_steps.h"
#include "adaps/worker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace adaps {
namespace {

using ::adaps::testing::ClusterOptions;
using ::adaps::testing::LocalCluster;
using ::adaps::testing::Process;
using ::testing::HasSubstr;

constexpr size_t kBig = 150000;  // split over both servers (split threshold 65536)
constexpr size_t kSmall = 300;   // fused into a bucket
constexpr size_t kCount = 64;    // dense all-ones: counts the pushes each step took

WorkerOptions Options(const std::string& scheduler) {
  WorkerOptions o;
  o.scheduler = scheduler;
  o.register_timeout = absl::Seconds(20);
  o.request_timeout = absl::Seconds(10);
  o.log_level = "warn";
  return o;
}

// The gradient worker `who` is given at its `step`-th step for element i: deterministic,
// of mixed signs and magnitudes, so that AdaComp leaves real residues.
float Grad(int who, int step, size_t i, int tensor) {
  const uint64_t h = (uint64_t{static_cast<uint32_t>(who)} * 1000003u + step * 7919u +
                      i * 104729u + tensor * 15485863u) * 2654435761u;
  const float u = static_cast<float>((h >> 7) % 20001) / 10000.0f - 1.0f;  // [-1, 1]
  return u * (1.0f + static_cast<float>(i % 7));
}

// One trainer: declares a (AdaComp, sparse pulls), s (AdaComp, fused) and c (dense ones),
// runs `steps` steps and keeps the sum of its gradients and, at the end, its residues.
struct Trainer {
  int who = 0;
  std::unique_ptr<Worker> worker;
  std::vector<float> a = std::vector<float>(kBig), s = std::vector<float>(kSmall),
                     c = std::vector<float>(kCount);
  std::vector<double> sum_a = std::vector<double>(kBig, 0.0),
                      sum_s = std::vector<double>(kSmall, 0.0);
  std::vector<float> res_a = std::vector<float>(kBig, 0.0f),
                     res_s = std::vector<float>(kSmall, 0.0f);
  int pushes = 0;
  std::vector<float> count_after_step;  // c[0] after each step

  absl::Status Start(const std::string& scheduler, const std::string& identity = "") {
    WorkerOptions o = Options(scheduler);
    o.identity = identity;
    auto w = Worker::Create(o);
    if (!w.ok()) return w.status();
    worker = *std::move(w);
    TensorSpec ta{"a", {static_cast<int64_t>(kBig)}, 100, Compression::kAdaComp};
    ta.pull = PullFormat::kSparse;
    TensorSpec ts{"s", {static_cast<int64_t>(kSmall)}, 50, Compression::kAdaComp};
    TensorSpec tc{"c", {static_cast<int64_t>(kCount)}, 100, Compression::kDense};
    for (auto* spec : {&ta, &ts, &tc}) {
      std::vector<float>& v = spec == &ta ? a : spec == &ts ? s : c;
      if (auto st = worker->Declare(*spec, absl::MakeSpan(v)); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  absl::Status Step(int step) {
    std::vector<float> ga(kBig), gs(kSmall), gc(kCount, 1.0f);
    for (size_t i = 0; i < kBig; ++i) sum_a[i] += ga[i] = Grad(who, step, i, 0);
    for (size_t i = 0; i < kSmall; ++i) sum_s[i] += gs[i] = Grad(who, step, i, 1);
    auto fa = worker->PushPull("a", ga, absl::MakeSpan(a));
    auto fs = worker->PushPull("s", gs, absl::MakeSpan(s));
    auto fc = worker->PushPull("c", gc, absl::MakeSpan(c));
    absl::Status st = fa.get();
    st.Update(fs.get());
    st.Update(fc.get());
    if (!st.ok()) return st;
    ++pushes;
    count_after_step.push_back(c[0]);
    return absl::OkStatus();
  }

  // The replica of `a` is the servers' parameters, bit for bit.
  void ExpectReplicaIsTheServers() {
    std::vector<float> servers(kBig);
    ASSERT_TRUE(worker->PullParameters("a", absl::MakeSpan(servers)).ok());
    for (size_t i = 0; i < kBig; ++i) {
      ASSERT_EQ(a[i], servers[i]) << "worker " << who << " element " << i;
    }
  }

  void KeepResidues() {
    ASSERT_TRUE(worker->Residue("a", absl::MakeSpan(res_a)).ok());
    ASSERT_TRUE(worker->Residue("s", absl::MakeSpan(res_s)).ok());
  }
};

// sum of every trainer's gradients == servers' parameters + every trainer's residues.
void ExpectNothingLost(const std::vector<Trainer*>& all, const std::vector<float>& params,
                       size_t n, bool big) {
  int wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    double given = 0.0, held = 0.0, scale = 0.0;
    for (const Trainer* t : all) {
      given += big ? t->sum_a[i] : t->sum_s[i];
      held += big ? t->res_a[i] : t->res_s[i];
      scale += std::fabs(big ? t->sum_a[i] : t->sum_s[i]);
    }
    const double reached = params[i];
    if (std::fabs(given - (reached + held)) > 1e-4 * (scale + 10.0) && ++wrong <= 5) {
      ADD_FAILURE() << (big ? "a" : "s") << "[" << i << "]: gradients " << given
                    << ", at the servers " << reached << ", in residues " << held;
    }
  }
  EXPECT_EQ(wrong, 0);
}

ClusterOptions Elastic(int start, int max) {
  ClusterOptions c;
  c.num_servers = 2;
  c.num_workers = start;
  c.scheduler_args = {absl::StrCat("--max_workers=", max)};
  c.server_args = {"--optimizer=sum"};
  return c;
}

// Two workers grow to four; a joiner leaves (Worker::Leave) and the other stops; one of the
// first two is restarted mid-run with its residues saved and loaded.
TEST(Elastic, AJobGrowsFromTwoToFourWorkersWithEveryReplicaTheServersAndNothingLost) {
  LocalCluster cluster(Elastic(2, 4));
  ASSERT_FALSE(cluster.scheduler_address().empty());
  constexpr int kSteps = 30, kJoinerSteps = 12, kJoinAt = 6, kRestartAt = 10;
  std::vector<Trainer> t(4);
  for (int i = 0; i < 4; ++i) t[i].who = i;
  std::atomic<int> joiners_done{0};
  // Worker 0 steps until the three others are done (it must not sit idle while they
  // push: a sync step waits for every live worker), however a thread ends.
  std::atomic<int> others_done{0};
  struct CountsDone {
    explicit CountsDone(std::atomic<int>& counter) : n(counter) {}
    CountsDone(const CountsDone&) = delete;
    ~CountsDone() { ++n; }
    std::atomic<int>& n;
  };
  std::atomic<int> rank0_step{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      const std::string identity = i == 1 ? "restarts" : "";
      ASSERT_TRUE(t[i].Start(cluster.scheduler_address(), identity).ok());
      EXPECT_EQ(t[i].worker->live_workers(), 2);
      std::optional<CountsDone> done;
      if (i != 0) done.emplace(others_done);
      for (int s = 0; s < kSteps || (i == 0 && others_done < 3 && s < 20 * kSteps); ++s) {
        if (i == 0) rank0_step = s;
        if (i == 1 && s == kRestartAt) {
          // A restart: its residues saved, the process gone (Stop, as a failing script's
          // exit does), a new one with the same identity takes its rank back and loads them.
          const std::string saved = cluster.dir() + "/w1.residues";
          ASSERT_TRUE(t[i].worker->SaveResidues(saved).ok());
          const int rank = t[i].worker->rank();
          ASSERT_TRUE(t[i].worker->Stop().ok());
          t[i].worker.reset();
          absl::Status back = t[i].Start(cluster.scheduler_address(), identity);
          ASSERT_TRUE(back.ok()) << back;
          EXPECT_EQ(t[i].worker->rank(), rank);
          t[i].ExpectReplicaIsTheServers();
          ASSERT_TRUE(t[i].worker->LoadResidues(saved).ok());
        }
        absl::Status st = t[i].Step(s);
        ASSERT_TRUE(st.ok()) << "worker " << i << " step " << s << ": " << st;
        // Slow enough that the joiners come in while these train.
        absl::SleepFor(absl::Milliseconds(20));
      }
      t[i].ExpectReplicaIsTheServers();
      if (i == 1) {
        t[i].KeepResidues();
        EXPECT_TRUE(t[i].worker->Stop().ok());
      }
    });
  }
  for (int j = 2; j < 4; ++j) {
    threads.emplace_back([&, j] {
      CountsDone done(others_done);
      while (rank0_step < kJoinAt) absl::SleepFor(absl::Milliseconds(5));
      absl::Status started = t[j].Start(cluster.scheduler_address());
      ASSERT_TRUE(started.ok()) << started;
      EXPECT_GE(t[j].worker->rank(), 2);
      // It starts from the servers' current parameters.
      t[j].ExpectReplicaIsTheServers();
      for (int s = 0; s < kJoinerSteps; ++s) {
        absl::Status st = t[j].Step(s);
        ASSERT_TRUE(st.ok()) << "joiner " << j << " step " << s << ": " << st;
        absl::SleepFor(absl::Milliseconds(20));
      }
      t[j].ExpectReplicaIsTheServers();
      if (j == 2) {
        // Leaves with nothing lost: its residues reach the servers (and are zero here).
        ASSERT_TRUE(t[j].worker->Leave().ok());
      } else {
        t[j].KeepResidues();
        EXPECT_TRUE(t[j].worker->Stop().ok());
      }
      ++joiners_done;
    });
  }
  for (auto& th : threads) {
    if (th.get_id() != threads[0].get_id()) th.join();
  }
  threads[0].join();
  // Worker 0 ran on alone once the others were gone: the servers hold everything now.
  ASSERT_EQ(joiners_done.load(), 2);
  std::vector<float> a(kBig), s(kSmall);
  ASSERT_TRUE(t[0].worker->PullParameters("a", absl::MakeSpan(a)).ok());
  t[0].KeepResidues();
  // (s is fused: its servers' values are what worker 0's last pull wrote.)
  s = t[0].s;
  std::vector<Trainer*> all = {&t[0], &t[1], &t[2], &t[3]};
  ExpectNothingLost(all, a, kBig, true);
  ExpectNothingLost(all, s, kSmall, false);
  // Counted pushes: the servers applied each of them once (c counts every push).
  int pushes = 0;
  for (const Trainer* x : all) pushes += x->pushes;
  EXPECT_EQ(t[0].c[0], static_cast<float>(pushes));
  // Some step took four pushes: the joiners took part.
  float prev = 0.0f, most = 0.0f;
  for (float c : t[0].count_after_step) {
    most = std::max(most, c - prev);
    EXPECT_LE(c - prev, 4.0f);
    prev = c;
  }
  EXPECT_EQ(most, 4.0f);
  EXPECT_TRUE(t[0].worker->Stop().ok());
  std::string why;
  EXPECT_TRUE(cluster.AllExitCleanly(absl::Seconds(10), &why)) << why;
}

// A C++ trainer's local steps (LocalSteps, servers running mean): a worker that joins a
// running job takes the servers' running sum of the means, the others' anchor bit for bit,
// and exchanges on with them, whatever the pull: recompressed (the sum is the slice itself)
// or exact (the servers keep it beside the step's mean, TensorSpec::keep_sum), for a tensor
// split over both servers and one fused into a bucket. With the Nesterov outer step (each
// worker's anchor holds its own momentum's steps) a joiner is refused, saying why.
TEST(Elastic, AWorkerJoiningLocalStepsStartsFromTheServersRunningSum) {
  for (PullFormat pull : {PullFormat::kRecompressed, PullFormat::kSparse, PullFormat::kDense}) {
    SCOPED_TRACE(static_cast<int>(pull));
    ClusterOptions options = Elastic(1, 3);
    options.server_args = {"--optimizer=mean"};
    LocalCluster cluster(options);
    ASSERT_FALSE(cluster.scheduler_address().empty());
    struct Member {
      std::unique_ptr<Worker> worker;
      std::unique_ptr<LocalSteps> steps;
      std::map<std::string, std::vector<float>> params;
    };
    const std::map<std::string, size_t> sizes = {{"w", kBig}, {"s", kSmall}};
    auto start = [&](Member& m, LocalStepsOptions::Outer outer) {
      auto w = Worker::Create(Options(cluster.scheduler_address()));
      ASSERT_TRUE(w.ok()) << w.status();
      m.worker = *std::move(w);
      LocalStepsOptions o;
      o.outer = outer;
      auto steps = LocalSteps::Create(m.worker.get(), o);
      ASSERT_TRUE(steps.ok()) << steps.status();
      m.steps = *std::move(steps);
      for (const auto& [name, n] : sizes) m.params[name].assign(n, 0.5f);
    };
    auto declare = [&](Member& m) {
      for (auto& [name, values] : m.params) {
        TensorSpec spec{name, {static_cast<int64_t>(values.size())}, 100, Compression::kAdaComp};
        spec.pull = pull;
        absl::Status st = m.steps->Declare(spec, absl::MakeSpan(values));
        if (!st.ok()) return st;
      }
      return absl::OkStatus();
    };
    auto exchange = [&](Member& m, int who, int e) {
      for (auto& [name, values] : m.params) {
        for (size_t i = 0; i < values.size(); ++i) values[i] += 0.01f * Grad(who, e, i, 0);
        absl::Status st = m.steps->Exchange(name, absl::MakeSpan(values)).get();
        ASSERT_TRUE(st.ok()) << "worker " << who << " exchange " << e << " " << name << ": " << st;
      }
    };
    Member first, nesterov, joiner;
    ASSERT_NO_FATAL_FAILURE(start(first, LocalStepsOptions::Outer::kAverage));
    ASSERT_TRUE(declare(first).ok());
    for (int e = 0; e < 3; ++e) ASSERT_NO_FATAL_FAILURE(exchange(first, 0, e));
    ASSERT_NO_FATAL_FAILURE(start(nesterov, LocalStepsOptions::Outer::kNesterov));
    ASSERT_TRUE(nesterov.worker->rejoined());
    absl::Status refused = declare(nesterov);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr("Outer::kAverage"));
    EXPECT_TRUE(nesterov.worker->Stop().ok());
    ASSERT_NO_FATAL_FAILURE(start(joiner, LocalStepsOptions::Outer::kAverage));
    ASSERT_TRUE(joiner.worker->rejoined());
    ASSERT_TRUE(declare(joiner).ok());
    auto anchors_equal = [&](const char* when) {
      for (const auto& [name, n] : sizes) {
        absl::StatusOr<absl::Span<const float>> a = first.steps->Anchor(name);
        absl::StatusOr<absl::Span<const float>> b = joiner.steps->Anchor(name);
        ASSERT_TRUE(a.ok() && b.ok());
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ((*a)[i], (*b)[i]) << when << ", " << name << " element " << i;
        }
      }
    };
    ASSERT_NO_FATAL_FAILURE(anchors_equal("at the join"));
    // (The joiner's start is the job's, moved by three exchanges.)
    for (const auto& [name, values] : joiner.params) {
      EXPECT_GT(values.size() - std::count(values.begin(), values.end(), 0.5f),
                values.size() / 100) << name;
    }
    for (int e = 3; e < 5; ++e) {
      std::thread other([&] { exchange(joiner, 1, e); });
      exchange(first, 0, e);
      other.join();
    }
    ASSERT_NO_FATAL_FAILURE(anchors_equal("two exchanges later"));
    EXPECT_TRUE(joiner.worker->Stop().ok());
    EXPECT_TRUE(first.worker->Stop().ok());
    std::string why;
    EXPECT_TRUE(cluster.AllExitCleanly(absl::Seconds(10), &why)) << why;
  }
}

TEST(Elastic, AWorkerBeyondTheBoundIsRefusedWithTheReason) {
  for (int max : {0, 3}) {
    LocalCluster cluster(Elastic(2, max));
    ASSERT_FALSE(cluster.scheduler_address().empty());
    std::vector<std::unique_ptr<Worker>> ws(2);
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        auto w = Worker::Create(Options(cluster.scheduler_address()));
        ASSERT_TRUE(w.ok()) << w.status();
        ws[i] = *std::move(w);
      });
    }
    for (auto& th : threads) th.join();
    ASSERT_TRUE(ws[0] && ws[1]);
    if (max == 3) {  // one may join
      auto joined = Worker::Create(Options(cluster.scheduler_address()));
      ASSERT_TRUE(joined.ok()) << joined.status();
      EXPECT_EQ((*joined)->rank(), 2);
      EXPECT_EQ((*joined)->live_workers(), 3);
      EXPECT_EQ((*joined)->num_workers(), 3);
      ws.push_back(*std::move(joined));
      // The others learn the new count from the view that announced it.
      const absl::Time end = absl::Now() + absl::Seconds(5);
      while (ws[0]->live_workers() != 3 && absl::Now() < end) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      EXPECT_EQ(ws[0]->live_workers(), 3);
    }
    auto extra = Worker::Create(Options(cluster.scheduler_address()));
    ASSERT_FALSE(extra.ok());
    EXPECT_EQ(extra.status().code(), absl::StatusCode::kFailedPrecondition) << extra.status();
    EXPECT_THAT(std::string(extra.status().message()),
                HasSubstr(max == 0 ? "start the scheduler with --max_workers"
                                   : "3 live workers, --max_workers=3"));
    for (auto& w : ws) EXPECT_TRUE(w->Stop().ok());
    std::string why;
    EXPECT_TRUE(cluster.AllExitCleanly(absl::Seconds(10), &why)) << why;
  }
}

TEST(Elastic, SchedulerRefusesAMaxWorkersBelowTheStartingCount) {
  ::adaps::testing::Process scheduler(
      ADAPS_SCHEDULER_BIN, {"--num_workers=3", "--max_workers=2"},
      ::adaps::testing::MakeTempDir() + "/scheduler.log");
  EXPECT_EQ(scheduler.WaitExit(absl::Seconds(10)), 2);
  EXPECT_THAT(scheduler.Log(), HasSubstr("max_workers (2) must be 0 or at least num_workers (3)"));
}

// Up to three workers of one dense all-ones tensor "c" (kCount elements), 3 s deadlines:
// each step adds one per pusher, so c[0] counts the pushes the servers took.
struct CountingWorkers {
  std::string scheduler;
  // (Where the deadline is what a test checks; minutes where only a failure reaches it.)
  absl::Duration request_timeout = absl::Seconds(3);
  std::vector<std::unique_ptr<Worker>> w = std::vector<std::unique_ptr<Worker>>(3);
  std::vector<std::vector<float>> p =
      std::vector<std::vector<float>>(3, std::vector<float>(kCount, 0.0f));

  void Make(int i) {
    WorkerOptions o = Options(scheduler);
    o.request_timeout = request_timeout;
    auto made = Worker::Create(o);
    ASSERT_TRUE(made.ok()) << made.status();
    w[i] = *std::move(made);
  }
  void Declare(int i) {
    ASSERT_TRUE(w[i]->Declare({"c", {static_cast<int64_t>(kCount)}, 100, Compression::kDense},
                              absl::MakeSpan(p[i]))
                    .ok());
  }
  // Workers 0 and 1 made and declared together (Declare is collective).
  void StartTwo() {
    std::thread t0([&] {
      Make(0);
      if (w[0]) Declare(0);
    });
    Make(1);
    if (w[1]) Declare(1);
    t0.join();
  }
  // `n` steps of the workers in `who` at once.
  void Steps(const std::vector<int>& who, int n) {
    const std::vector<float> ones(kCount, 1.0f);
    for (int s = 0; s < n; ++s) {
      std::vector<std::future<absl::Status>> f;
      for (int i : who) f.push_back(w[i]->PushPull("c", ones, absl::MakeSpan(p[i])));
      for (auto& x : f) ASSERT_TRUE(x.get().ok()) << "step " << s;
    }
  }
  // Waits until worker 0's view shows `n` live workers.
  void AwaitLive(int n) {
    const absl::Time end = absl::Now() + absl::Seconds(5);
    while (w[0]->live_workers() != n && absl::Now() < end) absl::SleepFor(absl::Milliseconds(10));
    ASSERT_EQ(w[0]->live_workers(), n);
  }
};

TEST(Elastic, AJoinerThatHasNotDeclaredYetHoldsUpNobodysStep) {
  ClusterOptions c;
  c.num_servers = 1;
  c.num_workers = 2;
  c.scheduler_args = {"--max_workers=3"};
  c.server_args = {"--optimizer=sum"};
  LocalCluster cluster(c);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  CountingWorkers cw{cluster.scheduler_address()};
  auto& w = cw.w;
  auto& p = cw.p;
  cw.StartTwo();
  ASSERT_TRUE(w[0] && w[1]);
  cw.Steps({0, 1}, 3);
  EXPECT_EQ(p[0][0], 6.0f);
  // A third worker joins (registered, live in every view) but does not declare for a while:
  // the others' steps go on without it (they would wait past their 3 s deadline otherwise).
  cw.Make(2);
  ASSERT_TRUE(w[2]);
  cw.AwaitLive(3);
  absl::SleepFor(absl::Milliseconds(300));  // every server saw the view with it
  cw.Steps({0, 1}, 5);
  EXPECT_EQ(p[0][0], 16.0f);
  // Once it declared, it takes part: three pushes a step, its first values the current ones.
  cw.Declare(2);
  EXPECT_EQ(p[2][0], 16.0f);
  cw.Steps({0, 1, 2}, 2);
  EXPECT_EQ(p[0][0], 22.0f);
  EXPECT_EQ(p[2][0], 22.0f);
  for (auto& x : w) EXPECT_TRUE(x->Stop().ok());
  std::string why;
  EXPECT_TRUE(cluster.AllExitCleanly(absl::Seconds(10), &why)) << why;
}

// A cluster whose one server (sum, checkpointing, restartable) runs here, to be killed and
// started again with `server_args`; workers 0 and 1 have taken 3 steps of ones and the
// servers' state at step 3 is checkpointed.
struct RestartableSumServer {
  explicit RestartableSumServer(const std::vector<std::string>& scheduler_args) {
    ClusterOptions c;
    c.num_servers = 0;
    c.num_workers = 2;
    c.scheduler_args = scheduler_args;
    cluster = std::make_unique<LocalCluster>(c);
    if (cluster->scheduler_address().empty()) return;
    const std::string ckpt = cluster->dir() + "/ckpt";
    if (!std::filesystem::create_directory(ckpt)) return;
    server_args = {"--scheduler=" + cluster->scheduler_address(), "--optimizer=sum",
                   "--identity=s0", "--checkpoint_dir=" + ckpt, "--log_level=info",
                   "--register_timeout_ms=20000"};
    server = std::make_unique<Process>(ADAPS_SERVER_BIN, server_args, cluster->dir() + "/s-a.log");
    cw.scheduler = cluster->scheduler_address();
  }
  // Workers 0 and 1 start, take 3 steps and checkpoint the servers.
  void StartAndCheckpoint() {
    ASSERT_TRUE(server) << "no cluster";
    cw.StartTwo();
    ASSERT_TRUE(cw.w[0] && cw.w[1]);
    cw.Steps({0, 1}, 3);
    ASSERT_EQ(cw.p[0][0], 6.0f);
    ASSERT_TRUE(cw.w[0]->Checkpoint("").ok());  // the servers' state at step 3
  }
  void Restart() {
    server->Kill();
    server = std::make_unique<Process>(ADAPS_SERVER_BIN, server_args, cluster->dir() + "/s-b.log");
  }
  std::unique_ptr<LocalCluster> cluster;
  std::vector<std::string> server_args;
  std::unique_ptr<Process> server;
  CountingWorkers cw;
};

// The same joiner across a server restart: the restarted server counts, from its first view,
// the workers that take part in the steps, not one that registered and has not declared a
// tensor yet (a joiner still loading its data). It counted every worker of that view, and
// the others' steps waited for the joiner's first push (in grow_under_faults.sh, 3 s of a
// 6-s run); here, past their 3 s deadline.
TEST(Elastic, ARestartedServerWaitsForNoJoinerThatHasNotDeclaredYet) {
  RestartableSumServer r({"--num_servers=1", "--max_workers=3"});
  ASSERT_NO_FATAL_FAILURE(r.StartAndCheckpoint());
  auto& cw = r.cw;
  auto& w = cw.w;
  auto& p = cw.p;
  auto& server = r.server;
  cw.Make(2);  // registered, live in every view, nothing declared
  ASSERT_TRUE(w[2]);
  cw.AwaitLive(3);
  r.Restart();
  const absl::Time up = absl::Now() + absl::Seconds(10);
  while (server->Log().find("registered as server 0") == std::string::npos && absl::Now() < up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_THAT(server->Log(), HasSubstr("restored at step 3"));
  cw.Steps({0, 1}, 3);  // from the restored step 3: two pushes a step
  EXPECT_EQ(p[0][0], 12.0f) << server->Log();
  // Once it declared, it takes part.
  cw.Declare(2);
  EXPECT_EQ(p[2][0], 12.0f);
  cw.Steps({0, 1, 2}, 1);
  EXPECT_EQ(p[0][0], 15.0f);
  EXPECT_EQ(p[2][0], 15.0f);
  for (auto& x : w) EXPECT_TRUE(x->Stop().ok());
  server->Signal(SIGTERM);
  EXPECT_EQ(server->WaitExit(absl::Seconds(10)), 0) << server->Log();
}

// A dense pull in flight when its server restarts (a joiner's initial pull in Declare, a
// resynchronization, PullParameters) is asked again of the restarted server, as pushes and
// pulls of a step are. It failed with "server 0 restarted": in grow_under_faults.sh a joiner
// whose server was killed just after its declaration exited 1 (one run in four or five).
TEST(Elastic, ADensePullInFlightWhenItsServerRestartsIsAnsweredByTheRestartedServer) {
  RestartableSumServer r({"--num_servers=1"});
  // The pull is answered once the restarted server registered and restored its checkpoint:
  // over 3 s at load 15 (DEADLINE_EXCEEDED); the defect answered "server 0 restarted" at once.
  r.cw.request_timeout = absl::Minutes(2);
  ASSERT_NO_FATAL_FAILURE(r.StartAndCheckpoint());
  auto& w = r.cw.w;
  auto& server = r.server;
  // The pull reaches a server that does not answer (stopped), which then dies and comes back.
  server->Signal(SIGSTOP);
  // Else, under load, the stopping server may answer the pull itself before it stops, and
  // the SIGTERM below reaches the restarted one before it handles signals (exit 143).
  ASSERT_TRUE(server->WaitStopped(absl::Seconds(10)));
  std::vector<float> got(kCount, -1.0f);
  auto pulled = std::async(std::launch::async,
                           [&] { return w[0]->PullParameters("c", absl::MakeSpan(got)); });
  absl::SleepFor(absl::Milliseconds(300));
  r.Restart();
  const absl::Status st = pulled.get();
  ASSERT_TRUE(st.ok()) << st << "\n" << server->Log();
  EXPECT_EQ(got[0], 6.0f);
  EXPECT_EQ(got[kCount - 1], 6.0f);
  EXPECT_TRUE(w[0]->Stop().ok());
  EXPECT_TRUE(w[1]->Stop().ok());
  server->Signal(SIGTERM);
  EXPECT_EQ(server->WaitExit(absl::Seconds(10)), 0) << server->Log();
}

// A worker tells a restarted server the version it saw of every slice there, also of one
// with no operation in flight, and a restored slice behind it goes on at that version. In
// grow_under_faults.sh (a joiner's steps of two tensors one apart) a worker that had seen a
// tensor's step complete waited on its other tensor, whose step needed the others' next
// step, which waited for that worker's push of the step it had seen complete: every worker
// waited until its retries ran out (about one run in ten). Here no operation is in flight at
// the restart: the old code never told the server, and it stayed at the restored step.
TEST(Elastic, ARestartedServerGoesOnAtTheVersionAnIdleWorkerSaw) {
  RestartableSumServer r({"--num_servers=1"});
  ASSERT_NO_FATAL_FAILURE(r.StartAndCheckpoint());
  auto& cw = r.cw;
  auto& server = r.server;
  cw.Steps({0, 1}, 1);  // both saw version 4; the checkpoint holds 3
  ASSERT_EQ(cw.p[0][0], 8.0f);
  r.Restart();
  const std::string told = "goes on at step 4, not at the restored 3";
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (server->Log().find(told) == std::string::npos && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_THAT(server->Log(), HasSubstr(told));
  cw.Steps({0, 1}, 1);  // from the restored parameters (6), at step 4
  EXPECT_EQ(cw.p[0][0], 8.0f);
  EXPECT_EQ(cw.p[1][kCount - 1], 8.0f);
  for (auto& x : cw.w) {
    if (x) EXPECT_TRUE(x->Stop().ok());
  }
  server->Signal(SIGTERM);
  EXPECT_EQ(server->WaitExit(absl::Seconds(10)), 0) << server->Log();
}

TEST(Elastic, CheckpointWritesTheWorkersResiduesForARestartToLoad) {
  ClusterOptions c;
  c.num_servers = 1;
  c.num_workers = 1;
  const std::string dir = ::adaps::testing::MakeTempDir();  // on this host for both roles
  c.server_args = {"--optimizer=sum", "--checkpoint_dir=" + dir};
  LocalCluster cluster(c);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  WorkerOptions o = Options(cluster.scheduler_address());
  o.identity = "trainer/7";  // not a file name as it is
  auto w = Worker::Create(o);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> p(kBig, 0.0f), g(kBig), held(kBig), back(kBig);
  for (size_t i = 0; i < kBig; ++i) g[i] = Grad(3, 0, i, 0);
  ASSERT_TRUE((*w)->Declare({"a", {static_cast<int64_t>(kBig)}, 100, Compression::kAdaComp},
                            absl::MakeSpan(p))
                  .ok());
  ASSERT_TRUE((*w)->PushPull("a", g, absl::MakeSpan(p)).get().ok());
  ASSERT_TRUE((*w)->Residue("a", absl::MakeSpan(held)).ok());
  absl::Status written = (*w)->Checkpoint(dir);
  ASSERT_TRUE(written.ok()) << written;
  const std::string path = (*w)->ResidueCheckpointPath(dir);
  EXPECT_EQ(path, dir + "/worker-trainer_7.residues");
  ASSERT_TRUE((*w)->SetResidue("a", std::vector<float>(kBig, 0.0f)).ok());
  ASSERT_TRUE((*w)->LoadResidues(path).ok());
  ASSERT_TRUE((*w)->Residue("a", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, held);
  std::vector<float> bad(kBig, 0.0f);
  bad[5] = std::nanf("");
  EXPECT_EQ((*w)->SetResidue("a", bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->SetResidue("a", std::vector<float>(3)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*w)->Residue("a", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, held);  // refused: nothing changed
  EXPECT_TRUE((*w)->Stop().ok());
}

// Run as a child process (the test binary again, with --child_scheduler=ADDR): one AdaComp
// push, prints the L2 norm of its residue, then heartbeats until killed.
TEST(ElasticChild, DISABLED_PushOnceThenWait) {
  std::string scheduler;
  for (const std::string& a : ::testing::internal::GetArgvs()) {
    if (a.rfind("--child_scheduler=", 0) == 0) scheduler = a.substr(18);
  }
  ASSERT_FALSE(scheduler.empty());
  auto w = Worker::Create(Options(scheduler));
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> p(kBig, 0.0f), g(kBig), r(kBig);
  for (size_t i = 0; i < kBig; ++i) g[i] = Grad(9, 0, i, 0);
  ASSERT_TRUE((*w)->Declare({"a", {static_cast<int64_t>(kBig)}, 100, Compression::kAdaComp},
                            absl::MakeSpan(p))
                  .ok());
  ASSERT_TRUE((*w)->PushPull("a", g, absl::MakeSpan(p)).get().ok());
  ASSERT_TRUE((*w)->Residue("a", absl::MakeSpan(r)).ok());
  double sq = 0.0;
  for (float x : r) sq += static_cast<double>(x) * x;
  std::printf("RESIDUE_NORM %.6g\n", std::sqrt(sq));
  std::fflush(stdout);
  absl::SleepFor(absl::Seconds(60));
}

TEST(Elastic, AWorkerThatDiesIsReportedWithTheResidueItTookWithIt) {
  ClusterOptions c;
  c.num_servers = 1;
  c.num_workers = 2;
  c.scheduler_args = {"--dead_timeout_ms=1000", "--log_level=info"};
  c.server_args = {"--optimizer=sum"};
  LocalCluster cluster(c);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  Process child(::testing::internal::GetArgvs()[0],
                {"--gtest_also_run_disabled_tests",
                 "--gtest_filter=ElasticChild.DISABLED_PushOnceThenWait",
                 "--child_scheduler=" + cluster.scheduler_address()},
                cluster.dir() + "/child.log");
  auto w = Worker::Create(Options(cluster.scheduler_address()));
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> p(kBig, 0.0f), g(kBig, 0.0f);
  ASSERT_TRUE((*w)->Declare({"a", {static_cast<int64_t>(kBig)}, 100, Compression::kAdaComp},
                            absl::MakeSpan(p))
                  .ok());
  ASSERT_TRUE((*w)->PushPull("a", g, absl::MakeSpan(p)).get().ok());
  // The child printed its norm; a heartbeat (every 100 ms) reported it.
  std::string printed;
  for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
    const std::string log = child.Log();
    const size_t at = log.find("RESIDUE_NORM ");
    if (at != std::string::npos && log.find('\n', at) != std::string::npos) {
      printed = log.substr(at + 13, log.find('\n', at) - at - 13);
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_FALSE(printed.empty()) << child.Log();
  absl::SleepFor(absl::Milliseconds(400));
  child.Kill();
  const std::string said = "took residues of L2 norm ";
  std::string reported;
  for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
    const std::string log = cluster.scheduler().Log();
    const size_t at = log.find(said);
    if (at != std::string::npos) {
      reported = log.substr(at + said.size(), log.find(' ', at + said.size()) - at - said.size());
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_FALSE(reported.empty()) << cluster.scheduler().Log();
  const double want = std::stod(printed), got = std::stod(reported);
  EXPECT_GT(want, 1.0);
  EXPECT_NEAR(got, want, 1e-4 * want) << "printed " << printed << ", reported " << reported;
  EXPECT_TRUE((*w)->Stop().ok());
}

// The adaps-worker application on SIGTERM (an operator scaling the job in, a launcher
// stopping it) finishes its step, pushes its residues (Worker::Leave) and exits 0; the job
// goes on without it and the scheduler records a leave, not a death with lost residues.
TEST(Elastic, TheWorkerApplicationLeavesOnSigtermWithItsResiduesPushed) {
  ClusterOptions c;
  c.num_servers = 1;
  c.num_workers = 2;
  c.scheduler_args = {"--log_level=info"};
  LocalCluster cluster(c);
  ASSERT_FALSE(cluster.scheduler_address().empty());
  std::vector<std::unique_ptr<Process>> apps;
  for (int i = 0; i < 2; ++i) {
    apps.push_back(std::make_unique<Process>(
        ADAPS_WORKER_BIN,
        std::vector<std::string>{"--scheduler=" + cluster.scheduler_address(),
                                 "--mode=synthetic", "--tensors=200K", "--layers=2",
                                 "--steps=1000000", "--warmup=0", "--backward_ms=10",
                                 "--compressor=adacomp", "--log_level=info",
                                 "--register_timeout_ms=20000",
                                 absl::StrCat("--ready_file=", cluster.dir(), "/w", i, ".ready")},
        absl::StrCat(cluster.dir(), "/w", i, ".log")));
  }
  // Rank 0 prints every step; the other one is sent SIGTERM.
  int leaver = -1;
  for (absl::Time end = absl::Now() + absl::Seconds(20); leaver < 0 && absl::Now() < end;) {
    for (int i = 0; i < 2; ++i) {
      std::FILE* f = std::fopen(absl::StrCat(cluster.dir(), "/w", i, ".ready").c_str(), "r");
      int rank = -1;
      if (f != nullptr) {
        if (std::fscanf(f, "%d", &rank) != 1) rank = -1;
        std::fclose(f);
      }
      if (rank == 1) leaver = i;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GE(leaver, 0) << apps[0]->Log() << apps[1]->Log();
  Process& gone = *apps[leaver];
  Process& stays = *apps[1 - leaver];
  const auto steps_printed = [&] {
    const std::string log = stays.Log();
    int n = 0;
    for (size_t at = log.find("\nstep "); at != std::string::npos; at = log.find("\nstep ", at + 1)) {
      ++n;
    }
    return n;
  };
  for (absl::Time end = absl::Now() + absl::Seconds(20); steps_printed() < 5 && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GE(steps_printed(), 5) << stays.Log();
  gone.Signal(SIGTERM);
  EXPECT_EQ(gone.WaitExit(absl::Seconds(20)), 0) << gone.Log();
  EXPECT_THAT(gone.Log(), HasSubstr("left the job with every residue pushed")) << gone.Log();
  // The job goes on with one worker.
  const int at_leave = steps_printed();
  for (absl::Time end = absl::Now() + absl::Seconds(20);
       steps_printed() < at_leave + 5 && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(steps_printed(), at_leave + 5) << stays.Log();
  EXPECT_THAT(cluster.scheduler().Log(), ::testing::Not(HasSubstr("took residues of L2 norm")));
  stays.Signal(SIGTERM);
  EXPECT_EQ(stays.WaitExit(absl::Seconds(20)), 0) << stays.Log();
  EXPECT_THAT(stays.Log(), HasSubstr("left the job with every residue pushed"));
}

// Workers of the adaps-worker application that join while the first ones are still starting
// (declaring, at their start-up barriers) hold up no barrier: they skip the start-up barriers
// (Worker::rejoined) and the scheduler waits for a joiner only at barriers from the first one
// it calls. Before, the first workers' declaration barriers waited for joiners that never
// came, and the job failed at the barrier deadline.
TEST(Elastic, ApplicationWorkersThatJoinDuringStartUpHoldUpNoBarrier) {
  for (const char* mode : {"synthetic", "train"}) {
    SCOPED_TRACE(mode);
    if (std::string(mode) == "train" &&
        !std::filesystem::exists("/usr/share/datasets/fashion-mnist")) {
      continue;  // Fashion-MNIST is not installed: the synthetic mode alone
    }
    ClusterOptions options = Elastic(2, 4);
    options.server_args = {"--optimizer=sgd"};
    LocalCluster cluster(options);
    ASSERT_FALSE(cluster.scheduler_address().empty());
    std::vector<std::unique_ptr<Process>> apps;
    for (int i = 0; i < 4; ++i) {
      std::vector<std::string> args = {"--scheduler=" + cluster.scheduler_address(),
                                       std::string("--mode=") + mode, "--compressor=adacomp",
                                       "--log_level=warn", "--register_timeout_ms=15000",
                                       "--request_timeout_ms=15000"};
      if (std::string(mode) == "synthetic") {
        args.insert(args.end(), {"--tensors=200K", "--layers=3", "--steps=20", "--warmup=0"});
      } else {
        args.insert(args.end(), {"--model=mlp", "--max_steps=30", "--train_limit=4000",
                                 "--test_limit=500"});
      }
      apps.push_back(std::make_unique<Process>(ADAPS_WORKER_BIN, args,
                                               absl::StrCat(cluster.dir(), "/w", i, ".log")));
    }
    for (auto& app : apps) EXPECT_EQ(app->WaitExit(absl::Seconds(60)), 0) << app->Log();
  }
}

}  // namespace
}  // namespace adaps
