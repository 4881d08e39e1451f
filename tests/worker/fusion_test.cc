// Fusion of small tensors (worker/fusion.h) against an in-process cluster (a Scheduler, two
// Servers with momentum SGD, one Worker over inproc://): a fused run is bit for bit the
// unfused one (fusion_threshold_bytes 0), a step is one push message for all the small
// tensors, and misuse (a member given twice, a bucket left incomplete) fails cleanly.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adaps/worker.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "tests/common/metrics_http.h"
#include "tests/worker/inproc_cluster.h"

namespace adaps {
namespace {

constexpr int kServers = 2;

struct Member {
  std::string name;
  int64_t length;
  uint32_t bin;
  Compression compression;
};

// Three AdaComp members with different bin sizes, a dense one, and one above the threshold.
const std::vector<Member> kMembers = {{"fc.w", 300, 50, Compression::kAdaComp},
                                      {"fc.b", 10, 500, Compression::kAdaComp},
                                      {"conv.w", 120, 50, Compression::kAdaComp},
                                      {"bn", 6, 50, Compression::kDense},
                                      {"big", 20000, 500, Compression::kAdaComp}};

class Cluster {
 public:
  absl::Status Start(uint64_t fusion_threshold, PullFormat pull,
                     absl::Duration timeout = absl::Seconds(10),
                     const std::vector<Member>& members = kMembers,
                     const std::vector<std::string>& unfused = {}) {
    members_ = members;
    testing::InprocServersOptions o;
    o.servers = kServers;
    o.optimizer.kind = OptimizerKind::kMomentum;
    o.optimizer.learning_rate = 0.1f;
    o.optimizer.momentum = 0.9f;
    for (int s = 0; s < kServers; ++s) {
      MetricsOptions mo;
      mo.port = 0;
      mo.host = "127.0.0.1";
      mo.role = "server";
      mo.rank = s;
      ADAPS_ASSIGN_OR_RETURN(std::unique_ptr<Metrics> m, Metrics::Create(mo));
      metrics_.push_back(std::move(m));
      o.metrics.push_back(metrics_.back().get());
    }
    ADAPS_RETURN_IF_ERROR(cluster_.Start(o));
    WorkerOptions wo;
    wo.scheduler = testing::InprocServers::kScheduler;
    wo.context = cluster_.context();
    wo.request_timeout = timeout;
    wo.log_level = "error";
    wo.fusion_threshold_bytes = fusion_threshold;
    auto worker = Worker::Create(wo);
    ADAPS_RETURN_IF_ERROR(cluster_.JoinServers());
    ADAPS_RETURN_IF_ERROR(worker.status());
    worker_ = *std::move(worker);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    for (const Member& m : members_) {
      std::vector<float> init(m.length);
      for (float& x : init) x = normal(rng);
      const bool fuse = std::find(unfused.begin(), unfused.end(), m.name) == unfused.end();
      ADAPS_RETURN_IF_ERROR(
          worker_->Declare({m.name, {m.length}, m.bin, m.compression, 0.01, pull, fuse},
                           absl::MakeSpan(init)));
      params_[m.name] = init;
    }
    return absl::OkStatus();
  }

  ~Cluster() {
    if (worker_) {
      EXPECT_TRUE(worker_->Stop().ok());
    }
  }

  // One PushPull of every member (all in flight at once), gradients from `rng`.
  absl::Status Step(std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 0.1f);
    std::map<std::string, std::vector<float>> grads;
    std::vector<std::future<absl::Status>> futures;
    for (const Member& m : members_) {
      std::vector<float>& g = grads[m.name];
      g.resize(m.length);
      for (float& x : g) x = normal(rng);
      futures.push_back(worker_->PushPull(m.name, g, absl::MakeSpan(params_[m.name])));
    }
    absl::Status status;
    for (auto& f : futures) status.Update(f.get());
    return status;
  }

  // The sum over the servers of counter `name`.
  double ServerSum(absl::string_view name) {
    double sum = 0;
    for (auto& m : metrics_) sum += testing::MetricValue(testing::ScrapeMetrics(m->port()), name);
    return sum;
  }
  double Pushes() { return ServerSum("adaps_server_pushes_total"); }

  Worker& worker() { return *worker_; }
  const std::vector<float>& params(const std::string& name) { return params_[name]; }

