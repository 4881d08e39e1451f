#include "worker/app/trainer/sharding.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace adaps::trainer {
namespace {

void ExpectDisjointAndComplete(size_t n, int workers, size_t limit) {
  auto shards = ShardIndices(n, workers, 42, limit);
  ASSERT_TRUE(shards.ok()) << shards.status();
  ASSERT_EQ(shards->size(), static_cast<size_t>(workers));
  const size_t expected = (limit > 0 && limit < n) ? limit : n;
  std::vector<int> seen(n, 0);
  size_t total = 0, smallest = n, largest = 0;
  for (const auto& s : *shards) {
    total += s.size();
    smallest = std::min(smallest, s.size());
    largest = std::max(largest, s.size());
    for (uint32_t i : s) {
      ASSERT_LT(i, n);
      ++seen[i];
    }
  }
  EXPECT_EQ(total, expected);
  EXPECT_LE(largest - smallest, 1u);
  EXPECT_EQ(static_cast<size_t>(std::count(seen.begin(), seen.end(), 1)), expected);
  EXPECT_EQ(std::count_if(seen.begin(), seen.end(), [](int c) { return c > 1; }), 0);
}

TEST(ShardIndices, SplitsTheTrainingSetDisjointlyAndCompletely) {
  ExpectDisjointAndComplete(60000, 4, 0);
  ExpectDisjointAndComplete(60000, 8, 0);
  ExpectDisjointAndComplete(1003, 7, 0);
}

TEST(ShardIndices, SplitsASubsetDisjointly) { ExpectDisjointAndComplete(60000, 8, 10000); }

TEST(ShardIndices, IsDeterministicInTheSeed) {
  EXPECT_EQ(*ShardIndices(100, 3, 5), *ShardIndices(100, 3, 5));
  EXPECT_NE(*ShardIndices(100, 3, 5), *ShardIndices(100, 3, 6));
}

TEST(ShardIndices, RejectsBadWorkerCounts) {
  EXPECT_EQ(ShardIndices(10, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardIndices(3, 4, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardSampler, ShufflesTheShareDifferentlyEachEpoch) {
  std::vector<uint32_t> shard(500);
  for (uint32_t i = 0; i < shard.size(); ++i) shard[i] = 3 * i;
  ShardSampler sampler(shard, 7, 1);
  const auto e0 = sampler.EpochOrder(0);
  const auto e1 = sampler.EpochOrder(1);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, sampler.EpochOrder(0));
  auto sorted = e1;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, shard);
}

}  // namespace
}  // namespace adaps::trainer
