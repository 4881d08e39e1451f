#include "worker/app/trainer/simulated_cluster.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace adaps::trainer {
namespace {

std::vector<ParamTensor> Tensors() {
  ParamTensor w;
  w.name = "fc.weight";
  w.kind = LayerKind::kFullyConnected;
  w.shape = {1000};
  w.value.assign(1000, 1.0f);
  w.grad.assign(1000, 0.0f);
  ParamTensor b;
  b.name = "fc.bias";
  b.kind = LayerKind::kBias;
  b.shape = {4};
  b.value.assign(4, 0.0f);
  b.grad.assign(4, 0.0f);
  return {w, b};
}

// Runs one exchange of step `step` on every worker, worker w pushing gradient value w+1.
std::vector<absl::Status> ExchangeAll(SimulatedCluster& cluster,
                                      std::vector<std::vector<ParamTensor>>& replicas,
                                      int64_t step) {
  std::vector<absl::Status> results(replicas.size());
  std::vector<std::thread> threads;
  for (size_t w = 0; w < replicas.size(); ++w) {
    threads.emplace_back([&, w] {
      for (ParamTensor& p : replicas[w]) p.grad.assign(p.size(), static_cast<float>(w + 1));
      results[w] = cluster.endpoint(static_cast<int>(w))->Exchange(step, replicas[w]);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(SimulatedCluster, DenseAveragesTheWorkersAndAppliesSgd) {
  SimulationOptions o;
  o.workers = 3;
  o.compression.kind = CompressorKind::kDense;
  o.learning_rate = 0.5f;
  o.momentum = 0.0f;
  auto cluster = SimulatedCluster::Create(o, Tensors());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::vector<ParamTensor>> replicas(3, Tensors());
  for (const absl::Status& s : ExchangeAll(**cluster, replicas, 0)) ASSERT_TRUE(s.ok()) << s;
  // Mean gradient (1 + 2 + 3) / 3 = 2; 1 - 0.5 * 2 = 0.
  for (const auto& r : replicas) {
    EXPECT_FLOAT_EQ(r[0].value[17], 0.0f);
    EXPECT_FLOAT_EQ(r[1].value[2], -1.0f);
  }
  const TrafficStats t = (*cluster)->traffic();
  EXPECT_EQ(t.by_kind[static_cast<int>(LayerKind::kFullyConnected)].messages, 3u);
  EXPECT_DOUBLE_EQ(t.Total().rate(), 1.0);
}

TEST(SimulatedCluster, AdaCompSendsFewerBytesAndKeepsBiasesDense) {
  SimulationOptions o;
  o.workers = 2;
  auto cluster = SimulatedCluster::Create(o, Tensors());
  ASSERT_TRUE(cluster.ok());
  EXPECT_EQ((*cluster)->tensor_options()[0].kind, CompressorKind::kAdaComp);
  EXPECT_EQ((*cluster)->tensor_options()[0].bin_size, 500u);
  EXPECT_EQ((*cluster)->tensor_options()[1].kind, CompressorKind::kDense);
  std::vector<std::vector<ParamTensor>> replicas(2, Tensors());
  for (int step = 0; step < 3; ++step) {
    for (const absl::Status& s : ExchangeAll(**cluster, replicas, step)) ASSERT_TRUE(s.ok()) << s;
  }
  const TrafficStats t = (*cluster)->traffic();
  const KindTraffic& fc = t.by_kind[static_cast<int>(LayerKind::kFullyConnected)];
  EXPECT_LT(fc.sent_bytes, fc.dense_bytes);
  EXPECT_EQ(fc.sent_bytes, fc.payload_bytes + fc.messages * kMessageHeaderBytes);
  EXPECT_DOUBLE_EQ(t.by_kind[static_cast<int>(LayerKind::kBias)].rate(), 1.0);
  EXPECT_EQ(replicas[0][0].value, replicas[1][0].value);
}

TEST(SimulatedCluster, RejectsAStepOutOfOrder) {
  SimulationOptions o;
  o.workers = 1;
  auto cluster = SimulatedCluster::Create(o, Tensors());
  ASSERT_TRUE(cluster.ok());
  std::vector<ParamTensor> params = Tensors();
  EXPECT_EQ((*cluster)->endpoint(0)->Exchange(5, params).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SimulatedCluster, RejectsAMismatchedTensorList) {
  SimulationOptions o;
  o.workers = 1;
  auto cluster = SimulatedCluster::Create(o, Tensors());
  ASSERT_TRUE(cluster.ok());
  std::vector<ParamTensor> params = Tensors();
  params.pop_back();
  EXPECT_EQ((*cluster)->endpoint(0)->Exchange(0, params).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SimulatedCluster, GivesUpWhenAWorkerNeverArrives) {
  SimulationOptions o;
  o.workers = 2;
  o.barrier_timeout = absl::Milliseconds(50);
  auto cluster = SimulatedCluster::Create(o, Tensors());
  ASSERT_TRUE(cluster.ok());
  std::vector<ParamTensor> params = Tensors();
  EXPECT_EQ((*cluster)->endpoint(0)->Exchange(0, params).code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace adaps::trainer