 private:
  std::vector<std::unique_ptr<Metrics>> metrics_;  // outlive the servers
  testing::InprocServers cluster_;  // waits for the scheduler and servers to end last
  std::unique_ptr<Worker> worker_;
  std::map<std::string, std::vector<float>> params_;
  std::vector<Member> members_;
};

void ExpectFusedRunIsTheUnfusedOne(PullFormat pull) {
  std::map<std::string, std::vector<float>> reference;
  std::vector<TrafficCounters> traffic[2];
  for (uint64_t threshold : {uint64_t{0}, uint64_t{64 * 1024}}) {
    Cluster c;
    ASSERT_TRUE(c.Start(threshold, pull).ok());
    std::mt19937 rng(5);
    for (int step = 0; step < 40; ++step) ASSERT_TRUE(c.Step(rng).ok()) << step;
    for (const Member& m : kMembers) {
      if (threshold == 0) {
        reference[m.name] = c.params(m.name);
        continue;
      }
      const std::vector<float>& got = c.params(m.name);
      ASSERT_EQ(got.size(), reference[m.name].size());
      EXPECT_EQ(0, std::memcmp(got.data(), reference[m.name].data(), got.size() * sizeof(float)))
          << m.name;
      auto t = c.worker().Traffic(m.name);
      ASSERT_TRUE(t.ok());
      EXPECT_EQ(t->pushes, 40u);
      EXPECT_EQ(t->pulls, 40u);
      EXPECT_EQ(t->push_dense_bytes, 40u * 4 * m.length);
    }
  }
}

TEST(Fusion, AFusedRunIsBitForBitTheUnfusedRun) { ExpectFusedRunIsTheUnfusedOne(PullFormat::kDense); }

TEST(Fusion, AFusedRunWithRecompressedPullsIsBitForBitTheUnfusedRun) {
  ExpectFusedRunIsTheUnfusedOne(PullFormat::kRecompressed);
}

TEST(Fusion, SendsOnePushPerStepForAllSmallTensors) {
  for (uint64_t threshold : {uint64_t{0}, uint64_t{64 * 1024}}) {
    Cluster c;
    ASSERT_TRUE(c.Start(threshold, PullFormat::kDense).ok());
    const double before = c.Pushes();
    std::mt19937 rng(5);
    for (int step = 0; step < 10; ++step) ASSERT_TRUE(c.Step(rng).ok());
    // "big" is one slice (under the split threshold); the four small ones are one bucket.
    const double per_step = threshold == 0 ? 1 + 4 : 1 + 1;
    EXPECT_EQ(c.Pushes() - before, 10 * per_step) << "threshold " << threshold;
    // The small members' pushes show no rate below 1 (the header is shared).
    if (threshold != 0) {
      for (const char* name : {"fc.w", "fc.b", "conv.w"}) {
        auto t = c.worker().Traffic(name);
        ASSERT_TRUE(t.ok());
        EXPECT_LT(t->push_wire_bytes, t->push_dense_bytes) << name;
      }
    }
  }
}

// Each member's declaration pulls its own elements, not the whole bucket so far: declaring
// k small tensors costs their bytes once, not k^2 / 2 of them (which at 16 workers behind a
// 1 Mbit/s link took minutes before the first step). A fused run with replica-keeping pulls
// is bit for bit the unfused one (above), so the replica pieced together from the members'
// pulls is the server's.
TEST(Fusion, DeclaringSmallTensorsPullsEachMembersElementsOnce) {
  for (PullFormat pull : {PullFormat::kDense, PullFormat::kRecompressed}) {
    std::vector<Member> members;
    int64_t elements = 0;
    for (int i = 0; i < 60; ++i) {
      members.push_back({absl::StrCat("t", i), 200 + i, 50, Compression::kAdaComp});
      elements += members.back().length;
    }
    Cluster c;
    ASSERT_TRUE(c.Start(64 * 1024, pull, absl::Seconds(10), members).ok());
    const double answered = c.ServerSum("adaps_server_pull_answer_bytes_total");
    // The members' elements once, and a header of at most 200 bytes per member.
    EXPECT_GT(answered, 0);
    EXPECT_LE(answered, 4.0 * elements + 200.0 * members.size())
        << "pull format " << static_cast<int>(pull);
    std::mt19937 rng(5);
    for (int step = 0; step < 3; ++step) ASSERT_TRUE(c.Step(rng).ok());
  }
}

// A member of two floats: its AdaComp encoding (14 bytes) is larger than its dense one (13),
// so every step it is sent dense with all its residue, which stays zero: exactly what a
// dense tensor of its own would do.
TEST(Fusion, AMemberWhoseEncodingWouldExceedItsDenseBytesIsSentDenseWithItsResidue) {
  std::vector<float> fused, dense;
  uint64_t fused_wire = 0, dense_wire = 0;
  for (Compression tiny : {Compression::kDense, Compression::kAdaComp}) {
    Cluster c;
    const std::vector<Member> members = {{"tiny", 2, 500, tiny},
                                         {"fc.b", 10, 500, Compression::kAdaComp}};
    ASSERT_TRUE(c.Start(tiny == Compression::kDense ? 0 : 64 * 1024, PullFormat::kDense,
                        absl::Seconds(10), members)
                    .ok());
    std::mt19937 rng(5);
    for (int step = 0; step < 20; ++step) ASSERT_TRUE(c.Step(rng).ok());
    (tiny == Compression::kDense ? dense : fused) = c.params("tiny");
    auto t = c.worker().Traffic("tiny");
    ASSERT_TRUE(t.ok());
    (tiny == Compression::kDense ? dense_wire : fused_wire) = t->push_wire_bytes;
  }
  // Its dense segment and a share of the bucket's envelope cost less than its own message.
  EXPECT_LT(fused_wire, dense_wire);
  ASSERT_EQ(fused.size(), 2u);
  EXPECT_EQ(0, std::memcmp(fused.data(), dense.data(), 2 * sizeof(float)));
}

TEST(Fusion, AMemberGivenTwiceBeforeTheBucketIsCompleteFailsCleanly) {
  Cluster c;
  ASSERT_TRUE(c.Start(64 * 1024, PullFormat::kDense).ok());
  std::vector<float> g(10, 0.5f), out(10);
  auto first = c.worker().PushPull("fc.b", g, absl::MakeSpan(out));
  auto second = c.worker().PushPull("fc.b", g, absl::MakeSpan(out));
  EXPECT_EQ(second.get().code(), absl::StatusCode::kFailedPrecondition);
  // A Push of another member in a PushPull step is refused too.
  std::vector<float> g2(300, 0.5f);
  EXPECT_EQ(c.worker().Push("fc.w", g2).get().code(), absl::StatusCode::kFailedPrecondition);
  // The step still completes once every member was given.
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> bufs;
  std::vector<std::future<absl::Status>> rest;
  for (const Member& m : kMembers) {
    if (m.name == "fc.b") continue;
    bufs.emplace_back(m.length, 0.1f);
    rest.push_back(c.worker().PushPull(m.name, bufs.back(), absl::MakeSpan(bufs.back())));
  }
  EXPECT_TRUE(first.get().ok());
  for (auto& f : rest) EXPECT_TRUE(f.get().ok());
}

TEST(Fusion, ABucketLeftIncompleteFailsItsMembersAfterTheRequestTimeout) {
  Cluster c;
  ASSERT_TRUE(c.Start(64 * 1024, PullFormat::kDense, absl::Milliseconds(600)).ok());
  std::vector<float> g(10, 0.5f), out(10, 7.0f);
  auto f = c.worker().PushPull("fc.b", g, absl::MakeSpan(out));
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const absl::Status st = f.get();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("fc.w"), absl::string_view::npos) << st;
  EXPECT_EQ(out[0], 7.0f);
}

