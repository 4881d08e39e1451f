// Sparse pulls (PullFormat::kSparse) against an in-process cluster of two servers and three
// workers: every worker's output is bit for bit the servers' parameters after every step
// (SGD and mean servers, fused and unfused tensors, a tensor split over both servers), the
// servers answer sparse where that is smaller, and a server whose step is dense refuses the
// format at Declare with the reason and the alternatives.
#include <malloc.h>

#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "adaps/worker.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/worker/inproc_cluster.h"

namespace adaps {
namespace {

constexpr int kWorkers = 3;

struct Member {
  std::string name;
  int64_t length;
  uint32_t bin;
  Compression compression;
};

// "big" is above the fusion threshold and split over both servers; the rest share a bucket
// (one of them dense, one too short to compress).
const std::vector<Member> kTensors = {{"big", 40000, 500, Compression::kAdaComp},
                                      {"fc.w", 300, 50, Compression::kAdaComp},
                                      {"fc.b", 2, 500, Compression::kAdaComp},
                                      {"conv.w", 120, 50, Compression::kAdaComp},
                                      {"bn", 6, 50, Compression::kDense}};

WorkerOptions Options(const testing::InprocServers& cluster) {
  WorkerOptions wo;
  wo.scheduler = testing::InprocServers::kScheduler;
  wo.context = cluster.context();
  wo.request_timeout = absl::Seconds(20);
  wo.log_level = "error";
  return wo;
}

// Runs `body(worker)` on kWorkers threads against a fresh cluster with `optimizer`.
void RunCluster(const OptimizerConfig& optimizer, const std::function<void(Worker&)>& body,
                int workers = kWorkers) {
  testing::InprocServers cluster;
  testing::InprocServersOptions o;
  o.servers = 2;
  o.workers = workers;
  o.split_threshold = 30000;
  o.optimizer = optimizer;
  ASSERT_TRUE(cluster.Start(o).ok());
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Worker>> made(workers);
  for (int i = 0; i < workers; ++i) {
    threads.emplace_back([&, i] {
      auto w = Worker::Create(Options(cluster));
      ASSERT_TRUE(w.ok()) << w.status();
      made[i] = *std::move(w);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(cluster.JoinServers().ok());
  threads.clear();
  for (int i = 0; i < workers; ++i) {
    if (made[i] == nullptr) continue;
    threads.emplace_back([&, i] {
      body(*made[i]);
      EXPECT_TRUE(made[i]->Stop().ok());
    });
  }
  for (auto& t : threads) t.join();
}

// kSteps steps of every tensor pulled sparse; after each, every output is compared with
// the servers' exact parameters (PullParameters) bit for bit. `in_place`: every tensor
// declared with TensorSpec::pull_in_place (its output buffer is its replica).
void ExpectOutputsAreTheParameters(const OptimizerConfig& optimizer, bool in_place = false) {
  constexpr int kSteps = 25;
  std::map<std::string, std::vector<float>> first;  // worker rank 0's final outputs
  std::mutex mu;
  std::map<std::string, TrafficCounters> traffic;
  RunCluster(optimizer, [&](Worker& w) {
    std::mt19937 rng(100 + w.rank());
    std::normal_distribution<float> normal(0.0f, 0.1f);
    std::map<std::string, std::vector<float>> out, grad;
    for (const Member& m : kTensors) {
      std::vector<float>& v = out[m.name];
      v.resize(m.length);
      std::mt19937 init_rng(7);
      for (float& x : v) x = normal(init_rng);
      TensorSpec spec{m.name, {m.length}, m.bin, m.compression, 0.01, PullFormat::kSparse};
      spec.pull_in_place = in_place;
      ASSERT_TRUE(w.Declare(spec, absl::MakeSpan(v)).ok());
      grad[m.name].resize(m.length);
    }
    uint64_t wire = 0, dense = 0;  // of the PushPulls of "big" (PullParameters is dense)
    for (int step = 0; step < kSteps; ++step) {
      const TrafficCounters before = *w.Traffic("big");
      std::vector<std::future<absl::Status>> futures;
      for (const Member& m : kTensors) {
        for (float& x : grad[m.name]) x = normal(rng);
        futures.push_back(w.PushPull(m.name, grad[m.name], absl::MakeSpan(out[m.name])));
      }
      for (auto& f : futures) ASSERT_TRUE(f.get().ok()) << step;
      const TrafficCounters after = *w.Traffic("big");
      wire += after.pull_wire_bytes - before.pull_wire_bytes;
      dense += after.pull_dense_bytes - before.pull_dense_bytes;
      for (const Member& m : kTensors) {
        std::vector<float> exact(m.length);
        ASSERT_TRUE(w.PullParameters(m.name, absl::MakeSpan(exact)).ok());
        ASSERT_EQ(0, std::memcmp(exact.data(), out[m.name].data(), exact.size() * sizeof(float)))
            << m.name << " at step " << step << " on worker " << w.rank();
      }
      ASSERT_TRUE(w.Barrier().ok());  // nobody steps on before every check is done
    }
    if (in_place) {  // the replica is that buffer: no other is taken, none pulled into it
      std::vector<float> other(kTensors[0].length);
      const std::vector<float> before = out["big"];
      absl::Status st = w.Pull("big", absl::MakeSpan(other)).get();
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      EXPECT_TRUE(absl::StrContains(st.message(), "pull_in_place")) << st;
      st = w.PullParameters("big", absl::MakeSpan(out["big"]));
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      EXPECT_EQ(out["big"], before);
    }
    std::lock_guard<std::mutex> lock(mu);
    if (w.rank() == 0) {
      first = out;
      for (const Member& m : kTensors) traffic[m.name] = *w.Traffic(m.name);
      traffic["big"].pull_wire_bytes = wire;
      traffic["big"].pull_dense_bytes = dense;
    }
  });
  ASSERT_EQ(first.size(), kTensors.size());
  const TrafficCounters& big = traffic["big"];
  // Every step of each slice is answered sparse, the first too (a slice declared with
  // sparse pulls is tracked from its first step: a dense first answer cost a whole step's
  // dense bytes). A mean step's and an SGD step's smallest exact answer is its pushes
  // forwarded (sign bits against the merged list's 32-bit values), replayed by the worker.
  EXPECT_EQ(big.pulls_answered_forwarded, 2u * kSteps) << "a step was not answered forwarded";
  EXPECT_EQ(big.pulls_answered_sparse + big.pulls_answered_dense, 0u);
  EXPECT_LT(big.pull_wire_bytes * 4, big.pull_dense_bytes) << "pulls were not sparse";
  EXPECT_GT(traffic["fc.w"].pulls_answered_forwarded, 0u) << "the bucket was not forwarded";
}

TEST(SparsePulls, EveryOutputIsBitForBitTheSgdServersParametersAfterEveryStep) {
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.learning_rate = 0.1f;
  sgd.weight_decay = 0.0f;
  ExpectOutputsAreTheParameters(sgd);
}

TEST(SparsePulls, EveryOutputIsBitForBitTheMeanServersMeanAfterEveryStep) {
  OptimizerConfig mean;
  mean.kind = OptimizerKind::kMean;
  ExpectOutputsAreTheParameters(mean);
}

// TensorSpec::pull_in_place: the answers are applied to the caller's buffer itself (no
// replica of the worker's own, no copy): the same bits after every step.
TEST(SparsePulls, InPlaceOutputsAreBitForBitTheServersParametersAfterEveryStep) {
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.learning_rate = 0.1f;
  sgd.weight_decay = 0.0f;
  ExpectOutputsAreTheParameters(sgd, /*in_place=*/true);
  OptimizerConfig mean;
  mean.kind = OptimizerKind::kMean;
  ExpectOutputsAreTheParameters(mean, /*in_place=*/true);
}

void ExpectDeclareRefused(const OptimizerConfig& optimizer, const std::string& reason) {
  RunCluster(
      optimizer,
      [&](Worker& w) {
        for (const Member& m : {kTensors[0], kTensors[1]}) {  // a split tensor, a fused one
          std::vector<float> v(m.length, 0.0f);
          absl::Status st = w.Declare(
              {m.name, {m.length}, m.bin, m.compression, 0.01, PullFormat::kSparse},
              absl::MakeSpan(v));
          EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << m.name << ": " << st;
          EXPECT_TRUE(absl::StrContains(st.message(), reason)) << st;
          EXPECT_TRUE(absl::StrContains(st.message(), "pull=dense")) << st;
          EXPECT_TRUE(absl::StrContains(st.message(), "pull=recompressed")) << st;
        }
      },
      1);
}

TEST(SparsePulls, DeclareIsRefusedWithTheReasonWhenTheServersStepIsDense) {
  OptimizerConfig momentum;
  momentum.kind = OptimizerKind::kMomentum;
  ExpectDeclareRefused(momentum, "momentum");
  OptimizerConfig adam;
  adam.kind = OptimizerKind::kAdam;
  ExpectDeclareRefused(adam, "Adam");
  OptimizerConfig decayed;
  decayed.kind = OptimizerKind::kSgd;
  decayed.weight_decay = 0.01f;
  ExpectDeclareRefused(decayed, "weight_decay");
}

// A worker whose replica fell behind the servers' published state (it pushed for a few steps
// without pulling; or it joined, or its pull of a fused bucket was retried after a server
// restart, while the others stepped on) asks for a recompressed change the server no longer
// has. It takes the published replica again and pulls once more, as after a restart, rather
// than failing the step ("the server can only send the change from version ..."); then its
// outputs are the same bits as a worker that pulled every step.
TEST(RecompressedPulls, AWorkerWhoseReplicaFellBehindResynchronizesInsteadOfFailing) {
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.learning_rate = 0.1f;
  sgd.weight_decay = 0.0f;
  constexpr int kPushOnly = 4, kSteps = 8;
  std::mutex mu;
  std::map<int, std::map<std::string, std::vector<float>>> final_out;
  RunCluster(
      sgd,
      [&](Worker& w) {
        std::mt19937 rng(100 + w.rank());
        std::normal_distribution<float> normal(0.0f, 0.1f);
        std::map<std::string, std::vector<float>> out, grad;
        for (const Member& m : kTensors) {
          std::vector<float>& v = out[m.name];
          v.assign(m.length, 0.5f);
          ASSERT_TRUE(w.Declare({m.name, {m.length}, m.bin, m.compression, 0.01,
                                 PullFormat::kRecompressed},
                                absl::MakeSpan(v))
                          .ok());
          grad[m.name].resize(m.length);
        }
        for (int step = 0; step < kSteps; ++step) {
          const bool pull = w.rank() == 0 || step >= kPushOnly;
          std::vector<std::future<absl::Status>> futures;
          for (const Member& m : kTensors) {
            for (float& x : grad[m.name]) x = normal(rng);
            futures.push_back(pull ? w.PushPull(m.name, grad[m.name], absl::MakeSpan(out[m.name]))
                                   : w.Push(m.name, grad[m.name]));
          }
          for (size_t k = 0; k < futures.size(); ++k) {
            absl::Status st = futures[k].get();
            ASSERT_TRUE(st.ok()) << kTensors[k].name << " at step " << step << " on worker "
                                 << w.rank() << ": " << st;
          }
          // A push alone does not wait for the step: the next is sent once it completed.
          ASSERT_TRUE(w.Barrier().ok());
        }
        std::lock_guard<std::mutex> lock(mu);
        final_out[w.rank()] = out;
      },
      2);
  ASSERT_EQ(final_out.size(), 2u);
  for (const Member& m : kTensors) {
    const std::vector<float>& a = final_out[0][m.name];
    const std::vector<float>& b = final_out[1][m.name];
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << m.name;
  }
}

// Bytes allocated (and not freed) in this process, from malloc's own count.
size_t LiveHeapBytes() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

// How much a declaration of `length` floats pulled `pull` left allocated in the process
// (the in-process servers' part included: theirs is the same for both formats here).
size_t DeclaredBytes(PullFormat pull, int64_t length) {
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.weight_decay = 0.0f;
  size_t grown = 0;
  RunCluster(
      sgd,
      [&](Worker& w) {
        std::vector<float> v(length, 0.5f);
        const size_t before = LiveHeapBytes();
        ASSERT_TRUE(w.Declare({"t", {length}, 500, Compression::kAdaComp, 0.01, pull},
                              absl::MakeSpan(v))
                        .ok());
        grown = LiveHeapBytes() - before;
      },
      1);
  return grown;
}

// A dense pull answers the whole value: the worker keeps no replica of the tensor (a copy
// of the model that nothing read, before); a sparse one keeps the replica its answers
// change. (Measured: with the replica the dense declaration left half a tensor more than
// the sparse one, without it half a tensor less.)
TEST(SparsePulls, ATensorWithDensePullsKeepsNoReplica) {
  constexpr int64_t kLength = 4 << 20;  // 16 MiB of floats
  const size_t bytes = kLength * sizeof(float);
  {
    const size_t before = LiveHeapBytes();
    std::vector<float> probe(kLength, 1.0f);
    if (LiveHeapBytes() - before < bytes) {
      GTEST_SKIP() << "glibc's heap statistics do not see this allocator (a sanitizer's)";
    }
  }
  const size_t dense = DeclaredBytes(PullFormat::kDense, kLength);
  const size_t sparse = DeclaredBytes(PullFormat::kSparse, kLength);
  EXPECT_GT(sparse, dense + bytes / 4) << "dense " << dense << ", sparse " << sparse;
}

}  // namespace
}  // namespace adaps
