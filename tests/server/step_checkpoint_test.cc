// The pure parts of step checkpoints (server/checkpoint.h): file names, listing, pruning,
// removing a past the server no longer has; and the latest step every server has
// (common/step_checkpoint.h).
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/step_checkpoint.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"

namespace adaps {
namespace {

std::string TempDir() {
  std::string dir = "/tmp/adaps-step-XXXXXX";
  EXPECT_NE(::mkdtemp(dir.data()), nullptr);
  return dir;
}

void Touch(const std::string& path) { std::ofstream(path) << "x"; }

TEST(StepCheckpoint, TheLatestCommonStepIsTheNewestInEveryList) {
  EXPECT_EQ(LatestCommonStep({{10, 20, 30}, {10, 20}, {20, 30, 40}}), 20u);
  EXPECT_EQ(LatestCommonStep({{30, 10, 20}, {20, 30}}), 30u);  // order does not matter
  EXPECT_EQ(LatestCommonStep({{10, 20}, {}}), 0u);            // a server without any
  EXPECT_EQ(LatestCommonStep({{10}, {20}}), 0u);
  EXPECT_EQ(LatestCommonStep({}), 0u);
  EXPECT_EQ(LatestCommonStep({{10, 50}}), 50u);
}

TEST(StepCheckpoint, FilesAreListedByStepForTheirServerOnly) {
  const std::string dir = TempDir();
  EXPECT_EQ(StepCheckpointPath(dir, "s0", 40), dir + "/server-s0.step-40.ckpt");
  for (uint64_t s : {40, 10, 200}) Touch(StepCheckpointPath(dir, "s0", s));
  Touch(StepCheckpointPath(dir, "s1", 30));
  Touch(dir + "/server-s0.step-x.ckpt");     // not a step
  Touch(dir + "/server-s0.step-50.ckpt.tmp");  // not finished
  Touch(dir + "/server-s0.ckpt");
  EXPECT_EQ(ListStepCheckpoints(dir, "s0"), (std::vector<uint64_t>{10, 40, 200}));
  EXPECT_EQ(ListStepCheckpoints(dir, "s1"), (std::vector<uint64_t>{30}));
  EXPECT_TRUE(ListStepCheckpoints(dir + "/missing", "s0").empty());
  std::filesystem::remove_all(dir);
}

// The rank a server with --identity had, for its next start (it claims it in Register).
TEST(StepCheckpoint, AServersRankFileGivesItsRankBackAndRefusesAnythingElse) {
  const std::string dir = TempDir();
  EXPECT_EQ(RankFilePath(dir, "s1"), dir + "/server-s1.rank");
  absl::StatusOr<int> none = ReadRankFile(dir, "s1");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, -1);
  ASSERT_TRUE(WriteRankFile(dir, "s1", 3).ok());
  ASSERT_TRUE(WriteRankFile(dir, "s0", 0).ok());
  EXPECT_EQ(ReadRankFile(dir, "s1").value_or(-2), 3);
  EXPECT_EQ(ReadRankFile(dir, "s0").value_or(-2), 0);
  ASSERT_TRUE(WriteRankFile(dir, "s1", 1).ok());  // replaced
  EXPECT_EQ(ReadRankFile(dir, "s1").value_or(-2), 1);
  for (const char* junk : {"", "x", "-1", "1x", "99999999999"}) {
    std::ofstream(RankFilePath(dir, "s1")) << junk;
    absl::StatusOr<int> bad = ReadRankFile(dir, "s1");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << junk;
  }
  EXPECT_FALSE(WriteRankFile(dir + "/missing", "s1", 0).ok());
  std::filesystem::remove_all(dir);
}

TEST(StepCheckpoint, PruningKeepsTheNewestAndTheCommonStep) {
  const std::string dir = TempDir();
  for (uint64_t s : {10, 20, 30, 40, 50}) Touch(StepCheckpointPath(dir, "s0", s));
  PruneStepCheckpoints(dir, "s0", 2, /*common=*/20);  // 20 may still be restored
  EXPECT_EQ(ListStepCheckpoints(dir, "s0"), (std::vector<uint64_t>{20, 30, 40, 50}));
  PruneStepCheckpoints(dir, "s0", 2, /*common=*/0);  // none common: only the newest
  EXPECT_EQ(ListStepCheckpoints(dir, "s0"), (std::vector<uint64_t>{40, 50}));
  std::filesystem::remove_all(dir);
}

TEST(StepCheckpoint, AfterARestoreTheLaterFilesAreRemoved) {
  const std::string dir = TempDir();
  for (uint64_t s : {10, 20, 30}) Touch(StepCheckpointPath(dir, "s0", s));
  RemoveStepCheckpointsAfter(dir, "s0", 20);
  EXPECT_EQ(ListStepCheckpoints(dir, "s0"), (std::vector<uint64_t>{10, 20}));
  RemoveStepCheckpointsAfter(dir, "s0", 0);  // restored none of them
  EXPECT_TRUE(ListStepCheckpoints(dir, "s0").empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace adaps