TEST(Fusion, ATensorDeclaredWithFuseFalseStaysOutOfTheBucketsAndNeedNotBeGiven) {
  Cluster c;
  ASSERT_TRUE(c.Start(64 * 1024, PullFormat::kDense).ok());
  std::vector<float> v(4, 3.0f);
  TensorSpec spec{"broadcast", {4}, 500, Compression::kDense};
  spec.fuse = false;
  ASSERT_TRUE(c.worker().Declare(spec, absl::MakeSpan(v)).ok());
  std::mt19937 rng(5);
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(c.Step(rng).ok());  // never gives it
  auto t = c.worker().Traffic("broadcast");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->pushes, 0u);
}

TEST(Fusion, TensorNamesAndSlicesShowTheMembers) {
  Cluster c;
  ASSERT_TRUE(c.Start(64 * 1024, PullFormat::kDense).ok());
  std::vector<std::string> names = c.worker().TensorNames();
  EXPECT_EQ(names.size(), kMembers.size());
  for (const std::string& n : names) EXPECT_EQ(n.find("adaps.fusion"), std::string::npos);
  auto slices = c.worker().Slices("fc.b");
  ASSERT_TRUE(slices.ok());
  ASSERT_EQ(slices->size(), 1u);
  EXPECT_EQ((*slices)[0].length, 10u);
  std::vector<float> v(4);
  EXPECT_EQ(c.worker().Declare({"adaps.fusion/9", {4}}, absl::MakeSpan(v)).code(),
            absl::StatusCode::kInvalidArgument);
}

