#include <numeric>

#include "gtest/gtest.h"
#include "scheduler/scheduler.h"

namespace adaps {
namespace {

TEST(SplitTensor, LargeTensorIsSplitAtBinMultiplesOverEveryServer) {
  std::vector<uint64_t> load(3, 0);
  auto slices = SplitTensor(100'003, 50, 1000, load);
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 3u);
  uint64_t covered = 0;
  std::vector<int> servers;
  for (const auto& s : *slices) {
    EXPECT_EQ(s.offset, covered);
    EXPECT_EQ(s.offset % 50, 0u);
    covered += s.length;
    servers.push_back(s.server);
  }
  EXPECT_EQ(covered, 100'003u);
  std::sort(servers.begin(), servers.end());
  EXPECT_EQ(servers, (std::vector<int>{0, 1, 2}));
  const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
  EXPECT_LE(*hi - *lo, 50u * sizeof(float));
}

TEST(SplitTensor, SmallTensorsGoWholeToTheLeastLoadedServer) {
  std::vector<uint64_t> load = {400, 0};
  auto first = SplitTensor(100, 50, 1000, load);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->size(), 1u);
  EXPECT_EQ((*first)[0].server, 1);
  EXPECT_EQ(load[1], 400u);
  auto second = SplitTensor(10, 50, 1000, load);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)[0].server, 0);  // tie: the lower rank
}

TEST(SplitTensor, NoMoreSlicesThanBins) {
  std::vector<uint64_t> load(4, 0);
  auto slices = SplitTensor(120, 50, 1, load);
  ASSERT_TRUE(slices.ok());
  EXPECT_EQ(slices->size(), 3u);
}

TEST(SplitTensor, ZeroLengthOrBinIsInvalid) {
  std::vector<uint64_t> load(2, 0);
  EXPECT_EQ(SplitTensor(0, 50, 1, load).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitTensor(10, 0, 1, load).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace adaps