// The servers' parameters do not depend on the pull format (the pushes do not), so a run
// with recompressed pulls must get from PullParameters exactly what a run with dense pulls
// gets from PushPull, for fused members, a tensor of one slice and one of several; its
// replica (what PushPull wrote) trails them, and the steps after go on from the replica.
TEST(Fusion, PullParametersGivesTheServersExactParametersBehindRecompressedPulls) {
  std::vector<Member> members = kMembers;
  members.push_back({"huge", 150000, 500, Compression::kAdaComp});  // > split threshold
  std::map<std::string, std::vector<float>> exact;
  for (PullFormat pull : {PullFormat::kDense, PullFormat::kRecompressed}) {
    Cluster c;
    ASSERT_TRUE(c.Start(64 * 1024, pull, absl::Seconds(10), members).ok());
    ASSERT_GE(c.worker().Slices("huge")->size(), 2u);
    std::mt19937 rng(5);
    for (int step = 0; step < 20; ++step) ASSERT_TRUE(c.Step(rng).ok()) << step;
    if (pull == PullFormat::kDense) {
      for (const Member& m : members) exact[m.name] = c.params(m.name);
      continue;
    }
    int trailing = 0;
    for (const Member& m : members) {
      std::vector<float> got(m.length, -1.0f);
      ASSERT_TRUE(c.worker().PullParameters(m.name, absl::MakeSpan(got)).ok()) << m.name;
      EXPECT_EQ(0, std::memcmp(got.data(), exact[m.name].data(), got.size() * sizeof(float)))
          << m.name;
      if (c.params(m.name) != got) ++trailing;
    }
    EXPECT_GE(trailing, 3) << "the recompressed replicas should trail the servers";
    std::vector<float> wrong(7);
    EXPECT_EQ(c.worker().PullParameters("fc.w", absl::MakeSpan(wrong)).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.worker().PullParameters("nope", absl::MakeSpan(wrong)).code(),
              absl::StatusCode::kInvalidArgument);
    for (int step = 0; step < 3; ++step) ASSERT_TRUE(c.Step(rng).ok()) << "after, " << step;
    auto t = c.worker().Traffic("huge");
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->pulls, 23u);
    EXPECT_EQ(t->pull_dense_bytes, 24u * 4 * 150000);  // 23 pulls and the parameter pull
  }
}

// LastSent: AdaComp's selection (one dominant element a bin, from a zero residue), for a
// fused member and a tensor of its own, every element of a dense member; empty before the
// first push.
TEST(Fusion, LastSentIsWhatTheLastPushSent) {
  const std::vector<Member> members = {{"a", 40, 4, Compression::kAdaComp},
                                       {"d", 8, 4, Compression::kDense},
                                       {"big", 150000, 500, Compression::kAdaComp}};
  Cluster c;
  ASSERT_TRUE(c.Start(64 * 1024, PullFormat::kDense, absl::Seconds(10), members).ok());
  ASSERT_GE(c.worker().Slices("big")->size(), 2u);  // the slices' offsets count
  std::map<std::string, std::vector<uint32_t>> expect;
  std::map<std::string, std::vector<float>> grads, out;
  for (const Member& m : members) {
    auto before = c.worker().LastSent(m.name);
    ASSERT_TRUE(before.ok());
    EXPECT_TRUE(before->empty()) << m.name;
    std::vector<float>& g = grads[m.name];
    g.assign(m.length, 0.01f);
    out[m.name].resize(m.length);
    for (uint32_t k = 0; k * m.bin < m.length; ++k) {  // (every length is whole bins)
      const uint32_t i = k * m.bin + (k * 7) % m.bin;
      g.at(i) = (k % 2 ? -5.0f : 5.0f);
      if (m.compression == Compression::kAdaComp) expect[m.name].push_back(i);
    }
    if (m.compression == Compression::kDense) {
      for (uint32_t i = 0; i < m.length; ++i) expect[m.name].push_back(i);
    }
  }
  std::vector<std::future<absl::Status>> futures;
  for (const Member& m : members) {
    futures.push_back(c.worker().PushPull(m.name, grads[m.name], absl::MakeSpan(out[m.name])));
  }
  for (auto& f : futures) ASSERT_TRUE(f.get().ok());
  for (const Member& m : members) {
    auto sent = c.worker().LastSent(m.name);
    ASSERT_TRUE(sent.ok());
    EXPECT_EQ(*sent, expect[m.name]) << m.name;
  }
  EXPECT_EQ(c.worker().LastSent("nope").status().code(), absl::StatusCode::kInvalidArgument);
}

// SetBinSize: the next push bins at the new size (one dominant element in every 20 is all
// that a bin of 20 sends; at the declared bin of 4 the bins without one send their ties
// too), for a tensor of its own (several slices), an unfused small one and a fused member
// (its bucket's pushes carry its new bin size; the server takes them), and a refused call
// changes nothing.
TEST(Fusion, SetBinSizeChangesTheBinsOfTheNextPush) {
  const std::vector<Member> members = {{"a", 40, 4, Compression::kAdaComp},
                                       {"d", 8, 4, Compression::kDense},
                                       {"big", 160000, 4, Compression::kAdaComp},
                                       {"f", 40, 4, Compression::kAdaComp}};
  Cluster c;
  ASSERT_TRUE(c.Start(64 * 1024, PullFormat::kDense, absl::Seconds(10), members,
                      /*unfused=*/{"a"}).ok());
  ASSERT_GE(c.worker().Slices("big")->size(), 2u);  // (bins start at each slice's offset)
  EXPECT_EQ(c.worker().SetBinSize("d", 20).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.worker().SetBinSize("nope", 20).code(), absl::StatusCode::kInvalidArgument);
  for (const char* name : {"a", "big", "f"}) {
    ASSERT_TRUE(c.worker().SetBinSize(name, 20).ok()) << name;
    EXPECT_EQ(c.worker().SetBinSize(name, 0).code(), absl::StatusCode::kInvalidArgument);
  }
  std::map<std::string, std::vector<uint32_t>> expect;
  std::map<std::string, std::vector<float>> grads, out;
  for (const Member& m : members) {
    std::vector<float>& g = grads[m.name];
    g.assign(m.length, 0.01f);
    out[m.name].resize(m.length);
    std::vector<SliceInfo> slices = {SliceInfo{0, static_cast<uint32_t>(m.length), 0}};
    if (m.name == "big") slices = *c.worker().Slices("big");
    for (const SliceInfo& s : slices) {
      for (uint32_t k = 0; k * 20 < s.length; ++k) {
        const uint32_t i = s.offset + k * 20 + (k * 7) % std::min<uint32_t>(20, s.length - k * 20);
        g[i] = (k % 2 ? -5.0f : 5.0f);
        expect[m.name].push_back(i);
      }
    }
  }
  std::vector<std::future<absl::Status>> futures;
  for (const Member& m : members) {
    futures.push_back(c.worker().PushPull(m.name, grads[m.name], absl::MakeSpan(out[m.name])));
  }
  for (auto& f : futures) { absl::Status st = f.get(); ASSERT_TRUE(st.ok()) << st; }
  for (const char* name : {"a", "big", "f"}) {
    auto sent = c.worker().LastSent(name);
    ASSERT_TRUE(sent.ok());
    EXPECT_EQ(*sent, expect[name]) << name;
  }
  // Back to the declared size: the ties of the bins without a dominant element go too.
  ASSERT_TRUE(c.worker().SetBinSize("a", 4).ok());
  grads["a"].assign(40, 0.01f);
  futures.clear();
  for (const Member& m : members) {  // (a bucket waits for all its members)
    futures.push_back(c.worker().PushPull(m.name, grads[m.name], absl::MakeSpan(out[m.name])));
  }
  for (auto& f : futures) ASSERT_TRUE(f.get().ok());
  auto sent = c.worker().LastSent("a");
  ASSERT_TRUE(sent.ok());
  EXPECT_GT(sent->size(), expect["a"].size());
}

}  // namespace
}  // namespace adaps
